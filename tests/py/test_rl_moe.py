"""tidal-rl on a mixture of experts (datasets/models/add-moe, Qwen2-MoE, 8 experts top-2), issue 35:
1. /steps carries routing_flip_rate and routing_tokens_flipped, finite, in [0, 1] (the rollout's
   experts against pi_old's own top-k at the positions that predict response tokens);
2. on one seed (reports/rl/moe's settings, seed 1) the first step's mean |pi_old - mu|
   (logp_diff_mean) with --routing-replay r3 is below the one without (measured 7.4e-4 against 1.9e-3;
   seeds 2 and 3 lower too, by less: 0.7 % and 0.03 %, their flips carrying less) (the rollout's experts replayed in pi_old), and r2 leaves it as it is
   (R2 replays pi_old's routing in the update only);
3. --resume after a stop at step 2 gives every /steps column bit for bit (timings aside) of the
   uninterrupted 4-step run, with r3 (the rollout's experts kept with the batch and replayed);
4. --routing-replay on a dense model exits 1 naming the flag; a bad value exits 2;
6. /steps/routing_flip_rate_layers: (steps, MoE layers), each layer's flip rate in [0, 1], their mean
   the pooled routing_flip_rate (every layer routes the same positions); absent on the dense model;
   a run file made before it and /steps/aux_loss existed (both deleted after 2 steps) resumes: nan
   rows for the old steps, every other column bit for bit;
7. --dump-step 1 writes the routing in the layout of TRL's input_ids = cat(prompt_ids, completion_ids):
   sampling_routed_experts (the rollout's) and old_routed_experts (pi_old's forward's), int64
   (B, P + T, MoE layers, K), -1 exactly on padding (and, for the rollout, on each sequence's last
   token, which generation never feeds); the step's routing_flip_rate recomputed from the two
   (pi_old's set against the rollout's at the positions predicting response tokens) equals /steps';
   under r3 pi_old's experts are the rollout's wherever the rollout routed;
8. LoRA on attention (r 4, q_proj,v_proj) on add-moe with r3: 2 steps with each --lora-sync run,
   checkpoint-2 holds the adapter under PEFT's names (…self_attn.q_proj.lora_A.weight), the routing
   columns are written; --lora-target-modules all-linear on add-moe adapts attention and every expert
   (not the routers), and the adapter's config lists the projections, not "all-linear"; with
   merge-unmerge, 2 steps and --resume to 3 equal 3 straight steps bit for bit;
5. tidal-sft --freeze-router: two fp32-saved steps leave every router bit-identical to add-moe's while
   every expert matrix moves (without it the routers move too); on a dense model it exits 1.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError:
    print("h5py/numpy unavailable: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BIN, check, failures  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
tmp = tempfile.mkdtemp(prefix="tidal-rl-moe-")
BASE = ["--model-path", os.path.join(ROOT, "datasets/models/add-moe"),
        "--dataset-path", os.path.join(ROOT, "datasets/tasks/add/train.jsonl"), "--num-generations", "4",
        "--per-device-batch-size", "16", "--max-completion-length", "32", "--save-steps", "2", "--learning-rate", "1e-4",
        "--dtype", "bf16",
        "--seed", "5", "--quiet"]


def rl(out, *args):
    p = subprocess.run([os.path.join(BIN, "tidal-rl"), *BASE, "--output-dir", os.path.join(tmp, out), *args],
                       capture_output=True, text=True, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    return p


def steps(out):
    with h5py.File(os.path.join(tmp, out, "rl.h5"), "r") as f:
        return {k: f["steps"][k][:] for k in f["steps"]}


# reports/rl/moe's settings (G 8, 32 completions of up to 48 tokens), one step, seed 1
GRID = ["--num-generations", "8", "--gradient-accumulation-steps", "2", "--max-completion-length", "48", "--seed", "1"]
first = {}
for rr in ("none", "r2", "r3"):
    p = rl(rr, "--max-steps", "1", "--routing-replay", rr, *GRID)
    check(p.returncode == 0, f"tidal-rl --routing-replay {rr} on add-moe runs" + ("" if p.returncode == 0 else p.stderr[-300:]))
    if p.returncode:
        sys.exit(1)
    s = steps(rr)
    fr, tf = s["routing_flip_rate"], s["routing_tokens_flipped"]
    check(bool(np.all(np.isfinite(fr)) and (rr != "none" or fr.max() > 0) and np.all((fr >= 0) & (fr <= 1)) and np.all((tf >= 0) & (tf <= 1))),
          f"{rr}: /steps routing_flip_rate {fr} and routing_tokens_flipped {tf} in [0, 1] (bf16 pair: some flips without replay)")
    first[rr] = float(s["logp_diff_mean"][0])
    fl = s.get("routing_flip_rate_layers")
    check(fl is not None and fl.shape == (1, 4) and bool(np.all((fl >= 0) & (fl <= 1)))
          and abs(float(fl.mean()) - float(fr[0])) <= 1e-12,
          f"{rr}: /steps/routing_flip_rate_layers {None if fl is None else np.round(fl, 4).tolist()} (steps x 4 MoE layers), "
          f"mean = routing_flip_rate {fr[0]:.4f}")
    if rr == "none":
        mf, mu, load = s["routing_mismatch_flipped"][0], s["routing_mismatch_unflipped"][0], s["routing_expert_load"][0]
        check(bool(mf > mu > 0 and load >= 1), f"step 0: flipped tokens' mean |pi_old - mu| {mf:.2e} > unflipped "
              f"{mu:.2e}; expert load {load:.2f} >= 1")
try:
    from safetensors import safe_open
except ImportError:
    safe_open = None
if safe_open is not None:
    for rr in ("none", "r3"):
        p = rl("dump-" + rr, "--max-steps", "1", "--routing-replay", rr, "--dump-step", "1", *GRID)
        with safe_open(os.path.join(tmp, "dump-" + rr, "dump-step-1.safetensors"), "np") as f:
            d = {k: f.get_tensor(k) for k in f.keys()}
            meta = f.metadata()
        sr, orr = d["sampling_routed_experts"], d["old_routed_experts"]
        B, P = d["prompt_ids"].shape
        T = d["completion_ids"].shape[1]
        valid = np.concatenate([d["prompt_mask"], d["completion_mask"]], 1) > 0
        lens = d["completion_mask"].sum(1).astype(int)
        last = np.zeros_like(valid)
        for q in range(B):
            last[q, P + lens[q] - 1] = True
        ok = (sr.shape == orr.shape == (B, P + T, 4, 2) and meta["moe_layers"] == "0,1,2,3"
              and bool(np.all((orr >= 0) == valid[:, :, None, None])) and bool(np.all((sr >= 0) == (valid & ~last)[:, :, None, None]))
              and int(max(sr.max(), orr.max())) < 8)
        check(ok, f"{rr}: --dump-step's routing: (B, P + T, 4, 2) = {sr.shape}, -1 exactly on padding (and the rollout's last tokens)")
        if rr == "none":   # the flip rate from the dump: positions P - 1 + j predict completion token j
            flips = routed = 0
            for q in range(B):
                for j in range(lens[q]):
                    a_, b_ = orr[q, P - 1 + j], sr[q, P - 1 + j]
                    routed += 4
                    flips += sum(set(a_[m]) != set(b_[m]) for m in range(4))
            check(flips > 0 and flips / routed == steps("dump-none")["routing_flip_rate"][0],
                  f"the dump's routing gives /steps' routing_flip_rate ({flips} of {routed})")
        else:
            check(bool(np.all(orr[sr >= 0] == sr[sr >= 0])), "r3: pi_old's experts are the rollout's wherever it routed")
check(first["r3"] < first["none"], f"step 0: mean |pi_old - mu| with r3 {first['r3']:.3e} < without {first['none']:.3e}")
check(first["r2"] == first["none"], f"step 0: r2 leaves pi_old as it is ({first['r2']:.3e})")

full = rl("full", "--max-steps", "4", "--routing-replay", "r3")
cut = rl("cut", "--max-steps", "2", "--routing-replay", "r3")
res = subprocess.run([os.path.join(BIN, "tidal-rl"), *BASE, "--output-dir", os.path.join(tmp, "cut"), "--max-steps", "4",
                      "--routing-replay", "r3", "--resume"], capture_output=True, text=True)
check(full.returncode == 0 and cut.returncode == 0 and res.returncode == 0, "r3: 4 steps, and 2 steps then --resume to 4")
a, b = steps("full"), steps("cut")
bad = [k for k in a if not k.startswith("time_") and not np.array_equal(a[k], b.get(k), equal_nan=True)]
check(not bad, f"r3: --resume gives every /steps column bit for bit ({len(a)} columns{', differ: ' + str(bad) if bad else ''})")
# pi_old from the update's own forward (TRL's per_token_logps.detach(), rl.h) against the separate
# forward (TIDAL_RL_OLD_FORWARD=1): every dataset of the run file bit for bit, under R2 (no replay
# then), R3 with the load-balancing loss's observer beside pi_old's, exact match, the dense twin, and
# the dense twin's rank-1 LoRA (merge-unmerge sync)
def all_datasets(out):
    d = {}
    with h5py.File(os.path.join(tmp, out, "rl.h5"), "r") as f:
        f.visititems(lambda k, v: d.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None)
    return d


DENSE = ["--model-path", os.path.join(ROOT, "datasets/models/add")]
# numerics only: left out of the sanitizer build (CI's time; its code paths run above under ASan)
SAME = () if "asan" in os.environ.get("BUILD", "") else (("r2", ["--routing-replay", "r2"]),
                    ("r3-aux", ["--routing-replay", "r3", "--output-router-logits", "true"]),
                    ("em", ["--exact-match"]), ("dense", DENSE),
                    ("dense-lora", DENSE + ["--lora-r", "1", "--lora-alpha", "2", "--model-dtype", "bf16",
                                            "--lora-sync", "merge-unmerge"]))
# The training path batch-invariant ({"base": "bf16-train", "batch_invariant": true}): the two
# forwards batch the rows differently (the separate one packs tokens, the update runs
# micro-batches), and bf16-train's rows are bit-stable across batches only where its GEMMs take
# the bf16 dot products (AVX-512 BF16: an order set by K alone). On an AVX2-only CPU (a Zen 3,
# 2026-12-01) they take OpenBLAS's sgemm, whose order for a row depends on the batch's row count:
# one row of 2,000 differed in its last bits (pi_old's entropy at step 2 under --exact-match),
# every log-prob the same. With the fixed-order GEMM the claim is exact on every CPU.
BI = os.path.join(tmp, "bf16-train-bi.json")
with open(BI, "w") as f:
    json.dump({"base": "bf16-train", "batch_invariant": True}, f)
BASE_BI = [a for i, a in enumerate(BASE) if a != "--dtype" and (i == 0 or BASE[i - 1] != "--dtype")]
for name, extra in SAME:
    runs = []
    recipes = ["--train-recipe", BI] + ([] if "--exact-match" in extra else ["--rollout-recipe", "bf16-infer"])
    for sep in ("0", "1"):
        out = f"old-{name}-{sep}"
        p = subprocess.run([os.path.join(BIN, "tidal-rl"), *BASE_BI, *recipes, "--output-dir", os.path.join(tmp, out),
                            "--max-steps", "2", "--beta", "0.001", *GRID, *extra], capture_output=True, text=True,
                           env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TIDAL_RL_OLD_FORWARD=sep))
        runs.append(all_datasets(out) if p.returncode == 0 else {})
    ra, rb = runs
    bad = [k for k in ra if "time_" not in k and "seconds" not in k and not (
        np.array_equal(ra[k], rb.get(k), equal_nan=True) if getattr(ra[k], "dtype", None) is not None
        and ra[k].dtype.kind == "f" else np.array_equal(ra[k], rb.get(k)))]
    check(len(ra) > 50 and len(ra) == len(rb) and not bad,
          f"{name}: pi_old from the update's forward = the separate forward's (bf16-train batch-invariant), {len(ra)} datasets bit for bit"
          + (f" (differ: {bad[:5]})" if bad else "") + ("" if p.returncode == 0 else p.stderr[-300:]))

old = rl("old", "--max-steps", "2", "--routing-replay", "r3")
with h5py.File(os.path.join(tmp, "old", "rl.h5"), "a") as f:   # what a run file made before these columns holds
    del f["steps/routing_flip_rate_layers"], f["steps/aux_loss"]
res = subprocess.run([os.path.join(BIN, "tidal-rl"), *BASE, "--output-dir", os.path.join(tmp, "old"), "--max-steps", "4",
                      "--routing-replay", "r3", "--resume"], capture_output=True, text=True)
c = steps("old") if res.returncode == 0 else {}
new = ("routing_flip_rate_layers", "aux_loss")
bad = [k for k in a if not k.startswith("time_") and k not in new and not np.array_equal(a[k], c.get(k), equal_nan=True)]
check(res.returncode == 0 and not bad and bool(np.isnan(c["routing_flip_rate_layers"][:2]).all())
      and np.array_equal(c["routing_flip_rate_layers"][2:], a["routing_flip_rate_layers"][2:]),
      f"a run file older than routing_flip_rate_layers and aux_loss resumes (nan rows before){' differ: ' + str(bad) if bad else ''}"
      + ("" if res.returncode == 0 else res.stderr[-300:]))

dense = subprocess.run([os.path.join(BIN, "tidal-rl"), *BASE[2:], "--model-path", os.path.join(ROOT, "datasets/models/add"),
                        "--output-dir", os.path.join(tmp, "dense"), "--max-steps", "1", "--routing-replay", "r3"],
                       capture_output=True, text=True)
check(dense.returncode == 1 and "--routing-replay" in dense.stderr, "--routing-replay r3 on a dense model: exit 1 naming the flag")
dense = subprocess.run([os.path.join(BIN, "tidal-rl"), *BASE[2:], "--model-path", os.path.join(ROOT, "datasets/models/add"),
                        "--output-dir", os.path.join(tmp, "dense1"), "--max-steps", "1"], capture_output=True, text=True)
sd = steps("dense1") if dense.returncode == 0 else {}
check(dense.returncode == 0 and "routing_flip_rate_layers" not in sd and bool(np.isnan(sd["routing_flip_rate"]).all()),
      "dense model: no routing_flip_rate_layers, routing_flip_rate nan")
badv = rl("bad", "--max-steps", "1", "--routing-replay", "r4")
check(badv.returncode == 2, "--routing-replay r4: usage error (exit 2)")
if safe_open is not None:
    ok = []
    for sync in ("merged", "merge-unmerge", "adapter"):
        p = rl("lora-" + sync, "--max-steps", "2", "--lora-r", "4", "--lora-sync", sync, "--learning-rate", "1e-3",
               "--routing-replay", "r3")
        ck = os.path.join(tmp, "lora-" + sync, "checkpoint-2", "adapter_model.safetensors")
        keys = set(safe_open(ck, "np").keys()) if p.returncode == 0 and os.path.exists(ck) else set()
        ok.append(p.returncode == 0 and "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
                  and len(keys) == 4 * 2 * 2 and bool(np.isfinite(steps("lora-" + sync)["routing_flip_rate"]).all()))
    check(all(ok), f"LoRA q/v on add-moe, r3, each --lora-sync: 2 steps, PEFT-named adapter, routing columns ({ok})")
    p = rl("lora-all", "--max-steps", "1", "--lora-r", "4", "--lora-target-modules", "all-linear", "--save-steps", "1")
    ck = os.path.join(tmp, "lora-all", "checkpoint-1")
    keys = set(safe_open(os.path.join(ck, "adapter_model.safetensors"), "np").keys()) if p.returncode == 0 else set()
    tm = json.load(open(os.path.join(ck, "adapter_config.json")))["target_modules"] if keys else None
    check(p.returncode == 0 and "base_model.model.model.layers.1.mlp.experts.7.down_proj.lora_B.weight" in keys
          and not any(".mlp.gate." in k for k in keys) and isinstance(tm, list) and "gate_proj" in tm,
          f"--lora-target-modules all-linear on add-moe: every expert adapted, no router, the config lists the "
          f"projections ({len(keys)} tensors, target_modules {tm}; {p.stderr.strip()[-120:]})")
    # the experts' drifted base is part of a merge-unmerge run's state: 2 steps + --resume to 3 = 3 straight
    LA = ["--lora-r", "2", "--lora-target-modules", "all-linear", "--lora-sync", "merge-unmerge", "--save-steps", "1",
          "--learning-rate", "1e-3"]
    rl("lx3", "--max-steps", "3", *LA)
    rl("lx", "--max-steps", "2", *LA)
    p = rl("lx", "--max-steps", "3", "--resume", *LA)
    a3, b3 = steps("lx3"), steps("lx") if p.returncode == 0 else {}
    same = bool(b3) and all(np.array_equal(a3[k], b3[k], equal_nan=True) for k in a3
                            if not k.startswith("time") and "memory" not in k and k in b3)
    check(p.returncode == 0 and same and len(a3["loss"]) == 3,
          "LoRA on every expert, merge-unmerge: 2 steps and --resume to 3 equal 3 straight steps bit for bit "
          "(the experts' drifted base restored from lora_base.safetensors)")
try:
    import torch
    from safetensors.torch import load_file
except ImportError:
    torch = None
if torch is not None:
    moved = {}
    for name, extra in (("sft", []), ("sft-frozen", ["--freeze-router"])):
        p = subprocess.run([os.path.join(BIN, "tidal-sft"), "--model-path", os.path.join(ROOT, "datasets/models/add-moe"),
                            "--dataset-path", os.path.join(ROOT, "datasets/tasks/add"), "--output-dir", os.path.join(tmp, name),
                            "--max-steps", "2", "--per-device-batch-size", "4", "--learning-rate", "1e-3", "--save-dtype",
                            "fp32", *extra], capture_output=True, text=True)
        check(p.returncode == 0, f"tidal-sft {' '.join(extra) or '(routers trained)'} on add-moe runs")
        a = load_file(os.path.join(ROOT, "datasets/models/add-moe/model.safetensors"))
        b = load_file(os.path.join(tmp, name, "model.safetensors"))
        routers = [k for k in a if k.endswith("mlp.gate.weight")]
        experts = [k for k in a if ".experts." in k]
        moved[name] = (sum(not torch.equal(a[k].float(), b[k]) for k in routers), sum(not torch.equal(a[k].float(), b[k])
                                                                                        for k in experts))
    check(moved["sft-frozen"][0] == 0 and moved["sft-frozen"][1] == len(experts) and moved["sft"][0] == len(routers),
          f"--freeze-router: routers moved {moved['sft-frozen'][0]} of {len(routers)} (without it {moved['sft'][0]}), "
          f"experts {moved['sft-frozen'][1]} of {len(experts)}")
    d = subprocess.run([os.path.join(BIN, "tidal-sft"), "--model-path", os.path.join(ROOT, "datasets/models/add"),
                        "--dataset-path", os.path.join(ROOT, "datasets/tasks/add"), "--output-dir", os.path.join(tmp, "dense-fr"),
                        "--max-steps", "1", "--freeze-router"], capture_output=True, text=True)
    check(d.returncode == 1 and "--freeze-router" in d.stderr, "--freeze-router on a dense model: exit 1 naming it")
sys.exit(1 if failures else 0)
