"""Planted outlier channels (tidal-init --outlier-channels) and FP16 headroom (tidal-headroom).

References: the safetensors files themselves, read with numpy (a checkpoint without outliers
from the same seed is the reference for every tensor); numpy's own RMSNorm of the embedding rows
for the first op outputs tidal-headroom reports; IEEE half limits (np.float16: max 65504, min
normal 2^-14).
- The planted checkpoint records it: tidal_synthetic, the channels, the scale, the site and the
  command line in the safetensors metadata; channels are those the seed draws, the same in
  every layer.
- Site norm: input_layernorm / post_attention_layernorm weights are the plain ones times S on
  those channels (fp32 products), q/k/v and gate/up input columns times 1/S, every other tensor
  bit-identical: the same function, so fp32 log-probs agree within rounding.
- tidal-headroom: the plain checkpoint is FP16-safe; with 1e5 planted it is not, and the
  overflowing op outputs are the norms; embed_tokens' and layer 0 input_layernorm's largest
  |x| and overflow counts equal numpy's over the same tokens; --run reads a run's tokens.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BIN, check, failures  # noqa: E402

ENV = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))


def tool(*args):
    return subprocess.run([os.path.join(BIN, args[0]), *args[1:]], capture_output=True, text=True, env=ENV)


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    meta = h.pop("__metadata__", {})
    t = {}
    for k, m in h.items():
        a, b = m["data_offsets"]
        assert m["dtype"] == "F32"
        t[k] = np.frombuffer(data[a:b], dtype=np.float32).reshape(m["shape"])
    return meta, t


d = tempfile.mkdtemp(prefix="tidal-outliers-test-")
SHAPE = ["--arch", "qwen2", "--hidden", "96", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--intermediate", "160",
         "--vocab", "64", "--embed-std", "0.2", "--dtype", "f32", "--seed", "5"]
S = 1e5
plain, planted, emb = (os.path.join(d, x) for x in ("plain", "planted", "embed"))
check(tool("tidal-init", *SHAPE, "-o", plain).returncode == 0, "tidal-init plain")
p = tool("tidal-init", *SHAPE, "--outlier-channels", "3", "--outlier-scale", str(S), "-o", planted)
check(p.returncode == 0, "tidal-init --outlier-channels 3 --outlier-scale 1e5")
check(tool("tidal-init", *SHAPE, "--outlier-channels", "2", "--outlier-scale", "1000", "--outlier-site", "embed", "-o", emb).returncode == 0,
      "tidal-init --outlier-site embed")
p = tool("tidal-init", *SHAPE, "--outlier-channels", "97", "-o", os.path.join(d, "never"))
check(p.returncode == 2 and "--outlier-channels" in p.stderr, "more channels than the hidden size: usage error")

m0, t0 = load(os.path.join(plain, "model.safetensors"))
m1, t1 = load(os.path.join(planted, "model.safetensors"))
check("tidal_synthetic" not in m0, "no planting, no synthetic mark")
check("planted" in m1.get("tidal_synthetic", "") and m1.get("tidal_outlier_site") == "norm"
      and float(m1.get("tidal_outlier_scale", 0)) == S and "--outlier-channels 3" in m1.get("tidal_command", ""),
      f"metadata marks the outliers as planted and records the command: {m1.get('tidal_synthetic')!r}")
ch = [int(c) for c in m1["tidal_outlier_channels"].split(",")]
check(len(ch) == 3 and len(set(ch)) == 3 and all(0 <= c < 96 for c in ch), f"3 distinct channels {ch}")
others = [c for c in range(96) if c not in ch]
ok_norm = ok_cols = ok_rest = True
for k, a in t0.items():
    b = t1[k]
    if "layernorm" in k:
        ok_norm &= np.array_equal(b[ch], a[ch] * np.float32(S)) and np.array_equal(b[others], a[others])
    elif any(x in k for x in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")):
        ok_cols &= np.array_equal(b[:, ch], a[:, ch] * np.float32(1 / S)) and np.array_equal(b[:, others], a[:, others])
    else:
        ok_rest &= np.array_equal(a, b)
check(ok_norm, "norm weights: the planted channels times S, the rest unchanged")
check(ok_cols, "q/k/v and gate/up input columns of those channels times 1/S")
check(ok_rest, "every other tensor bit-identical to the plain checkpoint")
me, te = load(os.path.join(emb, "model.safetensors"))
che = [int(c) for c in me["tidal_outlier_channels"].split(",")]
e0 = t0["model.embed_tokens.weight"]
check(np.array_equal(te["model.embed_tokens.weight"][:, che], e0[:, che] * np.float32(1000))
      and np.array_equal(te["model.layers.0.input_layernorm.weight"], t0["model.layers.0.input_layernorm.weight"]),
      "site embed: the embedding's columns scaled, the norms not")

toks = "1,7,9,20,33,41,5,8,60,2,11,13"
lp = []
for mdl in (plain, planted):
    p = tool("tidal-logprobs", "--model", mdl, "--tokens", toks)
    lp.append(np.array([float(l.split()[2]) for l in p.stdout.strip().splitlines() if not l.startswith("#")]))
check(np.max(np.abs(lp[0] - lp[1])) < 1e-3, f"fp32 log-probs: the planted model computes the same function "
      f"(max diff {np.max(np.abs(lp[0] - lp[1])):.2e})")

# ---- tidal-headroom
prompts = os.path.join(d, "p.jsonl")
rng = np.random.default_rng(4)
seqs = [rng.integers(0, 64, int(rng.integers(4, 20))).tolist() for _ in range(11)]
with open(prompts, "w") as f:
    for s in seqs:
        f.write(json.dumps({"tokens": s}) + "\n")
p = tool("tidal-headroom", "--model", plain, "--prompts", prompts, "--json")
h0 = json.loads(p.stdout)
check(p.returncode == 0 and h0["fp16_safe"] and all(r["overflow"] == 0 for r in h0["ops"]), "plain checkpoint: FP16-safe")
p = tool("tidal-headroom", "--model", planted, "--prompts", prompts, "--json")
h1 = json.loads(p.stdout)
check(p.returncode == 0 and not h1["fp16_safe"], "1e5 planted: not FP16-safe")
over = {(r["layer"], r["name"]) for r in h1["ops"] if r["overflow"]}
check({(l, n) for l in range(2) for n in ("input_layernorm", "post_attention_layernorm")} <= over,
      f"the overflowing op outputs include both norms of every layer: {sorted(over)}")
check(any(w["name"] == "input_layernorm.weight" and w["above_max"] == 6 for w in h1["weights"]),
      "weights: the 3 planted norm weights of 2 layers are above 65504")
# numpy reference for the first ops: embedding rows and layer 0's input RMSNorm (fp32 as HF computes it)
x = np.concatenate([e0[s] for s in seqs])              # (tokens, C), the planted model's embedding = plain's
row = {(r["layer"], r["name"]): r for r in h1["ops"]}
emb_row = row[(-1, "embed_tokens")]
check(emb_row["count"] == x.size and emb_row["max_abs"] == float(np.max(np.abs(x))), "embed_tokens: count and max |x| = numpy's")
g = t1["model.layers.0.input_layernorm.weight"]
xn = (x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6)).astype(np.float32) * g
n0 = row[(0, "input_layernorm")]
check(abs(n0["max_abs"] - float(np.max(np.abs(xn)))) <= 1e-5 * float(np.max(np.abs(xn))),
      f"layer 0 input_layernorm max |x| {n0['max_abs']:.6g} = numpy's {float(np.max(np.abs(xn))):.6g}")
with np.errstate(over="ignore"):
    n_inf16 = int(np.sum(np.isinf(xn.astype(np.float16))))
check(abs(n0["overflow"] - int(np.sum(np.abs(xn) >= 65520))) <= 1 and n0["overflow"] == n_inf16 and n0["overflow"] > 0,
      f"... overflow count {n0['overflow']} = numpy's {int(np.sum(np.abs(xn) >= 65520))} (values that become inf in float16: "
      f"{n_inf16})")
sub = int(np.sum((np.abs(x) < 2.0 ** -14) & (x != 0)))
check(emb_row["subnormal"] == sub, f"embed_tokens below FP16's normal range: {emb_row['subnormal']} = numpy's {sub}")
p = tool("tidal-headroom", "--model", planted, "--prompts", prompts)
check(p.returncode == 0 and "NOT SAFE" in p.stdout and "input_layernorm" in p.stdout, "the text verdict names the problem")
p = tool("tidal-headroom", "--model", emb, "--prompts", prompts, "--json")
he = json.loads(p.stdout)
re_ = {(r["layer"], r["name"]): r for r in he["ops"]}
check(re_[(0, "residual (+attn)")]["max_abs"] > 100, "site embed: the residual stream carries the planted channels")
# --run: a run's prompt + response tokens
run = os.path.join(d, "run.h5")
tool("tidal-diff", "--model", plain, "--prompts", prompts, "--max-new-tokens", "6", "-o", run)
p = tool("tidal-headroom", "--run", run, "--json")
hr = json.loads(p.stdout) if p.returncode == 0 else {}
check(p.returncode == 0 and hr["tokens"] > sum(len(s) for s in seqs), "--run: the run's prompts and responses (more tokens)")
p = tool("tidal-headroom", "--model", plain, "--prompts", prompts, "--run", run)
check(p.returncode == 2, "--prompts with --run: usage error")
p = tool("tidal-headroom", "--model", plain, "--prompts", os.path.join(d, "nope.jsonl"))
check(p.returncode == 1 and "nope.jsonl" in p.stderr, "a missing prompts file: exit 1 naming it")

shutil.rmtree(d, ignore_errors=True)
if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("outliers and headroom: all checks passed")
