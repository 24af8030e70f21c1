"""Reads a run file written by tests/test_runfile.c with h5py and checks the HDF5 contract that
users rely on (DESIGN.md, "HDF5 run file"): dtypes (little-endian int32/int64/float32/float64,
int8), shapes, unlimited chunked deflate+shuffle datasets, values, and root attributes that read
as str / int / float. Not a test of its own (run.sh runs tests/py/test_*.py only): the C test
calls it as  python runfile_h5py_check.py FILE  and takes its exit status; 77 = h5py missing.

The values are the formulas test_runfile.c writes (exact in binary, so compared with ==)."""
import sys

try:
    import h5py
    import numpy as np
except ImportError:
    sys.exit(77)


def check(path):
    with h5py.File(path, "r") as f:
        a = f.attrs
        assert isinstance(a["format"], str) and a["format"] == "tidal-run", repr(a["format"])
        assert isinstance(a["tool_version"], str), repr(a["tool_version"])
        assert isinstance(a["command_line"], str), repr(a["command_line"])
        assert a["command_line"] == "tidal-score --model m \u00e9t\u00e9", repr(a["command_line"])
        for k, want in (("schema_version", 1), ("seed", -1234567890123)):
            v = a[k]
            assert isinstance(v, (int, np.integer)) and v == want, (k, repr(v))
        t = a["temperature"]
        assert isinstance(t, (float, np.floating)) and t == 0.7, repr(t)

        n = 12          # rows in /tokens after the C test's appends
        i = np.arange(n)
        cols = {
            "/tokens/seq": ("<i8", i * 3 - 7),
            "/tokens/pos": ("<i4", 100 + i),
            "/tokens/logp_a": ("<f8", -i / 8.0),
            "/tokens/flag": ("|i1", (i % 3) - 1),
        }
        for name, (dt, want) in cols.items():
            d = f[name]
            assert d.dtype == np.dtype(dt), (name, d.dtype)
            assert d.shape == (n,), (name, d.shape)
            assert d.maxshape == (None,), (name, d.maxshape)
            assert d.chunks is not None and len(d.chunks) == 1, (name, d.chunks)
            assert d.compression == "gzip" and d.shuffle, (name, d.compression, d.shuffle)
            assert np.array_equal(d[()], want), (name, d[()], want)
        d = f["/layers/rel_err"]
        assert d.dtype == np.dtype("<f4"), d.dtype
        assert d.shape == (7, 3) and d.maxshape == (None, 3), (d.shape, d.maxshape)
        assert d.chunks is not None and d.chunks[1] == 3, d.chunks
        assert d.compression == "gzip"
        r = np.arange(7)[:, None]
        c = np.arange(3)[None, :]
        assert np.array_equal(d[()], (r * 0.5 + c / 4.0).astype(np.float32)), d[()]
        # pandas-style access: a 1-D column is a plain numpy array
        assert f["/tokens/pos"][:].dtype.kind == "i"


if __name__ == "__main__":
    try:
        check(sys.argv[1])
    except AssertionError as e:
        print("h5py check failed:", e)
        sys.exit(1)
    print("h5py check: ok")
