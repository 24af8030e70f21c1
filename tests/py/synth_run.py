"""Writes synthetic tidal run files (schema version 1, reports/SCHEMA.md) with h5py, for the
report/heatmap tests and the benchmark. Not a test itself (no test_ prefix).

    python3 tests/py/synth_run.py OUT.h5 --tokens N [--seed S] [--scale X] [--layers L]

The mismatch is heavy-tailed on purpose (Student-t Δlogp plus rare large jumps) so that the
importance-sampling caps clip something, and a few KL values are NaN (as replayed rollouts
leave them) so that the "finite values only" rule is exercised.
"""
import argparse
import sys

import numpy as np


def make_run(path, n_tokens, seed=0, scale=0.02, layers=4, score_prompt=True, vocab=1000,
             max_resp=256, recipe_b="synthetic-b", model_path="/nonexistent-synthetic-model"):
    import h5py
    rng = np.random.default_rng(seed)
    seq_rows = []  # (prompt_len, response_len)
    total = 0
    while total < n_tokens:
        p = int(rng.integers(3, 20))
        r = int(rng.integers(1, max_resp + 1))
        left = n_tokens - total
        if (p - 1 if score_prompt else 0) + r > left:  # the last sequence is cut to fit exactly
            if left > (p - 1 if score_prompt else 0):
                r = left - (p - 1 if score_prompt else 0)
            else:
                p, r = 1, left
        seq_rows.append((p, r))
        total += r + (p - 1 if score_prompt else 0)
    nseq = len(seq_rows)
    plen = np.array([s[0] for s in seq_rows], np.int32)
    rlen = np.array([s[1] for s in seq_rows], np.int32)
    # token rows: prompt positions 1..P-1 (if scored) then response positions P..P+R-1
    seq_parts, pos_parts, prm_parts = [], [], []
    for s, (p, r) in enumerate(seq_rows):
        first = 1 if score_prompt else p
        pos = np.arange(first, p + r, dtype=np.int32)
        seq_parts.append(np.full(pos.size, s, np.int64))
        pos_parts.append(pos)
        prm_parts.append((pos < p).astype(np.int8))
    seq = np.concatenate(seq_parts)
    pos = np.concatenate(pos_parts)
    is_prompt = np.concatenate(prm_parts)
    n = seq.size
    assert n == n_tokens, (n, n_tokens)
    ids_all = rng.integers(0, vocab, int((plen + rlen).sum())).astype(np.int32)
    tokens_offset = np.concatenate([[0], np.cumsum(plen + rlen)[:-1]]).astype(np.int64)
    token = ids_all[tokens_offset[seq] + pos]

    logp_a = -rng.exponential(2.0, n)
    d = rng.standard_t(3, n) * scale
    jump = rng.random(n) < 0.002
    d[jump] = rng.normal(0, 1.0, jump.sum())
    d *= 1 + pos / 512.0  # mismatch grows along the sequence
    logp_b = np.minimum(logp_a + d, -1e-6)  # still a log-probability
    dlogp = logp_b - logp_a
    r = logp_a - logp_b
    k3 = np.expm1(r) - r
    kl_ba = 0.5 * d * d + rng.exponential(1e-6, n)
    kl_ba[rng.random(n) < 0.01] = np.nan
    kl_ab = kl_ba * 1.01
    tv = np.abs(d) * 0.3 + rng.exponential(1e-4, n)
    ent_a = rng.exponential(2.0, n)
    ent_b = ent_a + rng.normal(0, 1e-3, n)

    token_offset = np.concatenate([[0], np.cumsum([(p - 1 if score_prompt else 0) + r for p, r in seq_rows])[:-1]])
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "tidal-run"
        f.attrs["schema_version"] = np.int64(1)
        f.attrs["tool_version"] = "synthetic"
        f.attrs["tool"] = "synth_run.py"
        f.attrs["command_line"] = "tests/py/synth_run.py " + path
        f.attrs["model_path"] = model_path
        f.attrs["recipe_a_name"] = "synthetic-a"
        f.attrs["recipe_b_name"] = recipe_b

        def col(name, a):
            f.create_dataset(name, data=a, chunks=True, maxshape=(None,) + a.shape[1:],
                             compression="gzip", shuffle=True)
        col("tokens/seq", seq); col("tokens/pos", pos); col("tokens/token", token)
        col("tokens/logp_a", logp_a); col("tokens/logp_b", logp_b); col("tokens/dlogp", dlogp)
        col("tokens/kl_ba", kl_ba); col("tokens/kl_ab", kl_ab); col("tokens/k3", k3); col("tokens/tv", tv)
        col("tokens/entropy_a", ent_a); col("tokens/entropy_b", ent_b); col("tokens/is_prompt", is_prompt)
        col("seqs/prompt_len", plen); col("seqs/response_len", rlen)
        col("seqs/tokens_offset", tokens_offset); col("seqs/token_offset", token_offset.astype(np.int64))
        col("prompts/tokens", ids_all)
        if layers:
            # per-layer error grows with depth and position
            lay = (1e-3 * (1 + np.arange(layers))[None, :] * (1 + pos[:, None] / 256.0)
                   * rng.lognormal(0, 0.3, (n, layers))).astype(np.float32)
            col("layers/rel_err", lay)
    return n


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    make_run(a.out, a.tokens, a.seed, a.scale, a.layers)
    sys.exit(0)
