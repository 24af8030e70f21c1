"""--device: where the forward runs (issue 17). What this checks depends on the machine, and it
says which case it ran:

* every machine: a bad device name is a usage error (exit 2, the one message format) in every
  tool that has the option; the help lists the option.
* no usable GPU (no CUDA in the build, no driver, no device): --device cuda exits 1 with a
  message that says why and what to do, before any result is written; an existing run file
  given to tidal-diff with --force is left exactly as it was.
* an NVIDIA GPU (the device machine of tests/gpu): the fp32 recipe on the GPU gives every
  log-prob within 1e-4 of the CPU's, teacher-forced and through the KV cache (the project's fp32
  standard), and tidal-diff records the device in its run file.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import check, failures, run  # noqa: E402

MODEL = "datasets/models/add"
TOKENS = "1,5,9,14,3,22,7,31,12,4,8,40,2,17"


def have_gpu():
    if not shutil.which("nvidia-smi"):
        return False
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return p.returncode == 0 and "GPU" in p.stdout


def logprobs(device, *extra):
    p = run("tidal-logprobs", "--model", MODEL, "--tokens", TOKENS, "--device", device, *extra)
    return [float(l.split()[2]) for l in p.stdout.splitlines() if not l.startswith("#")]


for tool in ["tidal-diff", "tidal-logprobs", "tidal-bench-model"]:
    p = run(tool, "--model", MODEL, "--device", "gpu0", ok=False)
    check(p.returncode == 2 and f"{tool}: --device: expected cpu, cuda or cuda:N, got 'gpu0'" in p.stderr,
          f"{tool} --device gpu0: usage error (exit 2) naming the option and the accepted names")
    h = run(tool, "--help")
    check("--device DEV" in h.stdout, f"{tool} --help lists --device")

gpu = have_gpu()
tmp = tempfile.mkdtemp()
if not gpu:
    print("no NVIDIA GPU here: checking that --device cuda fails cleanly")
    p = run("tidal-logprobs", "--model", MODEL, "--tokens", TOKENS, "--device", "cuda", ok=False)
    why = p.stderr.strip()
    print("  tidal-logprobs says:", why)
    check(p.returncode == 1 and p.stdout == "", "tidal-logprobs --device cuda without a GPU: exit 1, nothing printed")
    check(("built without CUDA" in why and "--device cpu" in why) or
          ("no CUDA device can be used here" in why and "--device cpu" in why),
          "the message says why (no CUDA in the build / no device) and what to do")
    # a finished run file is not touched by a run that cannot start
    out = os.path.join(tmp, "run.h5")
    prompts = os.path.join(tmp, "p.jsonl")
    with open(prompts, "w") as f:
        f.write('{"tokens": [1, 5, 9]}\n')
    run("tidal-diff", "--model", MODEL, "--prompts", prompts, "-o", out, "--max-new-tokens", "2")
    before = hashlib.sha256(open(out, "rb").read()).hexdigest()
    p = run("tidal-diff", "--model", MODEL, "--prompts", prompts, "-o", out, "--max-new-tokens", "2",
            "--force", "--device", "cuda:0", ok=False)
    after = hashlib.sha256(open(out, "rb").read()).hexdigest()
    check(p.returncode == 1 and before == after and "--device" in p.stderr,
          "tidal-diff --force --device cuda:0 without a GPU: exit 1, the finished run file unchanged")
else:
    print("NVIDIA GPU present: fp32 on the GPU against the CPU")
    for extra in [(), ("--decode",)]:
        a, b = logprobs("cpu", *extra), logprobs("cuda", *extra)
        d = max(abs(x - y) for x, y in zip(a, b))
        print(f"  fp32 {'decode' if extra else 'teacher-forced'}: max |dlogp| GPU vs CPU {d:.3g}")
        check(len(a) == len(b) == len(TOKENS.split(",")) - 1 and d <= 1e-4,
              f"fp32 {'decode' if extra else 'teacher-forced'} log-probs on the GPU within 1e-4 of the CPU")
    prompts = os.path.join(tmp, "p.jsonl")
    with open(prompts, "w") as f:
        f.write('{"tokens": [1, 5, 9]}\n')
    out = os.path.join(tmp, "gpu.h5")
    run("tidal-diff", "--model", MODEL, "--prompts", prompts, "-o", out, "--max-new-tokens", "4", "--device", "cuda")
    import runfile_read   # h5py, or tidal-export where the GPU machine's python has no h5py
    dev = str(runfile_read.attrs(out, ["device"]).get("device", ""))
    check(dev.startswith("cuda:0 ("), f"the run file records the device ({dev})")

shutil.rmtree(tmp)
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
