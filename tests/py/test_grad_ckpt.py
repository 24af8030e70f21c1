"""--gradient-checkpointing (HF's activation recomputation) in tidal-sft and tidal-rl: the trainer
keeps only the stream entering each layer and recomputes the layer's activations just before its
backward, with the same ops in the same order, so everything a run writes is the same bit for bit
(a few seconds to a minute):

1. tidal-sft on the shipped add model (Qwen2 shape, q/k/v biases): bf16-train full fine-tuning,
   fp16-train with loss scaling, the FP8 unified training recipe, LoRA r 4 on all linear layers:
   every /steps column but the timings and every saved tensor identical with and without it.
2. a Qwen3-shaped model (per-head q/k norms, GQA), made by tidal-init with the add tokenizer:
   the same.
3. tidal-rl, 2 GRPO steps in bf16: every /steps column but the timings identical.
4. the memory it is for: a wider 8-layer model's tidal-sft peak RSS is lower with it (measured
   with wait4 on each run).
5. a recipe whose fused add+RMSNorm reads the unrounded residual sum (sglang-bf16) cannot be
   recomputed from the stored stream: refused with exit 1 naming the reason; --resume of a run
   made without it accepts it (results do not change).
"""
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    from safetensors.numpy import load_file
except ImportError:
    print("h5py/numpy/safetensors missing: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BIN, check, failures  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ADD = os.path.join(ROOT, "datasets", "models", "add")
DATA = os.path.join(ROOT, "datasets", "tasks", "add", "train.jsonl")
tmp = tempfile.mkdtemp(prefix="tidal-gradckpt-")
env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")


def run(tool, *args):
    p = subprocess.run([os.path.join(BIN, tool), *args], capture_output=True, text=True, env=env, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def run_rss(tool, *args):
    """exit status, stderr and peak RSS (KiB) of one run"""
    p = subprocess.Popen([os.path.join(BIN, tool), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=env, cwd=ROOT)
    err = p.stderr.read().decode()
    _, status, ru = os.wait4(p.pid, 0)
    p.stderr.close()
    return os.waitstatus_to_exitcode(status), err, ru.ru_maxrss


def steps(path):
    with h5py.File(path, "r") as f:
        return {k: f["steps"][k][()] for k in f["steps"]}


def same_steps(a, b):
    bad = [k for k in a if "second" not in k and "time" not in k
           and not np.array_equal(a[k], b.get(k), equal_nan=a[k].dtype.kind == "f")]
    return bad


def same_tensors(d1, d2, name):
    x, y = load_file(os.path.join(d1, name)), load_file(os.path.join(d2, name))
    return sorted(x) == sorted(y) and all(np.array_equal(x[k], y[k]) for k in x)


def sft_pair(label, model, *extra, files=("model.safetensors",)):
    outs = []
    for gc in ((), ("--gradient-checkpointing",)):
        out = os.path.join(tmp, f"sft-{label}-{len(gc)}")
        rc, _, err = run("tidal-sft", "--model-path", model, "--dataset-path", DATA, "--max-steps", "2",
                         "--per-device-batch-size", "8", "--learning-rate", "1e-3", "--eval-steps", "0", "--eval-max-samples", "4",
                         "--output-dir", out, *extra, *gc)
        if rc != 0:
            check(False, f"{label}: tidal-sft {' '.join(gc)} runs ({err.strip()[-300:]})")
            return
        outs.append(out)
    bad = same_steps(steps(os.path.join(outs[0], "sft.h5")), steps(os.path.join(outs[1], "sft.h5")))
    check(not bad, f"{label}: /steps identical with --gradient-checkpointing (differing: {bad})")
    for f in files:
        check(same_tensors(outs[0], outs[1], f), f"{label}: {f} identical tensor for tensor")


# 1. the add model
sft_pair("bf16-train", ADD, "--recipe", "bf16-train")
sft_pair("fp16-train", ADD, "--recipe", "fp16-train")
sft_pair("fp8-unified-train", ADD, "--recipe", "fp8-unified-train")
sft_pair("lora-bf16", ADD, "--recipe", "bf16-train", "--lora-r", "4", "--lora-target-modules", "all-linear",
         files=("adapter_model.safetensors",))

# 2. a Qwen3 shape
q3 = os.path.join(tmp, "qwen3")
rc, _, err = run("tidal-init", "--arch", "qwen3", "--hidden-size", "64", "--num-layers", "3", "--num-heads", "4",
                 "--num-kv-heads", "2", "--head-dim", "32", "--intermediate-size", "160", "--vocab-size", "100",
                 "--seed", "3", "-o", q3)
check(rc == 0, f"tidal-init writes a Qwen3-shaped model ({err.strip()[-200:]})")
for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy(os.path.join(ADD, f), q3)
sft_pair("qwen3-bf16", q3, "--recipe", "bf16-train")

# 3. tidal-rl
outs = []
for gc in ((), ("--gradient-checkpointing",)):
    out = os.path.join(tmp, f"rl-{len(gc)}")
    rc, _, err = run("tidal-rl", "--model-path", ADD, "--dataset-path", DATA, "--dtype", "bf16",
                     "--num-generations", "4", "--per-device-batch-size", "8", "--max-completion-length", "40",
                     "--max-steps", "2", "--learning-rate", "1e-3", "--quiet", "--output-dir", out, *gc)
    check(rc == 0, f"tidal-rl {' '.join(gc)} runs ({err.strip()[-200:]})")
    outs.append(out)
if all(os.path.exists(os.path.join(o, "rl.h5")) for o in outs):
    bad = same_steps(steps(os.path.join(outs[0], "rl.h5")), steps(os.path.join(outs[1], "rl.h5")))
    check(not bad, f"tidal-rl: /steps identical with --gradient-checkpointing (differing: {bad})")

# 4. memory
wide = os.path.join(tmp, "wide")
run("tidal-init", "--arch", "qwen2", "--hidden-size", "256", "--num-layers", "8", "--num-heads", "4",
    "--intermediate-size", "1536", "--vocab-size", "100", "--seed", "4", "-o", wide)
for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy(os.path.join(ADD, f), wide)
rss = []
for gc in ((), ("--gradient-checkpointing",)):
    rc, err, kib = run_rss("tidal-sft", "--model-path", wide, "--dataset-path", DATA, "--max-steps", "1",
                           "--per-device-batch-size", "32", "--eval-steps", "0", "--eval-max-samples", "1",
                           "--output-dir", os.path.join(tmp, f"wide-{len(gc)}"), *gc)
    check(rc == 0, f"wide model tidal-sft {' '.join(gc)} runs ({err.strip()[-200:]})")
    rss.append(kib)
print(f"peak RSS without / with --gradient-checkpointing: {rss[0] / 1024:.0f} / {rss[1] / 1024:.0f} MiB")
check(rss[1] < rss[0] - 30 * 1024, f"peak RSS at least 30 MiB lower with it ({rss[0] // 1024} -> {rss[1] // 1024} MiB)")

# 5. refusal; --resume accepts the flag
rc, _, err = run("tidal-sft", "--model-path", ADD, "--dataset-path", DATA, "--max-steps", "1",
                 "--recipe", "sglang-bf16", "--gradient-checkpointing", "--output-dir", os.path.join(tmp, "sg"))
check(rc == 1 and "fused-add" in err and "--gradient-checkpointing" in err,
      f"a fused-add recipe is refused, exit 1 naming why ({rc}: {err.strip()[-200:]})")
first = os.path.join(tmp, "sft-bf16-train-0")
if os.path.isdir(first):
    rc, _, err = run("tidal-sft", "--model-path", ADD, "--dataset-path", DATA, "--max-steps", "3",
                     "--per-device-batch-size", "8", "--learning-rate", "1e-3", "--eval-steps", "0", "--eval-max-samples", "4",
                     "--recipe", "bf16-train", "--output-dir", first, "--resume", "--gradient-checkpointing")
    check(rc == 0, f"--resume with --gradient-checkpointing of a run made without it continues ({err.strip()[-200:]})")

if not failures:
    shutil.rmtree(tmp, ignore_errors=True)
print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
