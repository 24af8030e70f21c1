"""The recipe field "router": "fp32" (Megatron-Core's moe_router_dtype fp32, include/tidal/recipe.h):
the router GEMM with fp32 operands and fp32 logits, the logits' gradient left in fp32.

1. Under the fp32 reference it is the identity: {"base": "fp32", "router": "fp32"} against fp32 on
   datasets/models/add-moe, replayed rollouts: logp_a bit for bit.
2. Under bf16-train it takes effect: the same replay, logp_a differs from bf16-train's somewhere and
   by little (the router's logits lose their bf16 rounding; the experts and the stream are as
   before): 0 < max |d| and mean |d| < 0.05 nats. The recipe prints back with "router": "fp32" and
   --list-recipes' presets never carry it.
3. Training: tests/helpers/train_probe's first bf16-train step with and without the field: the loss
   is the same (the forward's loss reads the same logits' routing on this batch) or close, every
   router gradient changes (its logits' gradient is no longer rounded to bf16) and the expert
   gradients stay finite.
4. tidal-attribute between bf16-train and the same with the field: one player, "router" (the field
   is printed only when "fp32", yet compared from both sides).
5. A bad value ("router": "fp16") exits 1 naming the field.
"""
import json
import os
import sys
import tempfile

import numpy as np

try:
    import h5py
    from safetensors.numpy import load_file
except ImportError:
    print("h5py or safetensors not installed: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BUILD, check, failures, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "datasets/models/add-moe")
tmp = tempfile.mkdtemp(prefix="tidal-router-fp32-")
rng = np.random.default_rng(2)
ROLL = os.path.join(tmp, "roll.jsonl")
with open(ROLL, "w") as f:
    for _ in range(6):
        f.write(json.dumps({"prompt_ids": rng.integers(3, 100, 8).tolist(), "response_ids": rng.integers(3, 100, 20).tolist(),
                            "rollout_logprobs": [-1.0] * 20}) + "\n")


def recipe(name, body):
    path = os.path.join(tmp, name + ".json")
    json.dump(dict(body, name=name), open(path, "w"))
    return path


def logp(rec):
    out = os.path.join(tmp, os.path.basename(rec).replace(".json", "") + ".h5")
    run("tidal-diff", "--model", MODEL, "--prompts", ROLL, "--recipe-a", rec, "--recipe-b", "fp32", "-o", out)
    with h5py.File(out) as f:
        return f["tokens/logp_a"][:], dict(f.attrs)


f32r = recipe("fp32-router-fp32", {"base": "fp32", "router": "fp32"})
bfr = recipe("bf16-train-router-fp32", {"base": "bf16-train", "router": "fp32"})
a, _ = logp("fp32")
b, _ = logp(f32r)
check(np.array_equal(a, b), "router fp32 under the fp32 reference: logp_a bit for bit fp32's")
c, _ = logp("bf16-train")
d, attrs = logp(bfr)
diff = np.abs(c - d)
check(diff.max() > 0 and diff.mean() < 0.05,
      f"router fp32 under bf16-train takes effect: max |d logp_a| {diff.max():.2e}, mean {diff.mean():.2e} (< 0.05)")
rj = attrs.get("recipe_a")
rj = rj.decode() if isinstance(rj, bytes) else rj
check(rj is not None and '"router":"fp32"' in rj, f"the run file's recipe_a carries \"router\": \"fp32\" ({str(rj)[-60:]})")
p = run("tidal-diff", "--list-recipes")
check(p.returncode == 0 and '"router"' not in p.stdout, "no preset carries the field (the default prints nothing)")

# 3. the first training step
probe = os.path.join(BUILD, "tests", "helpers", "train_probe")
batch = os.path.join(tmp, "batch.json")
json.dump({"tokens": [rng.integers(3, 100, n).tolist() for n in (12, 30, 21)],
           "mask": [[1] * (n - 1) for n in (12, 30, 21)]}, open(batch, "w"))
grads = []
for rec in ("bf16-train", bfr):
    dump = os.path.join(tmp, f"g{len(grads)}.safetensors")
    import subprocess
    q = subprocess.run([probe, "--model", MODEL, "--batch", batch, "--recipe", rec, "--dump-grads", dump],
                       capture_output=True, text=True)
    if q.returncode:
        print(q.stdout, q.stderr)
        raise SystemExit("train_probe failed")
    grads.append((float(q.stdout.split()[3]), load_file(dump)))
(l0, g0), (l1, g1) = grads
routers = [k for k in g0 if k.endswith("mlp.gate.weight")]
moved = [float(np.abs(g0[k] - g1[k]).max() / max(np.abs(g0[k]).max(), 1e-30)) for k in routers]
finite = all(np.isfinite(g1[k]).all() for k in g1)
check(abs(l0 - l1) <= 1e-2 * abs(l0) and len(routers) == 4 and min(moved) > 0 and finite,
      f"bf16-train step with router fp32: loss {l1:.6f} vs {l0:.6f}; every router's gradient changed (least "
      f"{min(moved):.2e} relative, {len(routers)} routers); all gradients finite")

# 4. tidal-attribute sees the field (a default that td_recipe_to_json leaves out on one side is still a player)
p = run("tidal-attribute", "--model", MODEL, "--prompts", os.path.join(ROOT, "datasets/models/prompts-add.jsonl"),
        "--recipe-a", "bf16-train", "--recipe-b", bfr, "--max-new-tokens", "8", "--json")
players = []
if p.returncode == 0:
    players = [x["name"] for x in json.loads(p.stdout)["players"]]
check(players == ["router"], f"tidal-attribute bf16-train vs router fp32: the one player is router ({players})")

bad = recipe("bad", {"base": "bf16-train", "router": "fp16"})
p = run("tidal-diff", "--model", MODEL, "--prompts", ROLL, "--recipe-a", bad, "--recipe-b", "fp32",
        "-o", os.path.join(tmp, "bad.h5"), ok=False)
check(p.returncode in (1, 2) and "router" in p.stderr and "bad.json" in p.stderr,
      f"\"router\": \"fp16\" refused naming the file and field ({p.stderr.strip()[-120:]})")
sys.exit(1 if failures else 0)
