"""LoRA adapters in tidal-diff, checked against an independent merge (numpy, float64).

1. For two adapters written by `tidal-init --lora-for` (all seven projections with alpha/r;
   q/v/down only with use_rslora, alpha/sqrt(r)), the merged checkpoint W + scale * B @ A is
   computed here in float64 from the safetensors files (safetensors package) and written as a
   new fp32 checkpoint. Replaying fixed sequences, the fp32 training path of tidal-diff on the
   base model with `--lora` unmerged, and with `--lora --lora-merge-a`, must match it on the
   merged checkpoint within 1e-4 in log-prob on every token (the project's fp32 tolerance:
   fp32 arithmetic, other summation order; the adapter itself moves log-probs by > 1e-2, checked).
2. Generated runs, fp32 both paths, one path merged and the other unmerged, both ways round (the
   KV-cache session with the LoRA branch or merged weights vs the teacher-forced path with the
   other): |dlogp| <= 1e-4 everywhere;
   run-file attributes lora_path, lora_mode_a/b, lora_survival_b (1 within 1e-3 in fp32);
   tidal-merge of two --shard parts keeps them; --resume without the adapter is refused.
3. Survival of a merge into bf16 weights of a bf16 checkpoint (weights on the bf16 grid, as a
   rollout engine holds them), r=8, alpha=16:
     std 1e-4: dW elements ~ 2*sqrt(8)*1e-8 ~ 6e-8, three orders below half an ulp of weights
               ~0.02 (6e-5): only weights within ~1e-5 of zero can move; survival < 0.25
     std 1e-1: dW ~ 0.06, as large as the weights; what is lost is the bf16 rounding of the
               sum, 2^-9 relative: survival within 0.05 of 1
   fp16 (10 fraction bits, ulp 8x finer) keeps more of the small update than bf16 (checked).
4. Bad use: --lora-merge-a without --lora, a missing adapter directory: clear message, non-zero.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

try:
    import h5py
    from safetensors.numpy import load_file, save_file
except ImportError:
    print("h5py or safetensors not installed: skipped")
    sys.exit(77)

from tidal_check import BIN, BUILD, check, failures, run  # noqa: E402
TOL = 1e-4




def merge(base_dir, adapter_dir, out_dir):
    """W + scale * B @ A in float64 for every adapted projection, written as fp32."""
    cfg = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / np.sqrt(r) if cfg.get("use_rslora") else alpha / r
    w = load_file(os.path.join(base_dir, "model.safetensors"))
    ad = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    n = 0
    for name in list(w):
        if not name.endswith("_proj.weight"):
            continue
        stem = "base_model.model." + name[: -len(".weight")]
        if stem + ".lora_A.weight" not in ad:
            continue
        a = ad[stem + ".lora_A.weight"].astype(np.float64)
        b = ad[stem + ".lora_B.weight"].astype(np.float64)
        w[name] = (w[name].astype(np.float64) + scale * (b @ a)).astype(np.float32)
        n += 1
    os.makedirs(out_dir)
    save_file({k: np.ascontiguousarray(v.astype(np.float32)) for k, v in w.items()},
              os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(base_dir, "config.json"), out_dir)
    return n


def logp_a(path):
    with h5py.File(path) as f:
        return f["tokens/logp_a"][:], dict(f.attrs)


tmp = tempfile.mkdtemp(prefix="tidal-lora-test-")
try:
    base = os.path.join(tmp, "base")
    run("tidal-init", "--arch", "qwen2", "--preset", "tiny", "--seed", "3", "-o", base)
    rng = np.random.default_rng(7)
    rollouts = os.path.join(tmp, "rollouts.jsonl")
    with open(rollouts, "w") as f:
        for _ in range(6):
            p, q = rng.integers(3, 12), rng.integers(4, 16)
            f.write(json.dumps({"prompt_ids": rng.integers(0, 512, p).tolist(),
                                "response_ids": rng.integers(0, 512, q).tolist(),
                                "rollout_logprobs": [-1.0] * int(q)}) + "\n")
    replay = ["--prompts", rollouts, "--recipe-a", "fp32", "--recipe-b", "fp32", "--batch", "3"]
    run("tidal-diff", "--model", base, *replay, "-o", os.path.join(tmp, "base.h5"))
    base_lp, _ = logp_a(os.path.join(tmp, "base.h5"))

    # ---- 1. independent merge vs unmerged and merged LoRA, replayed sequences
    adapters = [("all7", ["--rank", "8", "--alpha", "16"], False),
                ("qv_down_rslora", ["--rank", "4", "--alpha", "6", "--targets", "q_proj,v_proj,down_proj"], True)]
    for name, flags, rslora in adapters:
        ad = os.path.join(tmp, "ad_" + name)
        run("tidal-init", "--lora-for", base, *flags, "--lora-std", "0.05", "--seed", "4", "-o", ad)
        if rslora:
            cpath = os.path.join(ad, "adapter_config.json")
            c = json.load(open(cpath))
            c["use_rslora"] = True
            json.dump(c, open(cpath, "w"))
        merged = os.path.join(tmp, "merged_" + name)
        n = merge(base, ad, merged)
        run("tidal-diff", "--model", merged, *replay, "-o", os.path.join(tmp, f"ref_{name}.h5"))
        ref, _ = logp_a(os.path.join(tmp, f"ref_{name}.h5"))
        moved = np.abs(ref - base_lp).max()
        check(moved > 1e-2, f"{name}: the adapter ({n} matrices) moves log-probs (max {moved:.3f})")
        for mode, extra in [("unmerged", []), ("merged", ["--lora-merge-a", "--lora-merge-b"])]:
            out = os.path.join(tmp, f"{name}_{mode}.h5")
            p = run("tidal-diff", "--model", base, *replay, "--lora", ad, *extra, "-o", out)
            lp, attrs = logp_a(out)
            d = np.abs(lp - ref).max()
            check(len(lp) == len(ref) and d <= TOL,
                  f"{name}: --lora {mode} vs float64 merge: max |dlogp| {d:.2e} <= {TOL} on {len(lp)} tokens")
            check(attrs.get("lora_mode_a") == mode and attrs.get("lora_mode_b") == "none"
                  and attrs.get("lora_path") == ad, f"{name} {mode}: lora attributes (B not run in replay)")
            if mode == "merged":
                s = float(attrs.get("lora_survival_a", -1))
                check(abs(s - 1) < 1e-3, f"{name}: fp32 merge survival {s:.6f} ~ 1")
                check("lora: merged into fp32 weights of path A" in p.stderr, "survival printed on stderr")

    # ---- 2. generated, fp32 both paths, A unmerged vs B merged (session with merged weights)
    prompts = os.path.join(tmp, "p.jsonl")
    with open(prompts, "w") as f:
        for _ in range(4):
            f.write(json.dumps({"tokens": rng.integers(0, 512, rng.integers(3, 10)).tolist()}) + "\n")
    ad = os.path.join(tmp, "ad_all7")
    out = os.path.join(tmp, "gen_am.h5")   # A merged, B unmerged: the session's LoRA branch
    run("tidal-diff", "--model", base, "--prompts", prompts, "--recipe-a", "fp32", "--recipe-b", "fp32",
        "--lora", ad, "--lora-merge-a", "--max-new-tokens", "12", "--batch", "2", "--score-prompt", "-o", out)
    with h5py.File(out) as f:
        d = np.abs(f["tokens/dlogp"][:])
    check(len(d) > 40 and d.max() <= TOL, f"generate: A merged vs B unmerged, fp32: max |dlogp| {d.max():.2e} on {len(d)} tokens")
    out = os.path.join(tmp, "gen.h5")
    run("tidal-diff", "--model", base, "--prompts", prompts, "--recipe-a", "fp32", "--recipe-b", "fp32",
        "--lora", ad, "--lora-merge-b", "--max-new-tokens", "12", "--batch", "2", "--score-prompt", "-o", out)
    with h5py.File(out) as f:
        d = np.abs(f["tokens/dlogp"][:])
        a = dict(f.attrs)
    check(len(d) > 40 and d.max() <= TOL, f"generate: A unmerged vs B merged, fp32: max |dlogp| {d.max():.2e} on {len(d)} tokens")
    check(a["lora_mode_a"] == "unmerged" and a["lora_mode_b"] == "merged", "generate: lora modes recorded")
    check(abs(float(a["lora_survival_b"]) - 1) < 1e-3 and float(a["lora_changed_frac_b"]) > 0.99,
          f"generate: fp32 survival {float(a['lora_survival_b']):.6f}")

    # shards of a LoRA run merge with their lora attributes; --resume refuses another adapter
    parts = []
    for k in range(2):
        parts.append(os.path.join(tmp, f"sh{k}.h5"))
        run("tidal-diff", "--model", base, "--prompts", prompts, "--recipe-a", "fp32", "--recipe-b", "fp32",
            "--lora", ad, "--lora-merge-b", "--max-new-tokens", "4", "--batch", "2", "--shard", f"{k}/2", "-o", parts[-1])
    joined = os.path.join(tmp, "joined.h5")
    run("tidal-merge", "-o", joined, *parts)
    with h5py.File(joined) as f:
        check(f.attrs["lora_mode_b"] == "merged" and abs(float(f.attrs["lora_survival_b"]) - 1) < 1e-3,
              "tidal-merge keeps lora_mode_b and lora_survival_b")
    p = run("tidal-diff", "--model", base, "--prompts", prompts, "--recipe-a", "fp32", "--recipe-b", "fp32",
            "--max-new-tokens", "4", "--batch", "2", "--shard", "0/2", "--resume", "-o", parts[0], ok=False)
    check(p.returncode != 0 and f"--lora: run has {ad}, command gives ''" in p.stderr,
          "--resume without the file's adapter refused, naming --lora and both values")

    # ---- 3. survival when merging into bf16 / fp16 weights of a bf16 checkpoint
    bbase = os.path.join(tmp, "base_bf16")
    run("tidal-init", "--arch", "qwen2", "--preset", "tiny", "--seed", "3", "--dtype", "bf16", "-o", bbase)
    two = os.path.join(tmp, "p2.jsonl")
    with open(two, "w") as f:
        f.write(json.dumps({"tokens": [5, 6, 7]}) + "\n")
    surv = {}
    for std in ["1e-4", "1e-1"]:
        ad = os.path.join(tmp, "ad_std" + std)
        run("tidal-init", "--lora-for", bbase, "--rank", "8", "--alpha", "16", "--lora-std", std, "--seed", "4", "-o", ad)
        for dt in ["bf16", "fp16"]:
            out = os.path.join(tmp, f"s_{std}_{dt}.h5")
            run("tidal-diff", "--model", bbase, "--prompts", two, "--recipe-a", f"{dt}-train", "--recipe-b",
                f"{dt}-infer", "--lora", ad, "--lora-merge-b", "--max-new-tokens", "2", "-o", out)
            with h5py.File(out) as f:
                surv[std, dt] = (float(f.attrs["lora_survival_b"]), float(f.attrs["lora_changed_frac_b"]),
                                 float(f.attrs["lora_aligned_b"]))
            print(f"     std {std} merged in {dt}: survival {surv[std, dt][0]:.4f}, changed {surv[std, dt][1]:.4f},"
                  f" aligned {surv[std, dt][2]:.4f}")
    check(surv["1e-4", "bf16"][0] < 0.25, f"bf16, std 1e-4: survival {surv['1e-4', 'bf16'][0]:.4f} < 0.25")
    check(abs(surv["1e-1", "bf16"][0] - 1) < 0.05, f"bf16, std 1e-1: survival {surv['1e-1', 'bf16'][0]:.4f} within 0.05 of 1")
    check(surv["1e-4", "fp16"][1] > surv["1e-4", "bf16"][1],
          "fp16 changes more elements than bf16 for the small update")

    # ---- 4. bad use
    p = run("tidal-diff", "--model", base, *replay, "--lora-merge-a", "-o", os.path.join(tmp, "x.h5"), ok=False)
    check(p.returncode == 2 and "--lora" in p.stderr, "--lora-merge-a without --lora refused")
    p = run("tidal-diff", "--model", base, *replay, "--lora", os.path.join(tmp, "nope"), "-o", os.path.join(tmp, "x.h5"), ok=False)
    check(p.returncode == 1 and "nope/adapter_config.json" in p.stderr, "missing adapter: message names the file")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all LoRA checks passed")
