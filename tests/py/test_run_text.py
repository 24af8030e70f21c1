"""Prompt and response text in run files (/text, issue 14), checked with h5py and HF `tokenizers`
(an independent decoder of the same tokenizer.json).

1. A run with a tokenizer stores, per sequence, its prompt and its response, each decoded on
   its own with special tokens kept: /text/utf8 bytes [text_offset, + prompt_text_len) and the
   response_text_len bytes after them equal tokenizers' decode(ids, skip_special_tokens=False)
   of the sequence's ids in /prompts/tokens; /progress/text_rows counts /text after each batch;
   the datasets have the dtypes reports/SCHEMA.md gives. A model without a tokenizer writes no
   text and none of its columns.
2. --resume: after /progress is cut back to its first batch (rows of later batches left behind,
   as a kill during a write leaves them), and after a SIGKILL at a random moment, --resume
   finishes the file with /text and /seqs identical, byte for byte, to the uninterrupted run.
3. tidal-merge of --shard 0/2 and 1/2: every merged sequence's text is its shard's, the offsets
   shifted by the /text rows of the parts before it.
4. tidal-report with the checkpoint's tokenizer.json gone shows a worst sequence's response as
   the stored text (--json "response" is that string); --no-decode still gives ids.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import h5py
    import numpy as np
    from tokenizers import Tokenizer
except ImportError as e:
    print(f"{e.name} not installed: skipped")
    sys.exit(77)

from tidal_check import BIN, check, failures, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
DEMO = os.path.join(ROOT, "datasets", "demo-model")
PROMPTS = os.path.join(ROOT, "datasets", "demo-prompts.jsonl")
TEXT_COLS = {"text/utf8": "|u1", "seqs/text_offset": "<i8", "seqs/prompt_text_len": "<i4",
             "seqs/response_text_len": "<i4", "progress/text_rows": "<i8"}

tmp = tempfile.mkdtemp(prefix="tidal_text_")
model = os.path.join(tmp, "model")
shutil.copytree(DEMO, model)
hf = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))


def sh(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"command failed: {' '.join(cmd)}")
    return p


def diff(out, *extra):
    return [os.path.join(BIN, "tidal-diff"), "--model", model, "--prompts", PROMPTS, "--max-new-tokens", "16",
            "--batch", "4", "--seed", "3", "-o", out, *extra]


def texts(path):
    """[(prompt text, response text)] per sequence, and a problem list."""
    with h5py.File(path, "r") as f:
        t = f["text/utf8"][:].tobytes()
        s = {k: f["seqs"][k][:] for k in f["seqs"]}
        ids = f["prompts/tokens"][:]
        nrow = len(s["prompt_index"])
        out, bad = [], []
        for i in range(nrow):
            o, pl, rl = int(s["text_offset"][i]), int(s["prompt_text_len"][i]), int(s["response_text_len"][i])
            p, r = t[o:o + pl].decode(), t[o + pl:o + pl + rl].decode()
            a, n = int(s["tokens_offset"][i]), int(s["prompt_len"][i])
            ref_p = hf.decode(ids[a:a + n].tolist(), skip_special_tokens=False)
            ref_r = hf.decode(ids[a + n:a + n + int(s["response_len"][i])].tolist(), skip_special_tokens=False)
            if (p, r) != (ref_p, ref_r):
                bad.append(f"seq {i}: stored {(p, r)!r}, tokenizers {(ref_p, ref_r)!r}")
            out.append((p, r))
        return out, bad


def dump(path, groups=("seqs", "text", "prompts", "tokens")):
    with h5py.File(path, "r") as f:
        return {f"{g}/{k}": f[g][k][()].tobytes() for g in groups if g in f for k in f[g]}


# 1. the text and its layout
ref = os.path.join(tmp, "ref.h5")
sh(diff(ref))
with h5py.File(ref, "r") as f:
    for name, dt in TEXT_COLS.items():
        check(name in f and f[name].dtype.str == dt and f[name].ndim == 1,
              f"{name}: {f[name].dtype.str if name in f else 'missing'}, expected {dt} 1-D")
    nseq = len(f["seqs/prompt_index"])
    check(int(f["progress/text_rows"][-1]) == len(f["text/utf8"]), "/progress/text_rows ends at the /text rows")
ref_text, bad = texts(ref)
check(not bad, "stored text equals tokenizers' decode " + "; ".join(bad[:3]))
check(nseq > 4 and all(p.startswith("<bos>") and len(r) > 0 for p, r in ref_text),
      f"{nseq} sequences, each a prompt with its <bos> and a response")
notok = os.path.join(tmp, "notok")
shutil.copytree(DEMO, notok, ignore=shutil.ignore_patterns("tokenizer*.json"))
plain = os.path.join(tmp, "plain.h5")
ids_prompts = os.path.join(tmp, "ids.jsonl")
with open(ids_prompts, "w") as f:
    for i in range(5):
        f.write(json.dumps({"tokens": [1] + [5 + 7 * i + j for j in range(6)]}) + "\n")
sh([{model: notok, PROMPTS: ids_prompts}.get(a, a) for a in diff(plain)])
with h5py.File(plain, "r") as f:
    check("text" not in f and not any(n in f for n in TEXT_COLS), "no tokenizer: no text, no text columns")

# 2. --resume after a cut-back, and after a kill
ref_dump = dump(ref)
cut = os.path.join(tmp, "cut.h5")
sh(diff(cut))
with h5py.File(cut, "r+") as f:
    for name in f["progress"]:
        f["progress"][name].resize((1,))
sh(diff(cut, "--resume"))
got = dump(cut)
check(got == ref_dump, "resumed after a cut-back: equals the uninterrupted run (differing: "
      + ", ".join(k for k in ref_dump if got.get(k) != ref_dump[k]) + ")")
t0 = time.time()
sh(diff(os.path.join(tmp, "timing.h5")))
t_ref = time.time() - t0
rng = np.random.default_rng(7)
for k in range(3):
    killed = os.path.join(tmp, f"killed{k}.h5")
    p = subprocess.Popen(diff(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rng.uniform(0.2, 0.9) * t_ref)
    p.send_signal(signal.SIGKILL)
    p.wait()
    if not os.path.exists(killed):
        continue  # killed before the file existed: nothing to resume
    r = subprocess.run(diff(killed, "--resume") if p.returncode else ["true"], capture_output=True)
    check(r.returncode == 0, f"kill {k}: --resume finishes the file" + (f": {r.stderr.decode()[-300:]}" if r.returncode else ""))
    got = dump(killed)
    check(got == ref_dump, f"kill {k}: the resumed file equals the uninterrupted run (differing: "
          + ", ".join(k2 for k2 in ref_dump if got.get(k2) != ref_dump[k2]) + ")")

# 3. shards and tidal-merge
parts = []
for k in range(2):
    parts.append(os.path.join(tmp, f"shard{k}.h5"))
    sh(diff(parts[-1], "--shard", f"{k}/2"))
merged = os.path.join(tmp, "merged.h5")
run("tidal-merge", "-o", merged, *parts)
m_text, bad = texts(merged)
check(not bad, "merged text equals tokenizers' decode of the merged ids: " + "; ".join(bad[:3]))
shard_text = texts(parts[0])[0] + texts(parts[1])[0]
check(m_text == shard_text, "merged text is the shards' text, shard after shard")
with h5py.File(merged, "r") as f, h5py.File(parts[0], "r") as f0:
    n0, t0n = len(f0["seqs/prompt_index"]), len(f0["text/utf8"])
    check(int(f["seqs/text_offset"][n0]) == t0n, "shard 1's first text offset is shifted by shard 0's /text rows")

# 4. tidal-report shows the stored text when the tokenizer is gone
os.remove(os.path.join(model, "tokenizer.json"))
rep = json.loads(run("tidal-report", "--json", ref).stdout)
ws = rep["worst_seqs"]
check(len(ws) > 0 and all(isinstance(w["response"], str) and w["response"] == ref_text[w["seq"]][1] for w in ws),
      "tidal-report --json: worst sequences' responses are the stored text")
rep = json.loads(run("tidal-report", "--json", "--no-decode", ref).stdout)
check(all(isinstance(w["response"], list) for w in rep["worst_seqs"]), "--no-decode: responses as ids")
txt = run("tidal-report", ref).stdout
shown = "".join("\\n" if c == "\n" else c if ord(c) >= 32 else " " for c in ref_text[ws[0]["seq"]][1])[:12].strip()
check(shown in txt, f"tidal-report's table shows the stored response ({shown!r})")

shutil.rmtree(tmp)
print(f"\nrun-file text checks: {len(failures)} failed")
sys.exit(1 if len(failures) else 0)
