"""Bounded resources on hostile input: every case must end in a clear message naming the file
and exit 1 (never a crash, never an allocation the file does not justify). Each tool runs under
an address-space limit of 3 GiB, so a buffer sized by an absurd claim fails loudly.
  - safetensors headers claiming absurd shapes (2^40 x 2^40, a product that overflows 64 bits,
    a shape whose bytes exceed the data area): tidal-inspect refuses them.
  - run files claiming rows their storage cannot hold (HDF5 extents of 2^40 rows in a few KB,
    /progress counts past the rows present): tidal-diff --resume refuses them.
  - prompts past the context: refused with the line number (prompt alone, and prompt +
    --max-new-tokens); before this check, a prompt of exactly the context length overflowed a
    heap buffer in tidal-diff's decode loop.
Exit 0 pass, 1 fail, 77 skip (h5py missing).
"""
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import h5py
except ImportError:
    sys.exit(77)

BUILD = os.environ.get("BUILD", "build")
BIN = os.path.join(BUILD, "bin")
LIMIT = 3 << 30
failures = []


def limited():
    # ASan reserves terabytes of shadow address space: no limit under a sanitizer build
    if "asan" not in BUILD:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def refuse(cmd, want, what):
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limited, timeout=120)
    msg = (r.stderr + r.stdout).strip().splitlines()
    last = msg[-1] if msg else ""
    ok = r.returncode == 1 and want in last
    print("%s: %s (rc %d) %s" % ("ok" if ok else "FAIL", what, r.returncode, last[:200]))
    if not ok:
        failures.append(what)


def safetensors(path, header, data=b""):
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


with tempfile.TemporaryDirectory() as d:
    st = os.path.join(d, "x.safetensors")
    inspect = os.path.join(BIN, "tidal-inspect")
    safetensors(st, {"w": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 16]}}, bytes(16))
    refuse([inspect, st], "x.safetensors", "safetensors shape 2^40 x 2^40")
    safetensors(st, {"w": {"dtype": "BF16", "shape": [1 << 32, 1 << 32, 1 << 32], "data_offsets": [0, 16]}}, bytes(16))
    refuse([inspect, st], "overflows", "safetensors shape product overflows 64 bits")
    safetensors(st, {"w": {"dtype": "F32", "shape": [1 << 20], "data_offsets": [0, 1 << 22]}}, bytes(64))
    refuse([inspect, st], "x.safetensors", "safetensors tensor past the end of the file")

    # a real run file to corrupt
    m, pf, run = os.path.join(d, "m"), os.path.join(d, "p.jsonl"), os.path.join(d, "run.h5")
    subprocess.run([os.path.join(BIN, "tidal-init"), "--arch", "qwen2", "--preset", "tiny", "--seed", "1", "-o", m],
                   check=True, capture_output=True)
    with open(pf, "w") as f:
        f.writelines('{"tokens": [1, %d, 7, 9]}\n' % (10 + i) for i in range(6))
    diff = [os.path.join(BIN, "tidal-diff"), "--model", m, "--prompts", pf, "--batch", "2", "--max-new-tokens", "4",
            "--seed", "3"]
    subprocess.run(diff + ["-o", run], check=True, capture_output=True)

    bad = os.path.join(d, "bad.h5")
    shutil.copy(run, bad)
    with h5py.File(bad, "r+") as f:
        f["progress/seq_rows"][-1] = 1 << 40
    refuse(diff + ["-o", bad, "--resume"], "corrupt", "run file: /progress claims 2^40 sequences")

    shutil.copy(run, bad)
    with h5py.File(bad, "r+") as f:
        for k in f["seqs"]:
            f["seqs"][k].resize((1 << 40,))
        f["progress/seq_rows"][-1] = 1 << 40
    refuse(diff + ["-o", bad, "--resume"], "corrupt", "run file: /seqs extents of 2^40 rows in a few KB")

    # prompts past the context: a copy of the model whose context is 64 positions
    mc = os.path.join(d, "mc")
    shutil.copytree(m, mc)
    cj = os.path.join(mc, "config.json")
    cfg = json.load(open(cj))
    cfg["max_position_embeddings"] = 64
    json.dump(cfg, open(cj, "w"))
    for n_prompt, max_new, want in [(65, 4, "longer than the context"), (64, 4, "past the model's context"),
                                    (60, 32, "past the model's context")]:
        with open(pf, "w") as f:
            f.write('{"tokens": [1, 2]}\n{"tokens": [%s]}\n' % ", ".join(["5"] * n_prompt))
        refuse([os.path.join(BIN, "tidal-diff"), "--model", mc, "--prompts", pf, "-o", os.path.join(d, "c.h5"),
                "--force", "--max-new-tokens", str(max_new)], want,
               "prompt of %d tokens + %d new in a context of 64" % (n_prompt, max_new))

print("test_bounds: %s" % ("FAILED: %s" % failures if failures else "ok"))
sys.exit(1 if failures else 0)
