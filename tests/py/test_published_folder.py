#!/usr/bin/env python3
"""Checkpoint folders as published tools write them load in tidal as they are.

1. tokenizer_config.json as transformers' save_pretrained writes it for Llama-3 and Qwen
   checkpoints: "model_max_length": int(1e30) (json.dumps gives 1000000000000000019884624838656,
   past 64 bits) beside a chat_template: tidal-diff and tidal-tokenize load the folder, and a
   conversational prompt is rendered with that template.
2. A Unigram tokenizer.json written by HF `tokenizers` (SentencePiece-style: Metaspace
   pre-tokenizer, added tokens past the piece list) is refused by its type, not by a made-up
   added-token id range.
Exit 0 pass, 1 fail, 77 skip (HF tokenizers missing for part 2 only skips that part)."""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import check, failures, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
tmp = tempfile.mkdtemp(prefix="tidal-published-")
model = os.path.join(tmp, "m")
shutil.copytree(os.path.join(ROOT, "datasets", "demo-model"), model)
cfg_path = os.path.join(model, "tokenizer_config.json")
cfg = json.load(open(cfg_path))
cfg["model_max_length"] = int(1e30)
cfg["chat_template"] = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
with open(cfg_path, "w") as f:
    json.dump(cfg, f, indent=2)
check("1000000000000000019884624838656" in open(cfg_path).read(), "tokenizer_config.json holds int(1e30) as transformers writes it")
p = run("tidal-tokenize", "--tokenizer", os.path.join(model, "tokenizer.json"), "--info", ok=False)
check(p.returncode == 0, "tidal-tokenize loads the folder" + ("" if p.returncode == 0 else ": " + p.stderr.strip()))
prompts = os.path.join(tmp, "p.jsonl")
with open(prompts, "w") as f:
    f.write(json.dumps({"prompt": [{"role": "user", "content": "1+1="}]}) + "\n")
    f.write(json.dumps({"text": "2+2="}) + "\n")
out = os.path.join(tmp, "run.h5")
p = run("tidal-diff", "--model", model, "--prompts", prompts, "-o", out, "--max-new-tokens", "2", ok=False)
check(p.returncode == 0, "tidal-diff runs on the folder" + ("" if p.returncode == 0 else ": " + p.stderr.strip()))
if p.returncode == 0:
    import h5py
    with h5py.File(out) as f:
        plen = f["seqs/prompt_len"][:]
    # the character vocabulary: one token per character, so the templated prompt's length is known
    check(int(plen[0]) == len("user: 1+1=\nassistant: "), "the conversational prompt went through the chat template")

try:
    from tokenizers import Tokenizer, models, pre_tokenizers
except ImportError:
    print("skip: HF tokenizers missing (Unigram part)")
else:
    tok = Tokenizer(models.Unigram([("<unk>", 0.0), ("▁a", -1.0), ("b", -2.0)], unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.add_special_tokens(["<pad>", "<extra_id_0>"])
    udir = os.path.join(tmp, "unigram")
    os.makedirs(udir)
    tok.save(os.path.join(udir, "tokenizer.json"))
    p = run("tidal-tokenize", "--tokenizer", os.path.join(udir, "tokenizer.json"), "--info", ok=False)
    check(p.returncode != 0 and 'model type "Unigram" is not supported' in p.stderr and "outside" not in p.stderr,
          "Unigram tokenizer.json refused by its type: " + p.stderr.strip())

print(f"\npublished-folder checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
