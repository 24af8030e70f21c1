"""Batch invariance and thread-count determinism of tidal-diff runs, checked with h5py (issue 15).

228 prompts (the 32 demo prompts and 196 random ones), 8 generated tokens each, on the demo
model. Each run file's per-prompt rows (/seqs keyed by prompt_index, /tokens keyed by prompt and
position: sampled tokens, both log-probs, every metric) are compared bit for bit.

1. A recipe pair that claims batch_invariant (bf16-train and bf16-infer with it set) gives the
   same bits at --batch 1, 8 and 228, with 1 and 2 threads, and as --shard 0/3, 1/3, 2/3 merged
   by tidal-merge: a row does not depend on the batch, the shard or the thread count.
2. Every recipe gives the same bits for any thread count: bf16-train / bf16-infer, fp32 / fp32
   and bf16-train / fp8-rollout at --batch 8 with 1 and 2 threads.
3. The recipes that do not claim it do depend on the batch (recipe.h documents how): the
   bf16 pair at --batch 8 vs 228 differs somewhere, so test 1 can tell invariance from luck.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

try:
    import h5py
except ImportError:
    print("h5py not installed: skipped")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, os.environ.get("BUILD", "build"), "bin")
MODEL = os.path.join(ROOT, "datasets", "demo-model")


def rows(path):
    """The run's per-prompt content, in prompt order, without batch bookkeeping."""
    with h5py.File(path, "r") as f:
        pi = f["seqs/prompt_index"][()]
        key = pi[f["tokens/seq"][()]] * 100000 + f["tokens/pos"][()]
        to, so = np.argsort(key, kind="stable"), np.argsort(pi, kind="stable")
        out = {"tokens/" + n: f["tokens/" + n][()][to] for n in f["tokens"] if n != "seq"}
        out.update({"seqs/" + n: f["seqs/" + n][()][so] for n in f["seqs"]
                    if n not in ("batch", "token_offset", "tokens_offset", "text_offset")})
        if "text" in f:   # the stored text of each sequence, not where it sits in /text/utf8
            utf8, off = f["text/utf8"][()], f["seqs/text_offset"][()]
            ln = f["seqs/prompt_text_len"][()] + f["seqs/response_text_len"][()]
            out["text"] = np.array([utf8[off[i]:off[i] + ln[i]].tobytes() for i in so], dtype=object)
    return out


def differences(a, b):
    def same(x, y):
        if x.dtype == object or y.dtype == object:
            return x.shape == y.shape and all(p == q for p, q in zip(x, y))
        return x.shape == y.shape and x.tobytes() == y.tobytes()
    return [k for k in a if k not in b or not same(a[k], b[k])]


def main():
    tmp = tempfile.mkdtemp(prefix="tidal-bi-")
    demo = [json.loads(l) for l in open(os.path.join(ROOT, "datasets", "demo-prompts.jsonl"))]
    rng = random.Random(3)
    prompts = os.path.join(tmp, "p228.jsonl")
    with open(prompts, "w") as f:
        for i in range(228):
            p = demo[i] if i < len(demo) else {"tokens": [rng.randrange(3, 100) for _ in range(rng.choice([3, 9, 17]))]}
            f.write(json.dumps(p) + "\n")
    recipes = {}
    for side, base in (("a", "bf16-train"), ("b", "bf16-infer")):
        recipes[side] = os.path.join(tmp, f"bi-{side}.json")
        with open(recipes[side], "w") as f:
            json.dump({"base": base, "batch_invariant": True}, f)

    def run(name, a, b, batch, threads, *extra):
        out = os.path.join(tmp, name + ".h5")
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
        subprocess.run([os.path.join(BIN, "tidal-diff"), "--model", MODEL, "--prompts", prompts,
                        "--recipe-a", a, "--recipe-b", b, "--max-new-tokens", "8", "--batch", str(batch),
                        "--seed", "1", "-o", out, "--force", *extra],
                       env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return out

    failed = 0
    # 1. batch-invariant pair: batches 1, 8, 228; threads 1, 2; shards 1 and 3
    ref = rows(run("bi-b228-t2", recipes["a"], recipes["b"], 228, 2))
    for batch in (1, 8, 228):
        for threads in (1, 2):
            if (batch, threads) == (228, 2):
                continue
            d = differences(ref, rows(run(f"bi-b{batch}-t{threads}", recipes["a"], recipes["b"], batch, threads)))
            if d:
                print(f"FAIL batch-invariant pair, batch {batch}, {threads} threads: {d} differ from batch 228, 2 threads")
                failed += 1
    parts = [run(f"bi-shard{k}", recipes["a"], recipes["b"], 8, 2, "--shard", f"{k}/3") for k in range(3)]
    merged = os.path.join(tmp, "bi-merged.h5")
    subprocess.run([os.path.join(BIN, "tidal-merge"), "-o", merged, "--force", *parts], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    d = differences(ref, rows(merged))
    if d:
        print(f"FAIL batch-invariant pair, 3 shards merged: {d} differ")
        failed += 1
    print(f"batch-invariant pair: batches 1/8/228 x threads 1/2 and 3 shards merged checked, 228 prompts, {ref['tokens/dlogp'].size} tokens")
    # 2. every recipe: thread-count independent
    for a, b in (("bf16-train", "bf16-infer"), ("fp32", "fp32"), ("bf16-train", "fp8-rollout")):
        one = rows(run(f"{a}-{b}-t1", a, b, 8, 1))
        d = differences(one, rows(run(f"{a}-{b}-t2", a, b, 8, 2)))
        if d:
            print(f"FAIL {a}/{b}: 1 vs 2 threads: {d} differ")
            failed += 1
    # 3. without batch_invariant, the batch shows
    d = differences(rows(run("bf16-train-bf16-infer-t2", "bf16-train", "bf16-infer", 8, 2)),
                    rows(run("plain-b228", "bf16-train", "bf16-infer", 228, 2)))
    if not d:
        print("FAIL bf16-train/bf16-infer gave the same bits at batch 8 and 228: the invariance test cannot tell")
        failed += 1
    print("ok" if not failed else f"{failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
