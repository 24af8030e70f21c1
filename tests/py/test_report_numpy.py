"""tidal-report --json against an independent numpy computation over the same HDF5 files.

Reference: numpy 1.24 reading the run files with h5py, no scipy. Quantiles: GSL's
gsl_stats_quantile_from_sorted_data interpolates linearly between order statistics at
f·(n−1), which is numpy's default percentile method ('linear'). Spearman: Pearson of average
ranks (ties share their mean rank), which is what gsl_stats_spearman computes.
Tolerance: 1e-9 relative, with an absolute floor of 1e-12 for values that are 0 up to
rounding (correlations, chi² near 0): GSL's running mean and numpy's pairwise sums differ in
summation order only, i.e. by a few ulps per operation.
Every number in the JSON that the reference computes is compared; the count is printed.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
try:
    import h5py
    import numpy as np
except ImportError:
    sys.exit(77)
from synth_run import make_run

BUILD = os.environ.get("BUILD", "build")
REPORT = os.path.join(BUILD, "bin", "tidal-report")
RTOL, ATOL = 1e-9, 1e-12
IS_SPECS = ["token:truncate:2", "token:mask:0.5:5", "token:truncate:0.8:1.25",
            "sequence:truncate:3", "sequence:mask:3", "sequence:mask:0.2:5",
            "geometric:mask:0.999:1.001", "geometric:truncate:0.99:1.01"]
n_checked = 0
failures = []


def close(name, got, want):
    global n_checked
    n_checked += 1
    if want is None or (isinstance(want, float) and not np.isfinite(want)):
        ok = got is None
    elif got is None:
        ok = False
    else:
        ok = abs(got - want) <= ATOL + RTOL * abs(want)
    if not ok:
        failures.append(f"{name}: tidal {got!r} numpy {want!r}")


def summary(name, got, x):
    x = x[np.isfinite(x)]
    close(name + ".count", got["count"], x.size)
    close(name + ".mean", got["mean"], float(np.mean(x)))
    for q, k in ((50, "p50"), (90, "p90"), (99, "p99")):
        close(f"{name}.{k}", got[k], float(np.percentile(x, q)))  # method 'linear'
    close(name + ".max", got["max"], float(np.max(x)))


def ranks(x):
    """Average ranks, 1-based, ties share their mean rank."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    r = np.empty(x.size)
    i = 0
    while i < x.size:
        j = i
        while j + 1 < x.size and xs[j + 1] == xs[i]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2.0 + 1
        i = j + 1
    return r


def ranks_fast(x):
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    starts = np.r_[True, xs[1:] != xs[:-1]]
    grp = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:] - 1, x.size - 1]
    avg = (first + last) / 2.0 + 1
    r = np.empty(x.size)
    r[order] = avg[grp]
    return r


def pearson(a, b):
    a = a - a.mean()
    b = b - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def corr(name, got, x, y):
    m = np.isfinite(x) & np.isfinite(y)
    close(name + ".n", got["n"], int(m.sum()))
    close(name + ".pearson", got["pearson"], pearson(x[m], y[m]))
    close(name + ".spearman", got["spearman"], pearson(ranks_fast(x[m]), ranks_fast(y[m])))


def buckets(name, got, key, absd, kl, edges):
    assert len(got) == len(edges) - 1, (name, len(got), edges)
    for b, g in enumerate(got):
        m = (key >= edges[b]) & (key < edges[b + 1]) & np.isfinite(absd)
        close(f"{name}[{b}].lo", g["lo"], float(edges[b]))
        close(f"{name}[{b}].count", g["count"], int(m.sum()))
        close(f"{name}[{b}].mean_abs_dlogp", g["mean_abs_dlogp"], float(absd[m].mean()) if m.any() else None)
        close(f"{name}[{b}].max_abs_dlogp", g["max_abs_dlogp"], float(absd[m].max()) if m.any() else None)
        mk = m & np.isfinite(kl)
        close(f"{name}[{b}].mean_kl_ba", g["mean_kl_ba"], float(kl[mk].mean()) if mk.any() else None)


def is_ref(name, got, logw, specs):
    close(name + ".n", got["n"], logw.size)
    w = np.exp(np.clip(logw, -20, 20))  # the documented ±20 log clamp
    close(name + ".log_w_min", got["log_w_min"], float(logw.min()))
    close(name + ".log_w_max", got["log_w_max"], float(logw.max()))
    close(name + ".w_min", got["w_min"], float(w.min()))
    close(name + ".w_mean", got["w_mean"], float(w.mean()))
    close(name + ".w_max", got["w_max"], float(w.max()))
    close(name + ".ess_frac", got["ess_frac"], float(1.0 / np.mean((w / w.mean()) ** 2)))
    inv_ess_m1 = float(np.mean(w * w) / w.mean() ** 2 - 1)
    close(name + ".inv_ess_m1", got["inv_ess_m1"], inv_ess_m1)
    # verl's chi2 (mean w² − 1) at token and sequence level; the geometric level's is the
    # self-normalised one, mean((w / mean w)²) − 1, never negative
    close(name + ".chi2", got["chi2"], inv_ess_m1 if name.endswith("geometric") else float(np.mean(w * w) - 1))
    if name.endswith("geometric"):
        assert got["chi2"] >= 0, got["chi2"]
    assert len(got["corrections"]) == len(specs), (name, got["corrections"], specs)
    for c, (mode, lo, hi) in zip(got["corrections"], specs):
        below, above = w < lo, w > hi
        if mode == "truncate":
            v = np.clip(w, lo, hi)
        else:
            v = np.where(below | above, 0.0, w)
        cn = f"{name}.{mode}[{lo},{hi}]"
        close(cn + ".frac_lo", c["frac_lo"], float(below.mean()))
        close(cn + ".frac_hi", c["frac_hi"], float(above.mean()))
        close(cn + ".w_mean", c["w_mean"], float(v.mean()))
        close(cn + ".ess_frac", c["ess_frac"], float(v.mean() ** 2 / np.mean(v * v)) if np.any(v) else 0.0)


def verl(got, t, resp, nseq):
    """verl's compute_offpolicy_metrics (verl/trainer/ppo/rollout_corr_helper.py), written out in
    numpy as verl writes it in torch: old_log_prob = logp_a, rollout_log_prob = logp_b,
    response_mask = response tokens."""
    la, lb, sq = t["logp_a"][resp], t["logp_b"][resp], t["seq"][resp]
    close("verl.kl", got["kl"], float(np.mean(lb - la)))
    close("verl.k3_kl", got["k3_kl"], float(np.mean(np.exp(la - lb) - (la - lb) - 1)))
    cnt = np.bincount(sq, minlength=nseq)
    has = cnt > 0
    ma = np.bincount(sq, weights=la, minlength=nseq)[has] / cnt[has]
    mb = np.bincount(sq, weights=lb, minlength=nseq)[has] / cnt[has]
    d = mb - ma
    close("verl.log_ppl_diff", got["log_ppl_diff"], float(d.mean()))
    close("verl.log_ppl_abs_diff", got["log_ppl_abs_diff"], float(np.abs(d).mean()))
    close("verl.log_ppl_diff_max", got["log_ppl_diff_max"], float(d.max()))
    close("verl.log_ppl_diff_min", got["log_ppl_diff_min"], float(d.min()))
    close("verl.ppl_ratio", got["ppl_ratio"], float(np.exp(d).mean()))
    close("verl.training_ppl", got["training_ppl"], float(np.exp(-ma).mean()))
    close("verl.rollout_ppl", got["rollout_ppl"], float(np.exp(-mb).mean()))
    close("verl.training_log_ppl", got["training_log_ppl"], float((-ma).mean()))
    close("verl.rollout_log_ppl", got["rollout_log_ppl"], float((-mb).mean()))


def check_run(path, rep, n_worst):
    with h5py.File(path, "r") as f:
        t = {k: f["tokens"][k][:] for k in f["tokens"]}
        nseq = f["seqs/prompt_len"].shape[0]
        lay = f["layers/rel_err"][:] if "layers" in f else None
    dl = t["dlogp"]
    absd = np.abs(dl)
    pa = np.exp(t["logp_a"])
    close("n_tokens", rep["n_tokens"], dl.size)
    close("n_seqs", rep["n_seqs"], nseq)
    summary("abs_dlogp", rep["abs_dlogp"], absd)
    summary("kl_ba", rep["kl_ba"], t["kl_ba"])
    summary("k3", rep["k3"], t["k3"])
    summary("tv", rep["tv"], t["tv"])
    summary("abs_prob_diff", rep["abs_prob_diff"], np.abs(np.exp(t["logp_b"]) - pa))
    dev = np.abs(np.expm1(dl[np.isfinite(dl)]))
    for band, key in ((0.001, "0.1%"), (0.01, "1%"), (0.05, "5%")):
        close("parity." + key, rep["parity"][key], float(np.mean(dev <= band)))
    corr("corr.prob_a", rep["correlation"]["prob_a"], absd, pa)
    corr("corr.entropy_a", rep["correlation"]["entropy_a"], absd, t["entropy_a"])
    corr("corr.pos", rep["correlation"]["pos"], absd, t["pos"].astype(float))
    pe = [0.0, 16.0]
    while pe[-1] <= t["pos"].max():
        pe.append(pe[-1] * 2)
    buckets("by_position", rep["by_position"], t["pos"].astype(float), absd, t["kl_ba"], pe)
    buckets("by_prob_a", rep["by_prob_a"], pa, absd, t["kl_ba"], [0, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 0.9, 1 + 1e-12])

    # worst tokens: the n_worst largest |dlogp| (ties are measure-zero in this data)
    want_rows = np.argsort(-absd, kind="mergesort")[:n_worst]
    got_rows = [w["row"] for w in rep["worst_tokens"]]
    close("worst_tokens.n", len(got_rows), len(want_rows))
    for k, (g, w) in enumerate(zip(got_rows, want_rows)):
        close(f"worst_tokens[{k}].row", g, int(w))
        close(f"worst_tokens[{k}].dlogp", rep["worst_tokens"][k]["dlogp"], float(dl[w]))
    resp = t["is_prompt"] == 0
    seq_logw = -np.bincount(t["seq"][resp], weights=dl[resp], minlength=nseq)
    seq_T = np.bincount(t["seq"][resp], minlength=nseq)
    order = np.argsort(-np.abs(seq_logw), kind="mergesort")[:n_worst]
    for k, s in enumerate(order):
        g = rep["worst_seqs"][k]
        close(f"worst_seqs[{k}].seq", g["seq"], int(s))
        close(f"worst_seqs[{k}].log_w", g["log_w"], float(seq_logw[s]))
        m = t["seq"] == s
        close(f"worst_seqs[{k}].mean_abs_dlogp", g["mean_abs_dlogp"], float(absd[m].mean()))

    by_level = {"token": [], "sequence": [], "geometric": []}
    for s in IS_SPECS:
        p = s.split(":")
        lo, hi = (0.0, float(p[2])) if len(p) == 3 else (float(p[2]), float(p[3]))
        by_level[p[0]].append((p[1], lo, hi))
    has = seq_T > 0
    logw = {"token": -dl[resp], "sequence": seq_logw[has], "geometric": seq_logw[has] / seq_T[has]}
    assert [l["level"] for l in rep["is"]] == ["token", "sequence", "geometric"]
    for l in rep["is"]:
        is_ref("is." + l["level"], l, logw[l["level"]], by_level[l["level"]])

    verl(rep["verl"], t, resp, nseq)

    if lay is None:
        assert rep["layers"] is None
    else:
        close("layers.n_layers", rep["layers"]["n_layers"], lay.shape[1])
        for j in range(lay.shape[1]):
            col = lay[:, j].astype(np.float64)
            close(f"layers.mean[{j}]", rep["layers"]["mean_rel_err"][j], float(col.mean()))
            close(f"layers.p99[{j}]", rep["layers"]["p99_rel_err"][j], float(np.percentile(col, 99)))


def decode_check(d):
    """Worst tokens are decoded through the checkpoint's tokenizer.json (model_path attribute):
    tidal's decode of the token and of its context must equal HF tokenizers' decode."""
    global n_checked
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        print("decode check skipped: HF tokenizers missing")
        return
    text = [f"line {i}: the quick brown fox jumps over {i * 7} lazy dogs; ünïcödé ok" for i in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, show_progress=False,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(os.path.join(d, "model"))
    tok.save(os.path.join(d, "model", "tokenizer.json"))
    path = os.path.join(d, "tok.h5")
    make_run(path, 3000, seed=5, layers=0, vocab=tok.get_vocab_size(), model_path=os.path.join(d, "model"))
    out = subprocess.run([REPORT, path, "--json", "--worst", "6"], capture_output=True, text=True)
    if out.returncode != 0:
        failures.append("tidal-report with a tokenizer failed: " + out.stderr)
        return
    rep = json.loads(out.stdout)
    with h5py.File(path, "r") as f:
        ids = f["prompts/tokens"][:]
        off = f["seqs/tokens_offset"][:]
    for w in rep["worst_tokens"]:
        n_checked += 2
        want = tok.decode([w["token"]], skip_special_tokens=False)
        if w["text"] != want:
            failures.append(f"decoded token {w['token']}: tidal {w['text']!r} HF {want!r}")
        p0 = max(0, w["pos"] - 8)
        ctx = ids[off[w["seq"]] + p0: off[w["seq"]] + w["pos"]].tolist()
        want = tok.decode(ctx, skip_special_tokens=False)
        if w.get("context") != want:
            failures.append(f"decoded context {ctx}: tidal {w.get('context')!r} HF {want!r}")


def main():
    if not os.path.exists(REPORT):
        print(f"missing {REPORT}: build first")
        return 1
    with tempfile.TemporaryDirectory() as d:
        paths = [os.path.join(d, "a.h5"), os.path.join(d, "b.h5"), os.path.join(d, "c.h5")]
        make_run(paths[0], 30000, seed=1, scale=0.02, layers=4)
        make_run(paths[1], 12000, seed=2, scale=0.002, layers=0, recipe_b="small")
        make_run(paths[2], 7001, seed=3, scale=0.2, layers=3, score_prompt=False, recipe_b="large")
        cmd = [REPORT, *paths, "--json", "--worst", "7", "--no-decode"]
        for s in IS_SPECS:
            cmd += ["--is", s]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print("tidal-report failed:", out.stderr)
            return 1
        reps = json.loads(out.stdout)
        assert isinstance(reps, list) and len(reps) == 3
        for p, r in zip(paths, reps):
            check_run(p, r, 7)
        # a single run prints one object, not a list
        one = json.loads(subprocess.run([REPORT, paths[1], "--json"], capture_output=True, text=True, check=True).stdout)
        assert isinstance(one, dict) and "abs_dlogp" in one and "kl_ba" in one
        decode_check(d)
    if failures:
        print(f"{len(failures)} of {n_checked} values disagree:")
        for f in failures[:40]:
            print("  " + f)
        return 1
    print(f"tidal-report vs numpy: {n_checked} values agree (numbers: rtol {RTOL}, atol {ATOL}; decoded text: equal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
