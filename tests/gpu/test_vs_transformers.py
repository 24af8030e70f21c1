#!/usr/bin/env python3
"""tidal on the GPU against transformers on the GPU, same checkpoint, same sequences (run by
tests/gpu/run.sh on the device machine; exit 77 where there is no GPU or no torch/transformers).

For each checkpoint (tidal's trained datasets/models/add, and a Qwen2.5-0.5B-shaped random bf16
checkpoint made by tidal-init), NSEQ random sequences of LEN tokens, teacher-forced log-probs:
  fp32      transformers fp32 (TF32 off, eager) vs tidal --device cuda --recipe fp32:
            every log-prob within 1e-4 (the project's fp32 standard, two fp32 summation orders)
  bf16/fp16 transformers in the dtype, eager and SDPA attention, vs tidal --recipe bf16-train /
            fp16-train on the GPU and on the CPU: mean and max |dlogp| printed (and written to
            $OUT/vs_transformers.txt). Two independent roundings of the same model do not agree
            token by token (each is as far from the other as from fp32, or further), so what is
            required is the magnitude: r = mean |tidal recipe - tidal fp32| / mean |transformers
            dtype - transformers fp32| within [0.5, 2] on the GPU (printed for the CPU too)
Lines go to $OUT/vs_transformers.txt as they are printed (a killed run keeps them).
TIDAL_GPU_TINY=1 with TIDAL_TORCH_DEVICE=cpu (tests/gpu/run.sh's rehearsal on the simulator): a
tiny Qwen2 in place of the 0.5B, 2 sequences of 16 tokens, transformers on the CPU; an attention
implementation this torch lacks (SDPA before torch 2.1.1; fp16 on an old torch's CPU) is skipped
with a message.
"""
import os
import subprocess
import sys

try:
    import torch
    from transformers import AutoModelForCausalLM
except Exception as e:  # noqa: BLE001
    print("skip: torch/transformers unavailable (%s)" % e.__class__.__name__)
    sys.exit(77)
DEV = os.environ.get("TIDAL_TORCH_DEVICE", "cuda")
TINY = os.environ.get("TIDAL_GPU_TINY") == "1"
if DEV.startswith("cuda") and not torch.cuda.is_available():
    print("skip: no CUDA device")
    sys.exit(77)

BUILD = os.environ.get("BUILD", "build")
OUT = os.environ.get("OUT", BUILD)
NSEQ, LEN = (2, 16) if TINY else (4, 96)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
bad = 0
os.makedirs(OUT, exist_ok=True)
LOG = os.path.join(OUT, "vs_transformers.txt")
open(LOG, "w").close()


def say(s):
    print(s)
    with open(LOG, "a") as f:
        f.write(s + "\n")


def tidal_logprobs(model, seq, recipe, device):
    p = subprocess.run([f"{BUILD}/bin/tidal-logprobs", "--model", model, "--tokens", ",".join(map(str, seq)),
                        "--recipe", recipe, "--device", device], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stderr)
    return [float(l.split()[2]) for l in p.stdout.splitlines() if not l.startswith("#")]


def hf_logprobs(model, seqs, dtype, attn):
    try:
        m = AutoModelForCausalLM.from_pretrained(model, dtype=dtype, attn_implementation=attn)
    except TypeError:
        m = AutoModelForCausalLM.from_pretrained(model, torch_dtype=dtype, attn_implementation=attn)
    m = m.to(DEV).eval()
    out = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s]).to(DEV)
            lp = torch.log_softmax(m(ids).logits.float(), -1)[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]
            out.append(lp.cpu().tolist())
    del m
    if DEV.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def dist(a, b):
    d = [abs(x - y) for sa, sb in zip(a, b) for x, y in zip(sa, sb)]
    return sum(d) / len(d), max(d)


qwen = os.path.join(BUILD, "gpu", "tiny-qwen2-bf16" if TINY else "qwen2.5-0.5b-bf16")
init = (["--arch", "qwen2", "--hidden-size", "64", "--num-layers", "2", "--num-heads", "4", "--num-kv-heads", "2",
         "--intermediate-size", "128", "--vocab-size", "512"] if TINY else ["--preset", "qwen2.5-0.5b"])
if not os.path.exists(os.path.join(qwen, "config.json")):
    subprocess.run([f"{BUILD}/bin/tidal-init", *init, "--dtype", "bf16", "--seed", "1",
                    "-o", qwen], check=True, capture_output=True)
for model in ["datasets/models/add", qwen]:
    V = 100 if model.endswith("add") else 512 if TINY else 151936
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(3, min(V, 93), (LEN,), generator=g).tolist() for _ in range(NSEQ)]
    hf32 = hf_logprobs(model, seqs, torch.float32, "eager")
    t32 = [tidal_logprobs(model, s, "fp32", "cuda") for s in seqs]
    m, x = dist(hf32, t32)
    say(f"{model}: fp32 tidal(cuda) vs transformers fp32: mean {m:.3g} max {x:.3g} (limit 1e-4)")
    if x > 1e-4:
        bad += 1
        say("FAIL fp32 beyond 1e-4")
    for dt, recipe in [(torch.bfloat16, "bf16-train"), (torch.float16, "fp16-train")]:
        tg = [tidal_logprobs(model, s, recipe, "cuda") for s in seqs]
        tc = [tidal_logprobs(model, s, recipe, "cpu") for s in seqs]
        for attn in ["eager", "sdpa"]:
            try:
                hf = hf_logprobs(model, seqs, dt, attn)
            except (ImportError, RuntimeError) as e:
                # this torch lacks the implementation: SDPA before torch 2.1.1, fp16 GEMMs on an old
                # torch's CPU (the rehearsal); on the GPU machine's torch that is a failure
                if DEV.startswith("cuda") and not isinstance(e, ImportError):
                    raise
                say(f"{model}: {recipe} vs transformers {attn}: skipped ({str(e).splitlines()[0]})")
                continue
            mg, xg = dist(hf, tg)
            mc, xc = dist(hf, tc)
            hf_shift, _ = dist(hf, hf32)
            rg, rc = dist(tg, t32)[0] / hf_shift, dist(tc, t32)[0] / hf_shift
            say(f"{model}: {recipe} vs transformers {str(dt)[6:]} {attn}: |dlogp| tidal cuda mean {mg:.4g} max {xg:.3g}, "
                f"tidal cpu mean {mc:.4g} max {xc:.3g}; shift from fp32: transformers {hf_shift:.4g}, "
                f"ratio tidal/transformers cuda {rg:.3f} cpu {rc:.3f}")
            if not 0.5 <= rg <= 2.0:
                bad += 1
                say(f"FAIL {recipe} on the GPU moves log-probs {rg:.2f}x as far from fp32 as transformers {attn}")
say(f"{bad} failure(s)")
sys.exit(1 if bad else 0)
