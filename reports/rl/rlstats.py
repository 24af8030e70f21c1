"""Exact tests and run-file readers shared by the pre-registered analyses (reports/rl/lora/confirm.py,
reports/rl/moe/analyze.py). h5py and numpy only.

Dead, as reports/rl/lora and reports/rl/moe pre-registered it: final clean accuracy (the mean of the
last two eval_accuracy values) below DEAD. Only finished runs (steps_done = max_steps) count."""
import itertools
import math
import os

import h5py
import numpy as np

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
DEAD = 0.005


def _evals(f):
    """the clean evaluations of an open run file, in step order (the steps without one left out)"""
    ev = f["steps"]["eval_accuracy"][:]
    return ev[np.isfinite(ev)]


def final_clean(path):
    """the run's final clean accuracy, or None while it is unfinished"""
    with h5py.File(path, "r") as f:
        a = dict(f.attrs)
        if int(a.get("steps_done", 0)) < int(a.get("max_steps", 1)):
            return None
        ev = _evals(f)
    return float(ev[-2:].mean()) if len(ev) else float("nan")


def last_eval(path):
    """the run's last clean evaluation (eval_accuracy), nan when it has none"""
    with h5py.File(path, "r") as f:
        ev = _evals(f)
    return float(ev[-1]) if len(ev) else float("nan")


def fisher_greater(a, b, c, d):
    """one-sided P(X >= a) of the 2x2 table [[a, b], [c, d]] with fixed margins"""
    n1, n2, k = a + b, c + d, a + c
    tot = math.comb(n1 + n2, k)
    return sum(math.comb(n1, x) * math.comb(n2, k - x) for x in range(a, min(n1, k) + 1)) / tot


def fisher_two_sided(a, b, c, d):
    """two-sided: the tables at most as probable as the observed one"""
    n1, n2, k = a + b, c + d, a + c
    tot = math.comb(n1 + n2, k)
    pr = {x: math.comb(n1, x) * math.comb(n2, k - x) / tot for x in range(max(0, k - n2), min(n1, k) + 1)}
    return min(1.0, sum(p for p in pr.values() if p <= pr[a] * (1 + 1e-9)))


def mann_whitney_less(x, y, seed=41):
    """U of x against y (ties count half) and the one-sided permutation p of x being lower;
    exact over all splits when they number at most 2e6, else 40,000 random ones (seeded).
    U of a split is the sum of its midranks less nx(nx+1)/2: the pairwise count, exactly (halves)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    allv = np.concatenate([x, y])
    n, nx = len(allv), len(x)
    order = np.argsort(allv, kind="stable")
    ranks = np.empty(n)
    sv = allv[order]
    i = 0
    while i < n:   # midranks: a run of equal values shares the mean of its ranks
        j = i + 1
        while j < n and sv[j] == sv[i]:
            j += 1
        ranks[order[i:j]] = 0.5 * (i + 1 + j)
        i = j
    base = nx * (nx + 1) / 2
    obs = float(ranks[:nx].sum() - base)
    splits = math.comb(n, nx)
    le = tot = 0
    if splits <= 2_000_000:
        for idx in itertools.combinations(range(n), nx):
            le += ranks[list(idx)].sum() - base <= obs + 1e-9
            tot += 1
    else:
        rng = np.random.default_rng(seed)
        for _ in range(2_000_000 // 50):   # a p known to about +-0.002
            perm = rng.permutation(n)
            le += ranks[perm[:nx]].sum() - base <= obs + 1e-9
            tot += 1
    return obs, le / tot, splits <= 2_000_000


Z95 = 1.959963984540054   # the normal quantile of a two-sided 95 % interval


def wilson(k, n, z=Z95):
    """Wilson's score interval (lo, hi) for a proportion k / n"""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def newcombe_diff(k1, n1, k2, n2, z=Z95):
    """Newcombe's hybrid score interval (his method 10, Stat. Med. 1998) for p1 - p2, from the two
    Wilson intervals: the share of runs dead in one group less the other's"""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1, z)
    l2, u2 = wilson(k2, n2, z)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
