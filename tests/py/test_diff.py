"""tidal-diff end to end, checked with h5py (an independent reader of the run files).

1. fp32 training path vs fp32 inference path agree to 1e-4 in log-prob on every token (the
   project's invariant), for each architecture, prompt tokens scored too.
2. The file layout (datasets, dtypes, ranks) equals tests/fixtures/run_schema_v1.txt, the
   written-down schema of reports/SCHEMA.md; root attributes are present and recipes parse.
3. Internal consistency: dlogp = logp_b - logp_a; k3 from the two log-probs; offsets of /seqs
   point at the right rows; KL >= -1e-6; sequences reproduce from the seed.
4. --resume after a cut-off (the file cut back to 2 completed batches plus a half-written
   third) completes it identical to the uninterrupted run, bit for bit.
5. Replay of rollouts (prompt_ids, response_ids, rollout_logprobs) taken from a run gives the
   same training-path log-probs as the run itself, and the recorded ones as logp_b.
6. Bad input: clear message naming the file (and line), non-zero exit, existing files kept.
7. tidal-merge of --shard 0/2 and 1/2 holds every prompt once with consistent offsets.
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
except ImportError:
    print("h5py not installed: skipped")
    sys.exit(77)

from tidal_check import BIN, BUILD, check, failures, run  # noqa: E402
HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = os.path.join(HERE, "..", "fixtures", "run_schema_v1.txt")




def write_prompts(path, n, vocab, seed, lo=3, hi=20):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"tokens": rng.integers(0, vocab, rng.integers(lo, hi)).tolist()}) + "\n")


def layout(path):
    rows = []
    with h5py.File(path) as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                rows.append(f"/{name} {obj.dtype.str} {obj.ndim}")
        f.visititems(visit)
    return sorted(rows)


tmp = tempfile.mkdtemp(prefix="tidal-diff-test-")
try:
    # ---- 1. fp32 vs fp32, every architecture
    for arch in ["llama", "mistral", "qwen2", "qwen3"]:
        d = os.path.join(tmp, arch)
        run("tidal-init", "--arch", arch, "--preset", "tiny", "--seed", "3", "-o", d)
        write_prompts(os.path.join(tmp, "p.jsonl"), 6, 512, 1)
        out = os.path.join(tmp, f"fp32_{arch}.h5")
        run("tidal-diff", "--model", d, "--prompts", os.path.join(tmp, "p.jsonl"), "--recipe-a", "fp32",
            "--recipe-b", "fp32", "-o", out, "--max-new-tokens", "24", "--batch", "4", "--score-prompt",
            "--seed", "5", "--layers")
        with h5py.File(out) as f:
            d_ = np.abs(f["tokens/dlogp"][:])
            n = len(d_)
            check(n > 100 and d_.max() <= 1e-4,
                  f"{arch}: fp32 train vs fp32 infer: max |dlogp| {d_.max():.2e} <= 1e-4 on all {n} tokens")
            rel = f["layers/rel_err"][:]
            check(rel.shape == (n, 2) and rel.dtype == np.float32 and rel.max() <= 1e-5,
                  f"{arch}: --layers: /layers/rel_err {rel.shape}, fp32 paths max {rel.max():.1e} <= 1e-5")

    model = os.path.join(tmp, "qwen2")
    prompts = os.path.join(tmp, "p40.jsonl")
    write_prompts(prompts, 10, 512, 2)
    ref = os.path.join(tmp, "ref.h5")
    args = ["--model", model, "--prompts", prompts, "--recipe-a", "bf16-train", "--recipe-b", "bf16-infer",
            "--max-new-tokens", "16", "--batch", "3", "--seed", "11", "--temperature", "0.9", "--top-p", "0.95"]
    run("tidal-diff", *args, "-o", ref)

    lay = os.path.join(tmp, "layers_bf16.h5")
    run("tidal-diff", "--model", model, "--prompts", os.path.join(tmp, "p.jsonl"), "-o", lay, "--layers",
        "--max-new-tokens", "8")
    with h5py.File(lay) as f:
        rel = f["layers/rel_err"][:]
        check(rel.min() > 0 and rel.max() < 0.1, f"--layers bf16-train vs bf16-infer: rel_err in (0, 0.1): {rel.mean(0)}")

    # ---- 2. layout
    have = layout(ref)
    with open(SCHEMA) as f:
        want = sorted(l.strip() for l in f if l.strip() and not l.startswith("#"))
    check(have == want, "dataset layout equals tests/fixtures/run_schema_v1.txt"
          + ("" if have == want else f": extra {set(have) - set(want)}, missing {set(want) - set(have)}"))
    with h5py.File(ref) as f:
        a = f.attrs
        for k in ["format", "schema_version", "tool_version", "command_line", "model_path", "model_fingerprint",
                  "recipe_a", "recipe_b", "seed", "sampling"]:
            check(k in a, f"root attribute {k}")
        check(a["format"] == "tidal-run" and int(a["schema_version"]) == 1, "format tidal-run, schema 1")
        check("tidal-diff" in a["command_line"] and "--recipe-a bf16-train" in a["command_line"], "command line recorded")
        check(json.loads(a["recipe_b"])["name"] == "bf16-infer", "recipe_b JSON parses")
        check(json.loads(a["sampling"])["top_p"] == 0.95, "sampling JSON parses")

        # ---- 3. consistency
        t = {k: f["tokens"][k][:] for k in f["tokens"]}
        s = {k: f["seqs"][k][:] for k in f["seqs"]}
        pt = f["prompts/tokens"][:]
        check(np.array_equal(t["dlogp"], t["logp_b"] - t["logp_a"]), "dlogp == logp_b - logp_a")
        r = t["logp_a"] - t["logp_b"]
        check(np.allclose(t["k3"], np.expm1(r) - r, rtol=1e-9, atol=1e-15), "k3 == e^r - 1 - r")
        check((t["kl_ba"] > -1e-6).all() and (t["kl_ab"] > -1e-6).all(), "KL >= 0 (up to rounding)")
        check(((t["tv"] >= -1e-12) & (t["tv"] <= 1 + 1e-9)).all(), "TV in [0, 1]")
        ok = True
        for i in range(len(s["prompt_index"])):
            o, n = s["token_offset"][i], s["n_scored"][i]
            ok &= bool((t["seq"][o:o + n] == i).all())
            to, L = s["tokens_offset"][i], s["prompt_len"][i] + s["response_len"][i]
            ok &= bool((pt[to:to + L][t["pos"][o:o + n]] == t["token"][o:o + n]).all())
        check(ok, "/seqs offsets point at their /tokens rows and /prompts/tokens ids")
        check(sorted(s["prompt_index"]) == list(range(10)), "every prompt once")
    again = os.path.join(tmp, "again.h5")
    run("tidal-diff", *args, "-o", again)
    with h5py.File(ref) as f, h5py.File(again) as g:
        same = all(np.array_equal(f[p][:], g[p][:], equal_nan=True) for p in ["tokens/token", "tokens/logp_a", "tokens/logp_b"])
    check(same, "same seed -> same tokens and log-probs")

    # ---- 4. resume after a cut-off: keep 2 batches, leave half of the third's rows behind
    cut = os.path.join(tmp, "cut.h5")
    shutil.copy(ref, cut)
    with h5py.File(cut, "a") as f:
        seq_rows, tok_rows, p_rows = (int(f["progress"][k][1]) for k in ["seq_rows", "token_rows", "prompt_rows"])
        def cut_group(g, n):
            for k in f[g]:
                f[g][k].resize((n,) + f[g][k].shape[1:])
        cut_group("progress", 2)
        cut_group("seqs", seq_rows + 1)        # a half-written batch: rows past the last /progress
        cut_group("tokens", tok_rows + 5)
        cut_group("prompts", p_rows + 3)
    run("tidal-diff", *args, "-o", cut, "--resume")
    with h5py.File(ref) as f, h5py.File(cut) as g:
        paths = [f"{grp}/{k}" for grp in ["tokens", "seqs", "prompts", "progress"] for k in f[grp]]
        same = all(f[p].shape == g[p].shape and np.array_equal(f[p][:], g[p][:], equal_nan=True) for p in paths)
    check(same, f"--resume completes the cut file identical to the uninterrupted run ({len(paths)} datasets)")
    p = run("tidal-diff", *args, "-o", cut, "--resume", "--seed", "12", "--top-p", "0.9", ok=False)
    named = [ln.strip() for ln in p.stderr.splitlines() if ln.startswith("  --")]
    check(p.returncode == 1 and named == ["--top-p: run has 0.95, command gives 0.9", "--seed: run has 11, command gives 12"],
          f"--resume with another seed and top-p is refused, naming just those two with both values ({named})")

    # ---- 5. replay rollouts taken from the run
    rolls = os.path.join(tmp, "rollouts.jsonl")
    with h5py.File(ref) as f, open(rolls, "w") as out:
        t = {k: f["tokens"][k][:] for k in ["seq", "logp_a", "logp_b"]}
        s = {k: f["seqs"][k][:] for k in f["seqs"]}
        pt = f["prompts/tokens"][:]
        order = np.argsort(s["prompt_index"])
        for i in order:
            to, P, R = s["tokens_offset"][i], s["prompt_len"][i], s["response_len"][i]
            o, n = s["token_offset"][i], s["n_scored"][i]
            out.write(json.dumps({"prompt_ids": pt[to:to + P].tolist(), "response_ids": pt[to + P:to + P + R].tolist(),
                                  "rollout_logprobs": t["logp_b"][o:o + n].tolist()}) + "\n")
    rep = os.path.join(tmp, "replay.h5")
    run("tidal-diff", "--model", model, "--prompts", rolls, "--recipe-a", "bf16-train", "-o", rep, "--batch", "3")
    with h5py.File(ref) as f, h5py.File(rep) as g:
        check(g.attrs["mode"] == "replay", "replay mode recorded")
        check(np.array_equal(f["tokens/logp_a"][:], g["tokens/logp_a"][:]), "replay: training-path log-probs identical to the run's")
        check(np.allclose(f["tokens/logp_b"][:], g["tokens/logp_b"][:], rtol=0, atol=1e-6), "replay: logp_b = recorded rollout log-probs")
        check(np.isnan(g["tokens/kl_ba"][:]).all(), "replay: no full-vocabulary KL without B's distribution (NaN)")

    # ---- 6. bad input
    def bad(label, argv, *needles, prompts_text=None, keep=None):
        if prompts_text is not None:
            with open(os.path.join(tmp, "bad.jsonl"), "w") as f:
                f.write(prompts_text)
        before = open(keep, "rb").read() if keep else None
        p = run("tidal-diff", *argv, ok=False)
        msg = p.stderr
        good = p.returncode != 0 and all(n in msg for n in needles) and "Segmentation" not in msg
        if keep:
            good &= open(keep, "rb").read() == before
        check(good, f"bad input: {label}" + ("" if good else f" (exit {p.returncode}: {msg.strip()[-300:]})"))

    badp = os.path.join(tmp, "bad.jsonl")
    base = ["--model", model, "--prompts", badp, "-o", os.path.join(tmp, "bad.h5"), "--force", "--max-new-tokens", "4"]
    bad("malformed JSONL line", base, "bad.jsonl:2", prompts_text='{"tokens":[1,2]}\n{"tokens":[1,2\n{"tokens":[3]}\n')
    p = run("tidal-diff", *base, "--skip-bad-lines", ok=False)
    check(p.returncode == 0 and "skipping" in p.stderr, "--skip-bad-lines skips the bad line and runs")
    bad("token id outside the vocabulary", base, "bad.jsonl:1", "vocabulary", prompts_text='{"tokens":[1,512]}\n')
    bad("negative token id", base, "bad.jsonl:1", prompts_text='{"tokens":[-1]}\n')
    bad("empty prompt", base, "bad.jsonl:1", "empty", prompts_text='{"tokens":[]}\n')
    with open(os.path.join(model, "config.json")) as f:
        ctx = json.load(f)["max_position_embeddings"]
    bad("prompt longer than the context", base, "bad.jsonl:1", "context",
        prompts_text=json.dumps({"tokens": [1] * (ctx + 1)}) + "\n")
    bad("text prompt without a tokenizer", base, "tokenizer", prompts_text='{"text":"hello"}\n')
    write_prompts(badp, 2, 512, 3)
    bad("unknown recipe name", base + ["--recipe-b", "bf17-infer"], "unknown recipe", "bf16-infer")
    rf = os.path.join(tmp, "recipe.json")
    with open(rf, "w") as f:
        f.write('{"base": "bf16-infer", "split_k": 0}')
    bad("recipe file error names the field", base + ["--recipe-b", rf], "recipe.json", "split_k")
    # -o creates missing parent directories, so unwritable means a parent that is a file
    bad("output not writable", ["--model", model, "--prompts", badp, "-o", os.path.join(badp, "x.h5")], badp)
    bad("existing output kept without --force", ["--model", model, "--prompts", badp, "-o", ref], "already exists", keep=ref)
    bad("bad flag value", base + ["--top-p", "1.5"], "--top-p")
    bad("missing model", ["--model", os.path.join(tmp, "nope"), "--prompts", badp, "-o", os.path.join(tmp, "x.h5")], "nope")

    # ---- 7. shards and merge
    parts = []
    for k in range(2):
        part = os.path.join(tmp, f"part{k}.h5")
        run("tidal-diff", *args, "-o", part, "--shard", f"{k}/2")
        parts.append(part)
    merged = os.path.join(tmp, "merged.h5")
    run("tidal-merge", "-o", merged, *parts)
    with h5py.File(merged) as f:
        s = {k: f["seqs"][k][:] for k in f["seqs"]}
        t = f["tokens/seq"][:]
        check(sorted(s["prompt_index"]) == list(range(10)), "merge: every prompt exactly once")
        ok = all((t[s["token_offset"][i]:s["token_offset"][i] + s["n_scored"][i]] == i).all() for i in range(len(s["prompt_index"])))
        check(ok, "merge: token rows point at their sequence")
    p = run("tidal-merge", "-o", os.path.join(tmp, "m2.h5"), parts[0], ref, ok=False)
    check(p.returncode != 0 and "shard" in p.stderr, "merge refuses a part together with a whole run")
    p = run("tidal-merge", "-o", os.path.join(tmp, "m3.h5"), parts[0], os.path.join(tmp, "replay.h5"), ok=False)
    check(p.returncode != 0 and "differs" in p.stderr, "merge refuses files of different runs")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

print(f"\ntidal-diff checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
