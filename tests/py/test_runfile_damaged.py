"""Damaged run files (issue 42): every reading tool refuses them in seconds, never hangs or crashes.

1. Each file in tests/fuzz/corpus/runfile_damaged/ (inputs the runfile fuzz campaign found to
   make libhdf5 1.10.8 loop, read out of bounds or crash, and hand-made cuts) through
   tidal-export, tidal-report and tidal-heatmap: exit 1, a message naming the file and
   "damaged run file" (or what is wrong), no sanitizer report, no signal, within TIME_LIMIT s
   each. The three tools run side by side: the guard's child has a 2 s CPU limit, so a file that
   makes libhdf5 loop costs about 2 s of CPU per tool.
2. A run file written now by tidal-diff: HDF5 superblock version 2 (the 1.8 format, whose object
   headers carry checksums), opened by h5py with string attributes as str and the columns
   readable; the tools read it (exit 0). Cut short or with a flipped superblock byte it is refused
   with the reason ("truncated", "checksum").
3. A file in the format of earlier versions (superblock version 0, tests/fuzz/corpus/runfile/
   tiny.h5) still opens.
4. The cost of the guard per open: tidal-export --attr on the fresh file with the check and with
   TIDAL_RUNFILE_CHECK_SECONDS=0 (printed, not a verdict: the machine's load decides it).
Exit 0 pass, 1 fail, 77 skip (no h5py).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

try:
    import h5py
except ImportError:
    print("h5py not installed: skipped")
    sys.exit(77)

from tidal_check import BIN, check, failures, run  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DAMAGED = os.path.join(ROOT, "tests", "fuzz", "corpus", "runfile_damaged")
TIME_LIMIT = 15   # seconds per tool run: the 2 s CPU limit of the guard's child, on a loaded machine
tmp = tempfile.mkdtemp(prefix="tidal-damaged-test-")


def tool(args, env=None):
    t0 = time.time()
    try:
        p = subprocess.run([os.path.join(ROOT, BIN, args[0]), *args[1:]], capture_output=True, text=True,
                           errors="replace", timeout=60, env=env)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired:
        return None, "", "timed out after 60 s", time.time() - t0


def readers(path, tag):
    """The three reading tools on one file, side by side: [(name, rc, stderr, seconds)]."""
    cmds = [("tidal-export", ["tidal-export", path]),
            ("tidal-report", ["tidal-report", path]),
            ("tidal-heatmap", ["tidal-heatmap", path, "-o", os.path.join(tmp, tag + ".png")])]
    with ThreadPoolExecutor(3) as ex:
        res = list(ex.map(lambda c: tool(c[1]), cmds))
    return [(name, rc, err, secs) for (name, _), (rc, _, err, secs) in zip(cmds, res)]


def refused(path, tag, why=None):
    for name, rc, err, secs in readers(path, tag):
        first = err.strip().splitlines()[0] if err.strip() else ""
        # a sanitizer's own report (the one-line reason may name what the guard's child hit)
        clean = "==ERROR:" not in err and "SUMMARY:" not in err and "runtime error" not in err
        named = path in first and (why or "damaged run file") in first
        check(rc == 1 and named and clean and secs < TIME_LIMIT,
              f"{name} {tag}: exit 1 in {secs:.1f} s with {first[:160]!r} (rc {rc})")


# ---- 1. the damaged files
files = sorted(f for f in os.listdir(DAMAGED) if not f.startswith(".")) if os.path.isdir(DAMAGED) else []
check(len(files) >= 3, f"{len(files)} damaged files in {os.path.relpath(DAMAGED, ROOT)}")
t0 = time.time()
for f in files:
    path = os.path.join(tmp, f)   # a copy: nothing may write beside the corpus (a journal, a repair)
    shutil.copyfile(os.path.join(DAMAGED, f), path)
    refused(path, f, why=": ")
print(f"     ({len(files)} damaged files x 3 tools in {time.time() - t0:.1f} s)")

# ---- 2. a run file written now
model = os.path.join(tmp, "m")
run("tidal-init", "--preset", "tiny", "--seed", "3", "-o", model)
prompts = os.path.join(tmp, "p.jsonl")
rng = np.random.default_rng(1)
with open(prompts, "w") as fp:
    for _ in range(6):
        fp.write(json.dumps({"tokens": rng.integers(0, 512, rng.integers(3, 9)).tolist()}) + "\n")
fresh = os.path.join(tmp, "run.h5")
run("tidal-diff", "--model", model, "--prompts", prompts, "-o", fresh, "--max-new-tokens", "4", "--batch", "3")
with open(fresh, "rb") as fp:
    head = fp.read(16)
check(head[:8] == b"\x89HDF\r\n\x1a\n" and head[8] == 2, f"fresh file: superblock version {head[8]} (2: checksummed)")
try:
    with h5py.File(fresh, "r") as h:
        fmt, tool_name = h.attrs["format"], h.attrs["tool"]
        n_tok = len(h["tokens/logp_a"][:])
        n_seq = len(h["seqs/prompt_index"][:])
    check(fmt == "tidal-run" and tool_name == "tidal-diff" and isinstance(fmt, str),
          f"h5py reads the fresh file's string attributes as str ({fmt!r}, {tool_name!r})")
    check(n_tok > 0 and n_seq == 6, f"h5py reads its columns ({n_tok} tokens, {n_seq} sequences)")
except Exception as e:   # noqa: BLE001 (any h5py failure is the verdict)
    check(False, f"h5py opens the fresh file: {e}")
for name, rc, err, secs in readers(fresh, "fresh"):
    check(rc == 0, f"{name} reads the fresh file (rc {rc}{': ' + err.strip()[:200] if rc else ''})")

size = os.path.getsize(fresh)
cut = os.path.join(tmp, "cut.h5")
with open(fresh, "rb") as a, open(cut, "wb") as b:
    b.write(a.read(size // 2))
refused(cut, "cut", why="truncated")
flip = os.path.join(tmp, "flip.h5")
data = bytearray(open(fresh, "rb").read())
data[13] ^= 0x40   # inside the superblock's base address, under its checksum
open(flip, "wb").write(bytes(data))
refused(flip, "flip", why="checksum")

# ---- 3. the format of earlier versions
old = os.path.join(tmp, "old.h5")
shutil.copyfile(os.path.join(ROOT, "tests", "fuzz", "corpus", "runfile", "tiny.h5"), old)
with open(old, "rb") as fp:
    check(fp.read(9)[8] == 0, "tiny.h5 is in the earlier format (superblock version 0)")
rc, out, err, _ = tool(["tidal-export", old, "--attr", "format"])
check(rc == 0 and out.strip() == "tidal-run", f"a file of earlier versions still opens (rc {rc}: {err.strip()[:200]})")

# ---- 4. the cost per open
cost = {}
for label, extra in (("checked", {}), ("unchecked", {"TIDAL_RUNFILE_CHECK_SECONDS": "0"})):
    env = dict(os.environ, **extra)
    t0 = time.time()
    for _ in range(10):
        tool(["tidal-export", fresh, "--attr", "format"], env=env)
    cost[label] = (time.time() - t0) / 10 * 1000
print(f"     cost of the guard per open: {cost['checked'] - cost['unchecked']:.1f} ms "
      f"(tidal-export --attr: {cost['checked']:.1f} ms checked, {cost['unchecked']:.1f} ms unchecked)")

shutil.rmtree(tmp, ignore_errors=True)
print(f"{len(failures)} failed" if failures else "all passed")
sys.exit(1 if failures else 0)
