"""tidal-sft on a user's own SFT data in TRL's shapes (issue 25 item 2): prompt-completion as
strings and as conversations, "messages", "text", in .jsonl, .json and .json.gz. The tokens each
record becomes and the loss mask are checked against TRL's SFTTrainer rules (trl/trainer/
sft_trainer.py, tokenize(): standard records tok(prompt + completion + eos_token) with the mask
after tok(prompt); conversational ones apply_chat_template(prompt + completion) with the mask
after apply_chat_template(prompt, add_generation_prompt=True); "messages" and "text" every token)
computed here with transformers' own tokenizer and chat template, through tidal-sft --dump-grads
(input_ids, loss_mask of the first step). Bad records name file and line.
Exit 0 = pass, 77 = skipped (transformers or safetensors missing)."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer
except Exception as e:  # noqa: BLE001
    print(f"skip: transformers / safetensors unavailable ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import BIN, check, failures  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
tmp = tempfile.mkdtemp(prefix="tidal-sft-own-")
try:
    model = os.path.join(tmp, "model")
    shutil.copytree(os.path.join(ROOT, "datasets", "models", "add"), model)
    tc = json.load(open(os.path.join(model, "tokenizer_config.json")))
    tc["chat_template"] = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}Q:{{ m['content'] }}\n"
                           "{% else %}A:{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
                           "{% if add_generation_prompt %}A:{% endif %}")
    json.dump(tc, open(os.path.join(model, "tokenizer_config.json"), "w"))
    tok = AutoTokenizer.from_pretrained(model)

    def trl_ids(rec):
        """(input_ids, completion_mask) as TRL's SFTTrainer tokenises rec (loss on mask 1)."""
        if "prompt" in rec and isinstance(rec["prompt"], str):
            pc = tok(rec["prompt"] + rec["completion"] + tok.eos_token)["input_ids"]
            p = tok(rec["prompt"])["input_ids"]
            return pc, [0] * len(p) + [1] * (len(pc) - len(p))
        if "prompt" in rec:
            p = tok.apply_chat_template(rec["prompt"], add_generation_prompt=True, tokenize=True)
            pc = tok.apply_chat_template(rec["prompt"] + rec["completion"], tokenize=True)
            return pc, [0] * len(p) + [1] * (len(pc) - len(p))
        if "messages" in rec:
            ids = tok.apply_chat_template(rec["messages"], tokenize=True)
        else:
            ids = tok(rec["text"] + tok.eos_token)["input_ids"]
        return ids, [0] + [1] * (len(ids) - 1)   # the first token has no prediction

    shapes = {
        "standard": [{"prompt": f"{a}+{b}=", "completion": str(a + b), "tag": "x"} for a, b in ((12, 30), (7, 5))],
        "conversational": [{"prompt": [{"role": "user", "content": f"{a}+{b}"}],
                            "completion": [{"role": "assistant", "content": str(a + b)}]} for a, b in ((3, 4), (40, 2))],
        "messages": [{"messages": [{"role": "user", "content": f"{a}*2"}, {"role": "assistant", "content": str(2 * a)},
                                   {"role": "user", "content": "ok?"}, {"role": "assistant", "content": "yes"}]}
                     for a in (6, 21)],
        "text": [{"text": f"{a} plus {a} is {2 * a}"} for a in (8, 13)],
    }
    for name, recs in shapes.items():
        for ext in (".jsonl", ".json", ".json.gz"):
            path = os.path.join(tmp, name + ext)
            body = "\n".join(json.dumps(r) for r in recs) + "\n" if ext == ".jsonl" else json.dumps(recs)
            if ext == ".json.gz":
                with gzip.open(path, "wt") as f:
                    f.write(body)
            else:
                open(path, "w").write(body)
            out, dump = os.path.join(tmp, f"out-{name}{ext}"), os.path.join(tmp, f"g-{name}{ext}.st")
            p = subprocess.run([os.path.join(BIN, "tidal-sft"), "--model-path", model, "--dataset-path", path,
                                "--per-device-batch-size", "2", "--max-steps", "1", "--dump-grads", dump,
                                "--output-dir", out], capture_output=True, text=True,
                               env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
            check(p.returncode == 0, f"{name}{ext}: tidal-sft trains on it ({p.stderr.strip()[-200:]})")
            if p.returncode != 0:
                continue
            g = load_file(dump)
            got = set()
            for b in range(g["input_ids"].shape[0]):
                ids, m = [int(x) for x in g["input_ids"][b]], [int(x) for x in g["loss_mask"][b]]
                n = max(i for i, k in enumerate(m) if k) + 1 if any(m) else 0
                got.add((tuple(ids[:n]), tuple(m[:n])))
            want = {tuple(map(tuple, trl_ids(r))) for r in recs}
            check(got == want, f"{name}{ext}: input_ids and loss mask as TRL's SFTTrainer makes them"
                  + ("" if got == want else f"\n  tidal {sorted(got)}\n  TRL   {sorted(want)}"))
    # bad records: named by file and line, exit 1
    bad = os.path.join(tmp, "bad.jsonl")
    open(bad, "w").write(json.dumps(shapes["standard"][0]) + "\n" + json.dumps({"prompt": "1+1=", "answer": 2}) + "\n")
    p = subprocess.run([os.path.join(BIN, "tidal-sft"), "--model-path", model, "--dataset-path", bad, "--max-steps", "1",
                        "--output-dir", os.path.join(tmp, "bad-out")], capture_output=True, text=True)
    check(p.returncode == 1 and f"{bad}:2" in p.stderr and "TRL's SFT shapes" in p.stderr,
          f"a record of no known shape: exit 1 naming file:line ({p.stderr.strip()[-200:]})")
    mixed = os.path.join(tmp, "mixed.jsonl")
    open(mixed, "w").write(json.dumps({"prompt": [{"role": "user", "content": "1"}], "completion": "2"}) + "\n")
    p = subprocess.run([os.path.join(BIN, "tidal-sft"), "--model-path", model, "--dataset-path", mixed, "--max-steps", "1",
                        "--output-dir", os.path.join(tmp, "mixed-out")], capture_output=True, text=True)
    check(p.returncode == 1 and f"{mixed}:1" in p.stderr and "both be strings or both lists" in p.stderr,
          f"a conversational prompt with a string completion: refused ({p.stderr.strip()[-160:]})")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failures else 0)
