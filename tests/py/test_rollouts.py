#!/usr/bin/env python3
"""Rollout dumps as RL frameworks write them, replayed by tidal-diff, checked with h5py.

A generated tidal-diff run on a tiny checkpoint is the ground truth: its sequences and its
inference-path (engine) log-probs are written out in each framework's own layout, built the
way the framework builds it:
  trl     GRPOTrainer batch rows: prompt_ids/prompt_mask left-padded by the tokenizer
          (padding_side="left"), completion_ids/completion_mask right-padded with the mask
          ending after EOS, sampling_per_token_logps (vLLM's), old_per_token_logps (the
          trainer's), each tensor row dumped with .tolist() (torch, float32)
  verl    DataProto rows: prompts left-padded to max_prompt_length, responses right-padded to
          response_length, attention_mask = cat(prompt mask, response mask), response_mask,
          rollout_log_probs, old_log_probs (torch, float32)
  vllm    RequestOutput as a dict: prompt_token_ids, outputs[k] with token_ids and logprobs as
          a list of {token_id: {"logprob", "rank", "decoded_token"}} (json turns the int keys
          into strings), two outputs (n=2) per request
  sglang  /generate response {"text", "output_ids", "meta_info": {"output_token_logprobs":
          [[logprob, token_id, null], ...], ...}} with the request's "input_ids"
Each replay must give the same training-path log-probs as the generated run (bit for bit: the
same tokens), logp_b equal to the dumped engine log-probs (float32), the response tokens
unpadded, /tokens/logp_trainer equal to the trainer's log-probs where the dump has them (TRL,
verl) and absent otherwise, and the replay labelled (mode, rollout_format, rollout_logprobs).
Errors name the fields found and expected. Exit 0 pass, 1 fail, 77 skip (torch/h5py missing).
"""
import json
import os
import sys
import tempfile

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import check, failures, run  # noqa: E402

PAD = 0
tmp = tempfile.mkdtemp(prefix="tidal-rollouts-test-")
model = os.path.join(tmp, "m")
run("tidal-init", "--arch", "qwen2", "--preset", "tiny", "--seed", "5", "-o", model)
rng = np.random.default_rng(16)
with open(os.path.join(tmp, "p.jsonl"), "w") as f:
    for _ in range(5):
        f.write(json.dumps({"tokens": rng.integers(3, 500, rng.integers(2, 9)).tolist()}) + "\n")
ref = os.path.join(tmp, "gen.h5")
run("tidal-diff", "--model", model, "--prompts", os.path.join(tmp, "p.jsonl"), "-o", ref, "--max-new-tokens", "7",
    "--seed", "4", "--temperature", "1.0", "--batch", "5")

seqs = []       # (prompt ids, response ids, engine logps (float32), trainer logps (float32))
with h5py.File(ref) as f:
    t, s, pt = f["tokens"], f["seqs"], f["prompts/tokens"][:]
    order = np.argsort(s["prompt_index"][:])
    for i in order:
        to, P, R = s["tokens_offset"][i], s["prompt_len"][i], s["response_len"][i]
        o, n = s["token_offset"][i], s["n_scored"][i]
        eng = t["logp_b"][o:o + n].astype(np.float32)
        trainer = (t["logp_a"][o:o + n] + rng.normal(0, 1e-3, n)).clip(max=0).astype(np.float32)
        seqs.append((pt[to:to + P].tolist(), pt[to + P:to + P + R].tolist(), eng, trainer))
    ref_logp_a = t["logp_a"][:]


def left_pad(rows, width):
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def right_pad(rows, width, fill=PAD, dtype=torch.long):
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=dtype)
    return out


def write(name, records):
    path = os.path.join(tmp, name + ".jsonl")
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


P = max(len(p) for p, _, _, _ in seqs) + 2
R = max(len(r) for _, r, _, _ in seqs) + 3
prompt_ids, prompt_mask = left_pad([p for p, _, _, _ in seqs], P)
completion_ids = right_pad([r for _, r, _, _ in seqs], R)
completion_mask = right_pad([[1] * len(r) for _, r, _, _ in seqs], R)
eng = right_pad([e.tolist() for _, _, e, _ in seqs], R, 0.0, torch.float32)
old = right_pad([tr.tolist() for _, _, _, tr in seqs], R, 0.0, torch.float32)

formats = {}
formats["trl"] = write("trl", [{"prompt": "(text)", "prompt_ids": prompt_ids[i].tolist(), "prompt_mask": prompt_mask[i].tolist(),
                                "completion_ids": completion_ids[i].tolist(), "completion_mask": completion_mask[i].tolist(),
                                "sampling_per_token_logps": eng[i].tolist(), "old_per_token_logps": old[i].tolist(),
                                "advantages": 0.5} for i in range(len(seqs))])
attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
formats["verl"] = write("verl", [{"prompts": prompt_ids[i].tolist(), "responses": completion_ids[i].tolist(),
                                  "input_ids": torch.cat([prompt_ids[i], completion_ids[i]]).tolist(),
                                  "attention_mask": attention_mask[i].tolist(), "response_mask": completion_mask[i].tolist(),
                                  "rollout_log_probs": eng[i].tolist(), "old_log_probs": old[i].tolist()}
                                 for i in range(len(seqs))])


def vllm_logprobs(ids, lps):
    return [{tok: {"logprob": float(lp), "rank": 1, "decoded_token": f"<{tok}>"}} for tok, lp in zip(ids, lps)]


vllm_records = []
for i in range(0, len(seqs) - 1, 2):       # two samples of one request: same prompt, n=2
    a, b = seqs[i], seqs[i + 1]
    if a[0] != b[0]:
        vllm_records.append({"request_id": str(i), "prompt_token_ids": a[0], "outputs": [
            {"index": 0, "text": "", "token_ids": a[1], "cumulative_logprob": float(sum(a[2])), "logprobs": vllm_logprobs(a[1], a[2])}]})
        vllm_records.append({"request_id": str(i + 1), "prompt_token_ids": b[0], "outputs": [
            {"index": 0, "text": "", "token_ids": b[1], "cumulative_logprob": float(sum(b[2])), "logprobs": vllm_logprobs(b[1], b[2])}]})
if len(seqs) % 2:
    c = seqs[-1]
    vllm_records.append({"request_id": "last", "prompt_token_ids": c[0], "outputs": [
        {"index": 0, "text": "", "token_ids": c[1], "logprobs": vllm_logprobs(c[1], c[2])}]})
formats["vllm"] = write("vllm", vllm_records)
formats["sglang"] = write("sglang", [{"input_ids": p, "text": "", "output_ids": r, "meta_info": {
    "id": str(i), "finish_reason": {"type": "length", "length": len(r)}, "prompt_tokens": len(p), "completion_tokens": len(r),
    "output_token_logprobs": [[float(lp), tok, None] for lp, tok in zip(e, r)]}} for i, (p, r, e, _) in enumerate(seqs)])

want_eng = np.concatenate([e for _, _, e, _ in seqs])
want_tr = np.concatenate([tr for _, _, _, tr in seqs])
want_tok = np.concatenate([r for _, r, _, _ in seqs])
for name, path in formats.items():
    out = os.path.join(tmp, name + ".h5")
    p = run("tidal-diff", "--model", model, "--prompts", path, "-o", out, "--batch", "2")
    check(f"vs the {name} dump's engine log-probs (replay)" in p.stdout and "bf16-infer" not in p.stdout
          and "nan" not in p.stdout.lower(), f"{name}: tidal-diff's summary names the replay, no recipe B, no nan")
    with h5py.File(out) as g:
        o = np.argsort(g["seqs/prompt_index"][:], kind="stable")
        check(g.attrs["mode"] == "replay" and g.attrs["rollout_format"] == name and g.attrs["rollout_logprobs"] == "raw",
              f"{name}: labelled a replay of {name} rollouts, raw log-probs")
        check(np.array_equal(g["tokens/logp_a"][:], ref_logp_a), f"{name}: training-path log-probs equal the generated run's")
        check(np.array_equal(g["tokens/logp_b"][:], want_eng.astype(np.float64)), f"{name}: logp_b = the dumped engine log-probs")
        check(np.array_equal(g["tokens/token"][:], want_tok), f"{name}: response tokens unpadded, in order")
        has = "logp_trainer" in g["tokens"]
        if name in ("trl", "verl"):
            check(has and np.array_equal(g["tokens/logp_trainer"][:], want_tr.astype(np.float64)),
                  f"{name}: /tokens/logp_trainer = the trainer's log-probs")
            check(g.attrs["trainer_logprobs"] == "yes", f"{name}: trainer_logprobs attribute")
        else:
            check(not has, f"{name}: no /tokens/logp_trainer (the dump has no trainer log-probs)")
    # tidal-report's three-way summary (engine, trainer, tidal A) against numpy on the same columns
    j = json.loads(run("tidal-report", out, "--json").stdout)
    j = j["runs"][0] if isinstance(j, dict) and "runs" in j else (j[0] if isinstance(j, list) else j)
    tw = j.get("three_way")
    if name in ("trl", "verl"):
        with h5py.File(out) as g:
            la, lb, lt = g["tokens/logp_a"][:], g["tokens/logp_b"][:], g["tokens/logp_trainer"][:]
        ok3 = isinstance(tw, dict)
        for key, x, y in (("engine_vs_trainer", lb, lt), ("tidal_vs_trainer", la, lt), ("engine_vs_tidal", lb, la)):
            ok3 = ok3 and abs(tw[key]["mean"] - np.abs(x - y).mean()) <= 1e-12 * max(1.0, np.abs(x - y).mean()) \
                and abs(tw[key]["max"] - np.abs(x - y).max()) <= 1e-15 and abs(tw[key]["signed_mean"] - (x - y).mean()) <= 1e-12
        check(ok3, f"{name}: tidal-report three_way (engine/trainer/tidal A) equals numpy's |Δ| mean, max, signed mean")
        check("engine vs trainer" in run("tidal-report", out).stdout, f"{name}: the text report prints the three-way rows")
    else:
        check(tw is None, f"{name}: no three_way without trainer log-probs")
    rep = run("tidal-report", out)
    check("replay" in rep.stdout and "n/a (replay)" in rep.stdout and " nan" not in rep.stdout.lower(),
          f"{name}: tidal-report says replay and n/a (replay), never nan")

# processed log-probs: tidal processes the training path's row like the engine did
proc = os.path.join(tmp, "proc.h5")
run("tidal-diff", "--model", model, "--prompts", formats["trl"], "-o", proc, "--rollout-logprobs", "processed",
    "--temperature", "0.5")
with h5py.File(proc) as g:
    la = g["tokens/logp_a"][:]
    check(g.attrs["rollout_logprobs"] == "processed", "processed: recorded as processed")
    check(not np.allclose(la, ref_logp_a) and np.all(la <= 0), "processed: temperature 0.5 changes the training path's log-probs")

# bad dumps: errors name the format, the fields found and the fields expected
def bad(label, record, *needles):
    path = write("bad", [record])
    p = run("tidal-diff", "--model", model, "--prompts", path, "-o", os.path.join(tmp, "bad.h5"), "--force", ok=False)
    msg = p.stderr
    check(p.returncode == 1 and all(n in msg for n in needles) and "bad.jsonl:1" in msg, f"bad input: {label}")
    if p.returncode != 1 or not all(n in msg for n in needles):
        print("   ", msg.strip())


v = json.loads(open(formats["verl"]).readline())
bad("verl without attention_mask", {k: x for k, x in v.items() if k != "attention_mask"},
    "verl rollout record", "no \"attention_mask\"", "fields found: \"prompts\"", "expected: \"prompts\", \"responses\"")
tr = json.loads(open(formats["trl"]).readline())
bad("TRL without engine log-probs", {k: x for k, x in tr.items() if k != "sampling_per_token_logps"},
    "trl rollout record", "sampling_per_token_logps", "vllm_importance_sampling_correction")
vl = json.loads(open(formats["vllm"]).readline())
vl["outputs"][0]["logprobs"] = None
bad("vLLM without logprobs", vl, "vllm rollout record", "logprobs is not a list", "SamplingParams(logprobs=0)")
sg = json.loads(open(formats["sglang"]).readline())
bad("SGLang without input_ids", {k: x for k, x in sg.items() if k != "input_ids"}, "sglang rollout record", "no \"input_ids\"")
hole = dict(tr)
hole["completion_mask"] = [1, 0] + [1] * (len(tr["completion_mask"]) - 2)
bad("TRL mask with an interior hole", hole, "interior masked tokens")

print(f"\nrollout format checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
