#!/usr/bin/env python3
"""Mixtures of experts end to end: tidal-diff's fp32 paths against an independent float64
reference (tests/py/moe_ref.py), on tiny random Mixtral / Qwen2-MoE / Qwen3-MoE checkpoints
(tests/py/make_moe_checkpoints.py) in transformers 4's per-expert and transformers 5's fused
layouts, stored in float32 and bfloat16. The fused checkpoints carry the config.json transformers
5 writes ("dtype", "rope_parameters", Mixtral's head_dim null, Qwen2-MoE's qkv_bias and
sliding_window 0, Qwen3-MoE's experts as "num_local_experts"; sources in make_moe_checkpoints.py),
the per-expert ones a transformers 4 config.

1. The reference against transformers 4.46 itself (float64 model, eager attention), Mixtral and
   Qwen2-MoE, both storages: log-probs within 1e-5 (transformers computes RoPE cos/sin, RMSNorm,
   the attention softmax and the router softmax in fp32 even in a float64 model; measured max
   |d| about 1e-6), routing identical (its own top-k of its fp32 router softmax, where the
   reference's top-k margin exceeds 1e-6). Skipped when transformers cannot be imported
   (Qwen3-MoE needs transformers >= 4.51, which needs torch 2: not checked against it here).
2. The reference reads a fused checkpoint and the per-expert one of the same seed to identical
   log-probs and routing (the fused writer and reader agree on gate rows first).
3. tidal-diff --recipe-a fp32 --recipe-b fp32, greedy, 8 new tokens, prompt scored, on 3 token
   prompts: every scored token's logp_a and logp_b within 1e-5 of the reference's on the full
   sequence (prompt + tidal's tokens), and tidal's greedy tokens are the reference's argmax
   wherever the reference's top-2 log-prob margin exceeds 1e-4. Tokens predicted at or after a
   position where some MoE layer's reference top-k margin (k-th minus (k+1)-th router probability)
   is below 1e-5 are left out of both (tidal's fp32 router may choose the other expert there;
   their number is printed).
4. Bad input: a per-expert checkpoint missing one expert tensor, a fused gate_up_proj of the
   wrong shape, num_experts_per_tok > num_experts, "n_group", "scoring_func": "sigmoid", OLMoE's
   "clip_qkv": exit 1,
   no crash, stderr naming the thing.
Exit 77 when torch or safetensors is missing.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import torch  # noqa: F401
    import safetensors  # noqa: F401
except Exception as e:  # noqa: BLE001 - any import failure means: helper missing
    print("skip: torch / safetensors unavailable (%s)" % e.__class__.__name__)
    sys.exit(77)

import make_moe_checkpoints as mk  # noqa: E402
import moe_ref  # noqa: E402
from tidal_check import BIN, check, failures  # noqa: E402

TOL = 1e-5            # |tidal fp32 log-prob - float64 reference|
HF_TOL = 1e-5         # |transformers float64 log-prob - reference|
MARGIN_SAFE = 1e-5    # reference router top-k margins below this: tidal may route otherwise
HF_MARGIN = 1e-6      # likewise for transformers' fp32 router softmax
GREEDY_MARGIN = 1e-4  # reference top-2 log-prob margin above which tidal's greedy token must be its argmax
NEW_TOKENS = 8
CASES = [("mixtral", None), ("qwen2_moe", None), ("qwen3_moe", "a"), ("qwen3_moe", "b")]
t_start = time.time()


def label(arch, variant, layout=None, storage=None):
    return " ".join(x for x in (arch + (f"/{variant}" if variant else ""), layout, storage) if x)


def tidal_diff(*args):
    p = subprocess.run([os.path.join(BIN, "tidal-diff"), *map(str, args)], capture_output=True, text=True)
    return p


def write_prompts(path, seed, vocab=128, n=3):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, int(rng.integers(5, 13))).tolist() for _ in range(n)]
    with open(path, "w") as f:
        for t in prompts:
            f.write(json.dumps({"tokens": t}) + "\n")
    return prompts


def first_near_tie(K, routing, T):
    """First position whose router top-k margin is below MARGIN_SAFE in some MoE layer (T: none)."""
    first = T
    for _, probs in routing:
        m = moe_ref.topk_margin(probs, K)
        low = np.nonzero(m < MARGIN_SAFE)[0]
        if len(low):
            first = min(first, int(low[0]))
    return first


# ---- 1. the reference against transformers 4.46
def check_against_transformers(tmp):
    try:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
    except Exception as e:  # noqa: BLE001
        print("skip (part 1): transformers unavailable (%s)" % e.__class__.__name__)
        return
    import warnings
    warnings.filterwarnings("ignore", message=".*sigmoid is deprecated.*")
    rng = np.random.default_rng(7)
    for arch in ("mixtral", "qwen2_moe"):
        for storage in mk.STORAGES:
            d = mk.make(os.path.join(tmp, f"hf-{arch}-{storage}"), arch, "per-expert", storage, seed=3)
            cfg, w = moe_ref.load(d)
            m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64, attn_implementation="eager").eval()
            # the routers: the gate Linear(hidden, E) of each sparse block (MixtralSparseMoeBlock.gate,
            # Qwen2MoeSparseMoeBlock.gate), in layer order
            gates = [mod for n, mod in m.named_modules()
                     if n.endswith(".gate") and isinstance(mod, torch.nn.Linear) and mod.out_features == cfg["E"]]
            logits = []
            hooks = [g.register_forward_hook(lambda mod, i, o: logits.append(o.detach())) for g in gates]
            worst, same, compared, near = 0.0, True, 0, 0
            for _ in range(3):
                ids = rng.integers(0, cfg["V"], int(rng.integers(5, 17))).tolist()
                logits.clear()
                with torch.no_grad():
                    hf = torch.log_softmax(m(torch.tensor([ids])).logits[0].double(), -1).numpy()
                lp, routing = moe_ref.forward(cfg, w, ids)
                worst = max(worst, float(np.abs(hf - lp).max()))
                same &= len(logits) == len(routing) == sum(cfg["sparse"])
                for (idx, probs), lg in zip(routing, logits):
                    hidx = torch.topk(torch.softmax(lg.view(len(ids), -1).float(), -1), cfg["K"], -1).indices.numpy()
                    ok = moe_ref.topk_margin(probs, cfg["K"]) > HF_MARGIN
                    near += int((~ok).sum())
                    compared += int(ok.sum())
                    same &= bool(np.array_equal(hidx[ok], idx[ok]))
            for h in hooks:
                h.remove()
            check(worst <= HF_TOL, f"reference vs transformers {arch} {storage} (float64, eager): "
                                   f"max |dlogp| {worst:.2e} <= {HF_TOL:.0e}")
            check(same and compared > 0, f"reference vs transformers {arch} {storage}: same experts in the same order "
                                         f"at {compared} (position, layer) pairs ({near} near-ties left out)")


# ---- 2. the reference reads both layouts alike
def check_layouts_agree(tmp):
    rng = np.random.default_rng(11)
    for arch, variant in CASES:
        for storage in mk.STORAGES:
            a = moe_ref.load(mk.make(os.path.join(tmp, "lay-pe"), arch, "per-expert", storage, 5, variant))
            b = moe_ref.load(mk.make(os.path.join(tmp, "lay-fu"), arch, "fused", storage, 5, variant))
            ids = rng.integers(0, 128, 12).tolist()
            la, ra = moe_ref.forward(*a, ids)
            lb, rb = moe_ref.forward(*b, ids)
            same = np.array_equal(la, lb) and len(ra) == len(rb) and all(
                np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(ra, rb))
            check(same, f"reference: {label(arch, variant, storage=storage)} fused == per-expert "
                        f"(log-probs and routing identical, {len(ra)} MoE layers)")
            shutil.rmtree(os.path.join(tmp, "lay-pe"))
            shutil.rmtree(os.path.join(tmp, "lay-fu"))


# ---- 3. tidal-diff against the reference
def check_tidal(tmp, arch, variant, layout, storage, seed):
    name = label(arch, variant, layout, storage)
    d = mk.make(os.path.join(tmp, "ck-" + name.replace(" ", "-").replace("/", "-")), arch, layout, storage, seed,
                variant)
    prompts_path = os.path.join(tmp, "prompts.jsonl")
    prompts = write_prompts(prompts_path, seed)
    out = os.path.join(tmp, "out.h5")
    p = tidal_diff("--model", d, "--prompts", prompts_path, "-o", out, "--force", "--recipe-a", "fp32",
                   "--recipe-b", "fp32", "--temperature", "0", "--max-new-tokens", NEW_TOKENS, "--no-stop-at-eos",
                   "--score-prompt", "--seed", "1")
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        why = "tidal refuses the architecture" if "unknown architecture" in p.stderr else f"exit {p.returncode}"
        check(False, f"tidal-diff {name}: ran ({why}: {tail[0][-300:]})")
        return
    cfg, w = moe_ref.load(d)
    compare_run(out, prompts, lambda seq: moe_ref.forward(cfg, w, seq) + (cfg["K"],), name)


def compare_run(out, prompts, ref_fn, name):
    """Checks a tidal-diff run file against ref_fn(token list) -> (log-probs [T, V], routing, K)."""
    import h5py
    with h5py.File(out, "r") as f:
        t = {k: f["tokens"][k][:] for k in ("seq", "pos", "token", "logp_a", "logp_b")}
        s = {k: f["seqs"][k][:] for k in ("prompt_index", "tokens_offset", "prompt_len", "response_len",
                                         "token_offset", "n_scored")}
        pt = f["prompts/tokens"][:]
        rt = {k: f["routing"][k][:] for k in ("flip", "margin_a", "moved", "n_flips", "experts_b")} \
            if "routing" in f else None
    # /routing (reports/SCHEMA.md): rows aligned with /tokens, one column per MoE layer, the routing
    # of the predicting position pos - 1. fp32 against fp32: B's experts are the reference's (same
    # order) wherever no layer is near a tie, A's too (flip 0, moved 0, n_flips 0), and A's margin is
    # the reference's k-th minus (k+1)-th probability (fp32 softmax against float64: <= 1e-5).
    route_ok, worst_margin, n_route = rt is not None, 0.0, 0

    worst_a = worst_b = 0.0
    n_checked = n_tie = n_greedy = 0
    struct_ok, greedy_ok = True, True
    bad_greedy = []
    for i in range(len(s["prompt_index"])):
        P, R = int(s["prompt_len"][i]), int(s["response_len"][i])
        to, o, n = int(s["tokens_offset"][i]), int(s["token_offset"][i]), int(s["n_scored"][i])
        seq = pt[to:to + P + R].astype(np.int64)
        struct_ok &= (seq[:P].tolist() == prompts[int(s["prompt_index"][i])] and R == NEW_TOKENS and n == P - 1 + R
                      and bool((t["seq"][o:o + n] == i).all()))
        ref, routing, K = ref_fn(seq.tolist())
        tie = first_near_tie(K, routing, len(seq))
        pos, tok = t["pos"][o:o + n].astype(np.int64), t["token"][o:o + n].astype(np.int64)
        struct_ok &= bool(np.array_equal(seq[pos], tok)) and pos.min() >= 1
        keep = pos - 1 < tie
        n_tie += int((~keep).sum())
        lp = ref[pos - 1, tok]
        if rt is not None and keep.any():
            Lm = len(routing)
            eb = rt["experts_b"][o:o + n].reshape(n, Lm, K)
            for r in np.nonzero(keep)[0]:
                p = int(pos[r]) - 1
                for m, (ex, probs) in enumerate(routing):
                    route_ok &= bool(np.array_equal(eb[r, m], np.asarray(ex[p]))) and int(rt["flip"][o + r, m]) == 0 \
                        and float(rt["moved"][o + r, m]) == 0.0
                    rm = float(moe_ref.topk_margin(np.asarray(probs[p])[None], K)[0])
                    if np.isfinite(rm):
                        worst_margin = max(worst_margin, abs(float(rt["margin_a"][o + r, m]) - rm))
                route_ok &= int(rt["n_flips"][o + r]) == 0
                n_route += 1
        if keep.any():
            worst_a = max(worst_a, float(np.abs(t["logp_a"][o:o + n] - lp)[keep].max()))
            worst_b = max(worst_b, float(np.abs(t["logp_b"][o:o + n] - lp)[keep].max()))
            n_checked += int(keep.sum())
        for q in range(P, P + R):              # greedy: tidal's token q is the argmax of ref row q - 1
            if q - 1 >= tie:
                break
            row = np.sort(ref[q - 1])[::-1]
            if row[0] - row[1] > GREEDY_MARGIN:
                n_greedy += 1
                if seq[q] != int(np.argmax(ref[q - 1])):
                    greedy_ok = False
                    bad_greedy.append((i, q))
    check(struct_ok and len(s["prompt_index"]) == len(prompts),
          f"tidal-diff {name}: {len(prompts)} sequences, prompts intact, {NEW_TOKENS} new tokens each, "
          f"prompt tokens 1..P-1 and the response scored")
    check(n_checked > 0 and worst_a <= TOL and worst_b <= TOL,
          f"tidal-diff {name}: fp32 vs float64 reference on {n_checked} tokens: max |logp_a - ref| {worst_a:.2e}, "
          f"max |logp_b - ref| {worst_b:.2e} <= {TOL:.0e} ({n_tie} after a router near-tie left out)")
    check(route_ok and n_route > 0 and worst_margin <= 1e-5,
          f"tidal-diff {name}: /routing on {n_route} tokens: B's experts (in top-k order) are the reference's, A's "
          f"agree (flip 0, moved 0, n_flips 0), margin_a within {worst_margin:.1e} of the reference's")
    miss = f" (not at (seq, pos) {bad_greedy[:4]})" if bad_greedy else ""
    check(greedy_ok and n_greedy > 0,
          f"tidal-diff {name}: greedy tokens are the reference's argmax at {n_greedy} clear positions{miss}")


# ---- 3b. a bf16 pair: routing flips recorded, and --routing-replay r3 removes what they carry
def check_replay(tmp):
    import h5py
    d = mk.make(os.path.join(tmp, "replay-mixtral"), "mixtral", "per-expert", "f32", 31)
    prompts = os.path.join(tmp, "replay-prompts.jsonl")
    write_prompts(prompts, 7, n=8)
    runs = {}
    for rr in ("none", "r3"):
        out = os.path.join(tmp, f"replay-{rr}.h5")
        p = tidal_diff("--model", d, "--prompts", prompts, "-o", out, "--force", "--max-new-tokens", "32",
                       "--no-stop-at-eos", "--seed", "3", "--routing-replay", rr, "--json")
        if p.returncode:
            check(False, f"tidal-diff bf16-train vs bf16-infer --routing-replay {rr} ran ({p.stderr.strip()[-200:]})")
            return
        with h5py.File(out, "r") as f:
            runs[rr] = (json.loads(p.stdout), f["tokens/dlogp"][:], f["routing/flip"][:], f["routing/n_flips"][:],
                        f.attrs["routing_replay"])
    (jn, dn, fn, nn, an), (jr, dr, fr, nr, ar) = runs["none"], runs["r3"]
    check(bool((nn == (fn == 2).sum(1)).all()) and bool((nr == (fr == 2).sum(1)).all()),
          "bf16 pair: /routing/n_flips counts the layers with flip 2")
    rate = float((fn == 2).mean())
    check(rate > 0, f"bf16-train vs bf16-infer: routing flips recorded ({rate:.3f} of (token, MoE layer) decisions; "
          f"summary {jn['routing']['flip_rate_per_layer']})")
    a = np.abs(dn).mean()
    b = np.abs(dr).mean()
    check(b < a, f"--routing-replay r3 lowers mean |dlogp|: {a:.3e} -> {b:.3e} (the file records the flips replay "
          f"removed: {float((fr == 2).mean()):.3f}, attribute {ar!r})")
    # the readers of /routing: tidal-report's routing section, tidal-heatmap --plot routing
    outs = [os.path.join(tmp, f"replay-{rr}.h5") for rr in ("none", "r3")]
    rep = subprocess.run([os.path.join(BIN, "tidal-report"), *outs], capture_output=True, text=True)
    check(rep.returncode == 0 and "routing (mixture of experts)" in rep.stdout and "replay removed" in rep.stdout,
          "tidal-report: a routing section for both runs, the replayed one saying so")
    png = os.path.join(tmp, "flips.png")
    hm = subprocess.run([os.path.join(BIN, "tidal-heatmap"), "--plot", "routing", *outs, "-o", png],
                        capture_output=True, text=True)
    check(hm.returncode == 0 and os.path.getsize(png) > 1000 and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n",
          "tidal-heatmap --plot routing writes the picture")
    sel = (nn > 0)
    if sel.any():
        print(f"     flipped tokens carry mean |dlogp| {np.abs(dn[sel]).mean():.3e} against {np.abs(dn[~sel]).mean():.3e} "
              f"unflipped ({int(sel.sum())} of {len(sel)})")


# ---- 4. bad input
def check_bad(tmp):
    prompts = os.path.join(tmp, "bad-prompts.jsonl")
    write_prompts(prompts, 99, n=1)

    def bad(what, d, *needles, also=()):
        p = tidal_diff("--model", d, "--prompts", prompts, "-o", os.path.join(tmp, "bad.h5"), "--force",
                       "--recipe-a", "fp32", "--recipe-b", "fp32", "--max-new-tokens", "2")
        msg = p.stderr
        good = p.returncode == 1 and "Segmentation" not in msg and "Abort" not in msg and all(n in msg for n in needles)
        check(good, f"bad input: {what}: exit 1 naming {', '.join(needles)}"
                    + ("" if good else f" (exit {p.returncode}: {msg.strip()[-300:]})"))
        for rx, desc in also:   # further things stderr should give (regular expressions)
            check(re.search(rx, msg) is not None, f"bad input: {what}: stderr gives {desc}")

    d = mk.make(os.path.join(tmp, "bad-missing-mixtral"), "mixtral", "per-expert", "f32", 21)
    gone = "model.layers.2.block_sparse_moe.experts.5.w3.weight"
    mk.edit_tensors(d, drop=[gone])
    bad("Mixtral per-expert checkpoint without one expert tensor", d, gone)

    d = mk.make(os.path.join(tmp, "bad-missing-qwen2"), "qwen2_moe", "per-expert", "f32", 21)
    gone = "model.layers.0.mlp.experts.3.down_proj.weight"
    mk.edit_tensors(d, drop=[gone])
    bad("Qwen2-MoE per-expert checkpoint without one expert tensor", d, gone)

    d = mk.make(os.path.join(tmp, "bad-fused-shape"), "mixtral", "fused", "f32", 21)
    name = "model.layers.1.mlp.experts.gate_up_proj"
    mk.edit_tensors(d, replace={name: torch.zeros(8, 32, 64)})        # [E, I, H]: the up half missing
    bad("fused gate_up_proj of shape [8, 32, 64] instead of [8, 64, 64]", d, name,
        also=[(r"8\D{1,3}32\D{1,3}64", "the shape found (8, 32, 64)"),
              (r"8\D{1,3}64\D{1,3}64", "the shape expected (8, 64, 64)")])

    d = mk.make(os.path.join(tmp, "bad-topk"), "qwen3_moe", "per-expert", "f32", 21)
    mk.patch_config(d, num_experts_per_tok=9)
    bad("num_experts_per_tok 9 > num_experts 8", d, "num_experts_per_tok")

    d = mk.make(os.path.join(tmp, "bad-ngroup"), "qwen3_moe", "per-expert", "f32", 21)
    mk.patch_config(d, n_group=8)
    bad('config with "n_group": 8', d, "n_group")

    d = mk.make(os.path.join(tmp, "bad-sigmoid"), "qwen3_moe", "per-expert", "f32", 21)
    mk.patch_config(d, scoring_func="sigmoid")
    bad('config with "scoring_func": "sigmoid"', d, "scoring_func")

    d = os.path.join(tmp, "bad-clip")   # OLMoE's clamp of q, k, v: not modelled
    subprocess.run([os.path.join(BIN, "tidal-init"), "--arch", "olmoe", "--preset", "tiny", "-o", d], check=True,
                   capture_output=True)
    mk.patch_config(d, clip_qkv=8.0)
    bad('OLMoE config with "clip_qkv": 8.0', d, "clip_qkv")


def check_fused_combine(tmp):
    """recipe "moe": "fused" (vLLM's fused_moe: fp32 routing weights in the down GEMM's epilogue,
    moe_sum in top-k order) against the same engine recipe with HF's combine: on the shipped MoE
    model the engine's log-probs differ; on the dense twin they are bit-identical (the field
    touches MoE layers only)."""
    import h5py
    hf = os.path.join(tmp, "vllm-hf.json")
    with open(hf, "w") as f:
        json.dump({"base": "vllm-bf16", "moe": "hf"}, f)
    got = {}
    for m in ("add-moe", "add"):
        for rb in ("vllm-bf16", hf):
            out = os.path.join(tmp, f"fused-{m}-{os.path.basename(rb)}.h5")
            p = tidal_diff("--model", os.path.join("datasets/models", m), "--prompts", "datasets/models/prompts-add.jsonl",
                           "--max-new-tokens", 8, "--recipe-a", "fp32", "--recipe-b", rb, "--temperature", 0, "-o", out, "--force")
            if p.returncode:
                check(False, f"tidal-diff {m} {rb}: {p.stderr.strip()[-200:]}")
                return
            with h5py.File(out, "r") as f:
                got[m, rb] = f["tokens/logp_b"][:]
    a, b = got["add-moe", "vllm-bf16"], got["add-moe", hf]
    check(a.shape != b.shape or not np.array_equal(a, b),
          f"add-moe: vllm-bf16's fused combine changes the engine's log-probs against HF's combine "
          f"({int(np.sum(a != b)) if a.shape == b.shape else 'different lengths'} of {a.size} differ)")
    check(np.array_equal(got["add", "vllm-bf16"], got["add", hf]), "add (dense): the moe field changes nothing, bit for bit")


def main():
    tmp = tempfile.mkdtemp(prefix="tidal-moe-test-")
    try:
        run_all(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failed ({time.time() - t_start:.1f} s)")
    return 1 if failures else 0


def run_all(tmp):
    check_against_transformers(tmp)
    check_layouts_agree(tmp)
    try:
        import h5py  # noqa: F401
    except ImportError:
        check(False, "h5py importable (needed to read tidal-diff's run files)")
    else:
        seed = 100
        for arch, variant in CASES:
            for layout in mk.LAYOUTS:
                for storage in mk.STORAGES:
                    seed += 1
                    check_tidal(tmp, arch, variant, layout, storage, seed)
        check_replay(tmp)
        check_fused_combine(tmp)
        check_bad(tmp)


if __name__ == "__main__":
    sys.exit(main())
