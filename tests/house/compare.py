"""Bit-for-bit comparison of two output trees of tests/house/runs.sh (before / after a change).

Every HDF5 dataset of every run file (/tokens, /seqs, /prompts, /layers, ...) must have the same
dtype, shape and bytes (NaN payloads included: the raw bytes are compared, not the values); the
root attributes must match except those that name the time or the output path; every text
output (tidal-diff summaries, tidal-logprobs) must be byte-identical (but for the throughput line). Exit status 0 only if all
match. Usage: python tests/house/compare.py BEFORE_DIR AFTER_DIR [--new PATH ...]
--new names datasets (paths in the file, e.g. text/utf8) that a change adds on purpose: AFTER
may hold them where BEFORE does not; everything BEFORE holds must still be identical.
"""
import os
import sys

import h5py
import numpy as np

# attributes that legitimately differ between two runs of the same command
VOLATILE = {"command_line", "created", "created_utc", "start_time", "end_time", "elapsed_s",
            "hostname", "wall_s", "tool_version", "git_describe",
            "model_fingerprint"}  # hashes the models' headers, which record the -o path


def datasets(f):
    out = {}
    f.visititems(lambda name, obj: out.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return out


def attrs_of(obj):
    return {k: v for k, v in obj.attrs.items() if k not in VOLATILE}


def same_attr(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.asarray(a).tobytes() == np.asarray(b).tobytes()
    if isinstance(a, (bytes, str)) and isinstance(b, (bytes, str)):
        a = a.decode() if isinstance(a, bytes) else a
        b = b.decode() if isinstance(b, bytes) else b
        # paths inside the two trees differ by their root
        return a.replace(BEFORE, "@") == b.replace(AFTER, "@")
    return a == b


def compare_h5(pa, pb):
    bad = []
    with h5py.File(pa, "r") as fa, h5py.File(pb, "r") as fb:
        da, db = datasets(fa), datasets(fb)
        added = set(db) - set(da)
        if added <= NEW:
            db = {k: v for k, v in db.items() if k not in NEW}
        if set(da) != set(db):
            bad.append(f"datasets differ: only before {sorted(set(da) - set(db))}, only after {sorted(set(db) - set(da))}")
        for name in sorted(set(da) & set(db)):
            x, y = da[name][()], db[name][()]
            if x.dtype != y.dtype or x.shape != y.shape:
                bad.append(f"/{name}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}")
            elif np.asarray(x).tobytes() != np.asarray(y).tobytes():
                n = int(np.sum(np.asarray(x) != np.asarray(y))) if x.dtype.kind in "fiu" else -1
                bad.append(f"/{name}: {n} of {x.size} elements differ")
        for grp in [""] + [k for k in fa if isinstance(fa[k], h5py.Group)]:
            ga, gb = (fa[grp], fb[grp]) if grp else (fa, fb)
            aa, ab = attrs_of(ga), attrs_of(gb)
            for k in sorted(set(aa) | set(ab)):
                if k not in aa or k not in ab or not same_attr(aa[k], ab[k]):
                    bad.append(f"attribute {grp}/{k}: {aa.get(k)!r} vs {ab.get(k)!r}")
    return bad


BEFORE, AFTER = sys.argv[1].rstrip("/"), sys.argv[2].rstrip("/")
NEW = set(sys.argv[sys.argv.index("--new") + 1:]) if "--new" in sys.argv else set()
names = sorted(n for n in os.listdir(BEFORE) if n.endswith((".h5", ".txt")))
if not names:
    sys.exit(f"{BEFORE}: no run files")
failed = 0
for n in names:
    pa, pb = os.path.join(BEFORE, n), os.path.join(AFTER, n)
    if not os.path.exists(pb):
        print(f"MISSING {n}")
        failed += 1
        continue
    if n.endswith(".h5"):
        bad = compare_h5(pa, pb)
    else:
        ta, tb = (b"".join(ln for ln in open(p, "rb").read().replace(root.encode(), b"@").splitlines(True)
                           if b"throughput" not in ln) for p, root in ((pa, BEFORE), (pb, AFTER)))
        bad = [] if ta == tb else ["text output differs"]
    if bad:
        failed += 1
        print(f"DIFFER {n}:\n  " + "\n  ".join(bad[:10]))
print(f"{len(names) - failed} of {len(names)} outputs bit-identical")
sys.exit(1 if failed else 0)
