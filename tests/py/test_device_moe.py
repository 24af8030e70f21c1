"""Mixtures of experts on --device cuda (issues 34 and 35): the routing decision on the host (softmax,
top-k, replay: src/model/moe.c), everything else on the device: the router GEMM, each expert's gather,
GEMMs, SwiGLU and combine, the shared expert, their backward and the LoRA branches (only the router
logits come down, N x E floats, and in the backward the routing weights' gradient, N x K; the
kernels are bit for bit the CPU's ops: tests/cudasim/test_moe_sim.cpp). Device tools as
tests/py/device_train.py chooses them (the simulator's, under CUDASIM_DEVICE_GUARD=1: host code that
touches device memory faults; DEVICE_BIN=build/bin on a GPU).

1. tidal-diff on a tiny random Qwen2-MoE (tidal-init: 8 experts, top-2, a shared expert, layer 2
   dense), Mixtral and OLMoE (q/k norm over the whole projection), fp32 / fp32, greedy, prompt scored: the device generates the CPU's tokens,
   logp_a and logp_b within 1e-5 of the CPU's, the routing (/routing experts of both paths) equal.
2. bf16-train / vllm-bf16 (vLLM's fused_moe combine) and --routing-replay r3 on the device: the
   CPU's tokens; the mean |dlogp| between the paths within 2x of the CPU's (the quantity tidal
   studies must not depend on the device; on the simulator the bf16 GEMMs sum in another order than
   the CPU's, so not bit for bit).
3. tidal-sft on datasets/models/add-moe with the load-balancing loss (fp32, 1 step of 2 sequences):
   loss, grad_norm and aux_loss within 1e-4 relative of the CPU's (the project's fp32 standard); and
   LoRA r 4 on every projection, the experts' included: the same.
Skips (exit 77) without the device tools or numpy.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from device_train import check, cpu, device, rel, tmp  # noqa: E402
import numpy as np  # noqa: E402
import runfile_read  # noqa: E402
from tidal_check import failures  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--hidden-size", "64", "--num-layers", "3", "--num-heads", "4", "--num-kv-heads", "2", "--head-dim", "16",
        "--vocab-size", "128", "--num-experts", "8", "--num-experts-per-tok", "2"]
MODELS = {"qwen2_moe": ["--intermediate-size", "96", "--moe-intermediate-size", "32", "--shared-expert-intermediate-size",
                        "48", "--mlp-only-layers", "2"],
          "mixtral": ["--intermediate-size", "32"], "olmoe": ["--intermediate-size", "32"]}
prompts = os.path.join(tmp, "prompts.jsonl")
with open(prompts, "w") as f:
    for t in ([3, 17, 9, 44, 5], [100, 2, 7], [8, 8, 61, 23, 90, 4, 12]):
        f.write('{"tokens": %s}\n' % t)


def diff_pair(model, name, *args):
    out = []
    for run, where in ((cpu, "cpu"), (device, "dev")):
        path = os.path.join(tmp, f"{name}-{where}.h5")
        run("tidal-diff", "--model", model, "--prompts", prompts, "--max-new-tokens", "6", "--temperature", "0",
            "--no-stop-at-eos", "--score-prompt", "--batch", "3", *args, "-o", path)
        out.append(path)
    return out


def col(path, name):
    return np.asarray(runfile_read.group(path, "tokens")[name])


def routing(path):
    """/routing's experts_b and flip (h5py only: tidal-export has no routing group); None without it"""
    if runfile_read.h5py is None:
        return None
    with runfile_read.h5py.File(path, "r") as f:
        return [f["routing"][k][:] for k in ("experts_b", "flip")]


for arch, extra in MODELS.items():
    model = os.path.join(tmp, arch)
    cpu("tidal-init", "--arch", arch, *TINY, *extra, "--seed", "4", "-o", model)
    c, g = diff_pair(model, arch + "-fp32", "--recipe-a", "fp32", "--recipe-b", "fp32")
    same = np.array_equal(col(c, "token"), col(g, "token"))
    da = float(np.abs(col(c, "logp_a") - col(g, "logp_a")).max())
    db = float(np.abs(col(c, "logp_b") - col(g, "logp_b")).max())
    rc, rg = routing(c), routing(g)
    routes = rc is None or all(np.array_equal(x, y) for x, y in zip(rc, rg))
    check(same and da <= 1e-5 and db <= 1e-5 and routes,
          f"{arch} fp32/fp32 on the device: the CPU's tokens, logp_a within {da:.1e} and logp_b within {db:.1e} "
          f"(<= 1e-5), " + ("the same experts and flips (/routing)" if rc is not None else "/routing not read (no h5py)"))
    for rb, more in (("vllm-bf16", []), ("bf16-infer", ["--routing-replay", "r3"])):
        c, g = diff_pair(model, f"{arch}-{rb}", "--recipe-a", "bf16-train", "--recipe-b", rb, *more)
        same = np.array_equal(col(c, "token"), col(g, "token"))
        mc = float(np.abs(col(c, "dlogp")).mean())
        mg = float(np.abs(col(g, "dlogp")).mean())
        check(same and mc > 0 and 0.5 <= mg / mc <= 2,
              f"{arch} bf16-train/{rb} {' '.join(more)} on the device: the CPU's tokens; mean |dlogp| {mg:.3g} "
              f"within 2x of the CPU's {mc:.3g}")

SFT = ["--model-path", os.path.join(ROOT, "datasets/models/add-moe"), "--dataset-path",
       os.path.join(ROOT, "datasets/tasks/add"), "--learning-rate", "3e-3", "--per-device-batch-size", "2",
       "--seed", "5", "--eval-max-samples", "1", "--max-new-tokens", "4", "--max-steps", "1",
       "--output-router-logits", "true", "--router-aux-loss-coef", "0.01"]
for name, more in (("full", []), ("lora", ["--lora-r", "4", "--lora-target-modules", "all-linear"])):
    runs = []
    for run, where in ((cpu, "cpu"), (device, "dev")):
        out = os.path.join(tmp, f"sft-{name}-{where}")
        run("tidal-sft", *SFT, *more, "-o", out)
        runs.append(runfile_read.steps(os.path.join(out, "sft.h5")))
    worst = {k: rel(runs[0][k], runs[1][k]) for k in ("loss", "grad_norm", "aux_loss")}
    check(runs[0]["grad_norm"][0] > 0 and all(v <= 1e-4 for v in worst.values()),
          f"tidal-sft {name} on add-moe (aux loss on) on the device: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items())
          + " relative to the CPU's (<= 1e-4)")

sys.exit(1 if failures else 0)
