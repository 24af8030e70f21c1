"""datasets/rollouts/trl_dump.py (the documented way to dump a TRL GRPOTrainer run for tidal-diff)
end to end: a batch laid out as GRPOTrainer._generate_and_score_completions returns it (prompts
left-padded, completions right-padded, float32 log-prob tensors) from a real generation of a
tiny checkpoint by transformers (its sampled tokens, its fp32 log-probs as the trainer's
old_per_token_logps, a perturbed copy as the engine's sampling_per_token_logps), written by
dump_trl_batch and replayed by tidal-diff: the tokens, /tokens/logp_b (engine) and
/tokens/logp_trainer must be the batch's, and tidal's fp32 training path (logp_a) must agree with
transformers' fp32 log-probs within 1e-4. A batch without the engine's log-probs is refused.
Exit 0 = pass, 77 = skipped (torch / transformers / h5py missing)."""
import json
import os
import shutil
import sys
import tempfile

try:
    import h5py
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
except Exception as e:  # noqa: BLE001
    print(f"skip: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import check, failures, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "datasets", "rollouts"))
from trl_dump import dump_trl_batch  # noqa: E402

tmp = tempfile.mkdtemp(prefix="tidal-trl-dump-")
try:
    model_dir = os.path.join(tmp, "m")
    run("tidal-init", "--arch", "llama", "--preset", "tiny", "--seed", "3", "--embed-std", "0.5", "-o", model_dir)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 500, int(rng.integers(2, 7))).tolist() for _ in range(4)]
    P, R, PAD = max(map(len, prompts)), 6, 0
    prompt_ids = torch.full((4, P), PAD)
    prompt_mask = torch.zeros((4, P), dtype=torch.long)
    completion_ids = torch.full((4, R), PAD)
    completion_mask = torch.zeros((4, R), dtype=torch.long)
    old = torch.zeros((4, R))
    with torch.no_grad():
        for i, p in enumerate(prompts):
            prompt_ids[i, P - len(p):] = torch.tensor(p)
            prompt_mask[i, P - len(p):] = 1
            seq = list(p)
            n = R - (i % 3)          # completions of different lengths: right padding
            for t in range(n):
                lp = torch.log_softmax(hf(torch.tensor([seq])).logits[0, -1].float(), -1)
                tok = int(torch.multinomial(lp.exp(), 1))
                while tok in (1, 2):  # keep bos/eos out: the replay reads ids only
                    tok = int(torch.multinomial(lp.exp(), 1))
                seq.append(tok)
            full = torch.tensor([seq])
            lp = torch.log_softmax(hf(full).logits[0].float(), -1)
            comp = seq[len(p):]
            completion_ids[i, :n] = torch.tensor(comp)
            completion_mask[i, :n] = 1
            old[i, :n] = lp[len(p) - 1:len(seq) - 1].gather(1, torch.tensor(comp)[:, None])[:, 0]
    sampling = (old + torch.randn_like(old) * 1e-3).clamp(max=0) * completion_mask
    batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
             "completion_mask": completion_mask, "sampling_per_token_logps": sampling,
             "old_per_token_logps": old, "advantages": torch.randn(4)}
    dump = os.path.join(tmp, "rollouts-step000000-rank0.jsonl")
    check(dump_trl_batch(batch, dump) == 4 and not os.path.exists(dump + ".tmp"), "dump_trl_batch wrote 4 rows")
    out = os.path.join(tmp, "r.h5")
    p = run("tidal-diff", "--model", model_dir, "--prompts", dump, "--recipe-a", "fp32", "-o", out)
    check("vs the trl dump's engine log-probs (replay)" in p.stdout, "tidal-diff reads it as a TRL dump")
    with h5py.File(out) as f:
        check(f.attrs["rollout_format"] == "trl", "run file: rollout_format trl")
        order = np.argsort(f["seqs/prompt_index"][:], kind="stable")
        off, ns = f["seqs/token_offset"][:], f["seqs/n_scored"][:]
        tok, la, lb, lt = (f["tokens/" + k][:] for k in ("token", "logp_a", "logp_b", "logp_trainer"))
        ok_tok = ok_b = ok_t = True
        err = 0.0
        for i, s in enumerate(order):
            n = int(completion_mask[i].sum())
            sl = slice(off[s], off[s] + ns[s])
            ok_tok &= ns[s] == n and tok[sl].tolist() == completion_ids[i, :n].tolist()
            ok_b &= np.array_equal(lb[sl], sampling[i, :n].numpy().astype(np.float64))
            ok_t &= np.array_equal(lt[sl], old[i, :n].numpy().astype(np.float64))
            err = max(err, float(np.abs(la[sl] - old[i, :n].numpy()).max()))
        check(ok_tok, "tokens: each completion unpadded, in order")
        check(ok_b, "logp_b = sampling_per_token_logps (the engine's)")
        check(ok_t, "logp_trainer = old_per_token_logps (the trainer's)")
        check(err < 1e-4, f"tidal's fp32 training path vs transformers' fp32 log-probs: max |Δ| {err:.2e} < 1e-4")
    try:
        dump_trl_batch({k: v for k, v in batch.items() if k != "sampling_per_token_logps"}, os.path.join(tmp, "x.jsonl"))
        check(False, "a batch without the engine's log-probs is refused")
    except ValueError as e:
        check("vllm_importance_sampling_correction" in str(e), f"a batch without the engine's log-probs is refused ({e})")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failures else 0)
