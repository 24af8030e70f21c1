"""tidal-attribute (issue 15, "which setting to change"): the replay, the game and Shapley.

References: the run file tidal-diff wrote (h5py) for the replay; a numpy recomputation of the
exact Shapley formula over every subset the tool evaluated; the efficiency property of sampled
permutations; tidal-diff's own summary for the one-command mode.
- Replay: with the run's own pair the rescored tokens give the run file's mean |Δlogp| and mean
  KL(B‖A) (to 1e-13 relative: only the order of the final sums differs), i.e. logp_a and logp_b
  are reproduced, not approximated (a different rounding would move them by ~1e-6).
- The structure-only start (A on both paths) is below the pair; add-one-in / leave-one-out are
  the evaluated subsets' values; exact Shapley equals numpy's over 2^n subsets and sums to
  v(all) − v(∅); sampled orders (seeded) sum to it exactly and repeat with the seed.
- Transition bf16 → fp16 pairs: its start is the run's pair; "only the inference side" is the
  evaluated subset of the inference players.
- Errors: a replay-mode run exits 1 naming the mode; no run and no --model/--prompts exits 2;
  the PNG carries the command line.
"""
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError:
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BIN, check, failures  # noqa: E402

ENV = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
MODEL, PROMPTS = "datasets/demo-model", "datasets/demo-prompts.jsonl"


def tool(*args):
    return subprocess.run([os.path.join(BIN, args[0]), *args[1:]], capture_output=True, text=True, env=ENV)


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


def shapley_exact(n, v):
    phi = np.zeros(n)
    for i in range(n):
        for s in range(1 << n):
            if s >> i & 1:
                continue
            k = bin(s).count("1")
            phi[i] += math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n) * (v[s | 1 << i] - v[s])
    return phi


d = tempfile.mkdtemp(prefix="tidal-attr-test-")
run = os.path.join(d, "run.h5")
p = tool("tidal-diff", "--model", MODEL, "--prompts", PROMPTS, "--max-new-tokens", "12", "--batch", "5", "--seed", "3",
         "-o", run, "--json")
check(p.returncode == 0, "tidal-diff run for the attribution")
diff_sum = json.loads(p.stdout)
with h5py.File(run, "r") as f:
    resp = f["tokens/is_prompt"][:] == 0
    want_abs = float(np.mean(np.abs(f["tokens/dlogp"][:][resp])))
    want_kl = float(np.mean(f["tokens/kl_ba"][:][resp]))

png = os.path.join(d, "fig", "attr.png")
p = tool("tidal-attribute", run, "--json", "--plot", png)
check(p.returncode == 0, f"tidal-attribute RUN --json (rc {p.returncode}: {p.stderr[-300:]})")
res = json.loads(p.stdout)
n = len(res["players"])
names = [x["name"] for x in res["players"]]
check(set(names) == {"split_k", "attn_block", "decode_splits", "norm", "rope"},
      f"players are the fields in which bf16-train and bf16-infer differ: {names}")
check(all(x["side"] == "inference" for x in res["players"]), "pair mode: every player is a field of recipe B")
v_abs = {e["mask"]: e["abs_dlogp"] for e in res["evaluated"]}
v_kl = {e["mask"]: e["kl_ba"] for e in res["evaluated"]}
full = (1 << n) - 1
check(len(v_abs) == 1 << n, f"{n} players <= --exact-max 5: every one of 2^{n} subsets evaluated ({len(v_abs)})")
check(rel(v_abs[full], want_abs) < 1e-13, f"replay of the run's own pair = the run file's mean |dlogp| "
      f"({v_abs[full]!r} vs {want_abs!r})")
check(rel(v_kl[full], want_kl) < 1e-13, f"... and its mean KL(B||A) ({v_kl[full]!r} vs {want_kl!r})")
check(res["tokens"] == int(resp.sum()), "every response token of the run rescored")
m = res["abs_dlogp"]
check(m["start"] == v_abs[0] and m["end"] == v_abs[full], "start = v(empty) (structure only), end = v(all)")
check(0 < v_abs[0] < v_abs[full], f"structure-only mismatch {v_abs[0]:.4g} below the pair's {v_abs[full]:.4g}")
for i in range(n):
    check(m["add_one_in"][i] == v_abs[1 << i] and m["leave_one_out"][i] == v_abs[full & ~(1 << i)],
          f"{names[i]}: add-one-in / leave-one-out are v({{i}}) / v(all minus i)")
vv = [v_abs[s] for s in range(1 << n)]
phi = shapley_exact(n, vv)
check(np.allclose(m["shapley"], phi, rtol=1e-12, atol=1e-15), f"exact Shapley = numpy's subset formula {np.round(phi, 6)}")
check(abs(sum(m["shapley"]) - (v_abs[full] - v_abs[0])) < 1e-12, "Shapley values sum to v(all) - v(empty)")
check(abs(sum(m["shapley_share"]) - 1) < 1e-9, "shares sum to 1")

# sampled permutations: efficiency holds exactly, and the seed fixes the result
p1 = tool("tidal-attribute", run, "--json", "--exact-max", "0", "--permutations", "7", "--shapley-seed", "11")
p2 = tool("tidal-attribute", run, "--json", "--exact-max", "0", "--permutations", "7", "--shapley-seed", "11")
r1, r2 = json.loads(p1.stdout), json.loads(p2.stdout)
check(r1["shapley_method"].startswith("sampled") and r1["permutations"] == 7, "--exact-max 0: sampled permutations")
s1 = r1["abs_dlogp"]["shapley"]
check(abs(sum(s1) - (r1["abs_dlogp"]["end"] - r1["abs_dlogp"]["start"])) < 1e-12, "sampled Shapley sums to v(all) - v(empty)")
check(s1 == r2["abs_dlogp"]["shapley"], "same --shapley-seed, same sampled Shapley values")
check(len(r1["evaluated"]) < 1 << n, f"sampled: fewer configurations than 2^n ({len(r1['evaluated'])})")

# the PNG records its command line
with open(png, "rb") as f:
    data = f.read()
check(data[:8] == b"\x89PNG\r\n\x1a\n" and b"command_line" in data and b"tidal-attribute" in data, "bar chart PNG with its command line")

# transition: bf16 pair -> fp16 pair
p = tool("tidal-attribute", run, "--json", "--to-a", "fp16-train", "--to-b", "fp16-infer")
t = json.loads(p.stdout)
tm = t["abs_dlogp"]
check(p.returncode == 0 and t["mode"] == "transition", "transition mode")
check(rel(tm["start"], want_abs) < 1e-13, "transition starts at the run's own pair")
check(tm["end"] < tm["start"] / 3, f"fp16 pair well below the bf16 pair ({tm['end']:.4g} vs {tm['start']:.4g})")
sides = {x["side"] for x in t["players"]}
check(sides == {"training", "inference"}, "players on both sides")
bmask = sum(1 << i for i, x in enumerate(t["players"]) if x["side"] == "inference")
tv = {e["mask"]: e["abs_dlogp"] for e in t["evaluated"]}
check(tm["inference_side_only"] == tv[bmask], f"inference side only = v(inference players) = {tv[bmask]:.4g}")
p = tool("tidal-attribute", run, "--to-b", "fp16-infer", "--to-a", "fp16-train")
check("only the inference side moves" in p.stdout, "the text says what moving only the inference side does")

# one command: the diff job, then the attribution, equals tidal-diff's own run
p = tool("tidal-attribute", "--model", MODEL, "--prompts", PROMPTS, "--max-new-tokens", "12", "--batch", "5", "--seed", "3", "--json")
o = json.loads(p.stdout) if p.returncode == 0 else {}
check(p.returncode == 0 and rel(o["abs_dlogp"]["end"], want_abs) < 1e-13,
      "--model/--prompts runs the same diff job (its pair = tidal-diff's run)")
check(rel(diff_sum["mean_abs_dlogp"], want_abs) < 1e-9, "(tidal-diff --json summary agrees with its file)")

# errors
rollouts = os.path.join(d, "rollouts.jsonl")
with open(rollouts, "w") as f:
    f.write(json.dumps({"prompt_ids": [5, 6, 7], "response_ids": [8, 9], "rollout_logprobs": [-1.0, -2.0]}) + "\n")
replay = os.path.join(d, "replay.h5")
tool("tidal-diff", "--model", MODEL, "--prompts", rollouts, "-o", replay)
p = tool("tidal-attribute", replay)
check(p.returncode == 1 and "replay run" in p.stderr and replay in p.stderr, f"a replay run file: exit 1 naming it ({p.stderr.strip()})")
p = tool("tidal-attribute")
check(p.returncode == 2 and p.stderr.startswith("tidal-attribute: "), "no run and no --model/--prompts: usage error")
p = tool("tidal-attribute", os.path.join(d, "missing.h5"))
check(p.returncode == 1 and "missing.h5" in p.stderr, "a missing run file: exit 1 naming it")
p = tool("tidal-attribute", run, "--prompts", PROMPTS)
check(p.returncode == 2, "--prompts beside a run file: usage error")

shutil.rmtree(d, ignore_errors=True)
if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("tidal-attribute: all checks passed")
