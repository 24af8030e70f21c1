"""tidal's safetensors against the reference implementation (the `safetensors` package).

1. Checkpoints written by tidal-init (four architectures, F32/BF16/F16) load with
   safetensors.torch.load_file and safetensors.deserialize (whose Rust loader checks the layout:
   contiguous, in bounds), carry "format": "pt" and the tidal command line, and every tensor
   equals, bit for bit, what tidal itself decodes (tidal-inspect --dump).
2. A file written by safetensors.numpy.save_file with F32, F16, BF16 and F8_E4M3 tensors (ml_dtypes
   arrays, odd sizes; special values: signed zeros, subnormals, +-448, NaN) is read by tidal bit
   for bit; NaN compares as NaN. (Misaligned tensors are covered by tests/test_checkpoint.c: the
   Rust writer sorts tensors so that they are aligned.)
3. The same checkpoint re-saved by Python as two shards with model.safetensors.index.json is read
   by tidal, matches its config, and gives the same values.
4. A truncated file is rejected by tidal-inspect with a message naming the file.
Tolerance: none (float32 bit patterns). Exit 0 pass, 77 skip (helper package missing), 1 fail.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import ml_dtypes
    import safetensors
    from safetensors.numpy import save_file as np_save_file
    import torch
    from safetensors.torch import load_file as torch_load_file, save_file as torch_save_file
except ImportError as e:  # helper package missing: skip, as tests/run.sh expects
    print(f"skip: {e}")
    sys.exit(77)

BUILD = os.environ.get("BUILD", "build")
INIT = os.path.join(BUILD, "bin", "tidal-init")
INSPECT = os.path.join(BUILD, "bin", "tidal-inspect")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def tidal_values(path, name):
    """The tensor as tidal decodes it to fp32 (tidal-inspect prints %.9g: exact for float32)."""
    out = subprocess.run([INSPECT, path, "--dump", name], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"tidal-inspect --dump {name} failed: {out.stderr}")
    return np.array([float(v) for v in out.stdout.split()], dtype=np.float32)


def same_bits(a, b):
    a = np.asarray(a, dtype=np.float32).ravel()
    b = np.asarray(b, dtype=np.float32).ravel()
    if a.shape != b.shape:
        return False
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)))


def test_tidal_written(tmp):
    cases = [("llama", "f32", []), ("mistral", "bf16", ["--tie"]), ("qwen2", "bf16", []), ("qwen3", "f16", [])]
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    for arch, dt, extra in cases:
        d = os.path.join(tmp, f"{arch}-{dt}")
        cmd = [INIT, "--arch", arch, "--preset", "tiny", "--dtype", dt, "--seed", "5", "-o", d] + extra
        r = subprocess.run(cmd, capture_output=True, text=True)
        check(r.returncode == 0, f"{arch}: tidal-init failed: {r.stderr}")
        if r.returncode:
            continue
        st = os.path.join(d, "model.safetensors")
        tensors = torch_load_file(st)
        with safetensors.safe_open(st, framework="pt") as f:
            meta = f.metadata()
        check(meta.get("format") == "pt", f"{arch}: metadata format is {meta.get('format')}")
        check(meta.get("tidal_command", "").endswith(" ".join(cmd[1:])), f"{arch}: tidal_command = {meta.get('tidal_command')}")
        with open(st, "rb") as fh:
            raw = safetensors.deserialize(fh.read())   # the Rust loader's own validation
        check(len(raw) == len(tensors), f"{arch}: deserialize saw {len(raw)} tensors")
        for name, t in tensors.items():
            check(t.dtype == torch_dtype[dt], f"{arch}: {name} is {t.dtype}")
            check(same_bits(t.float().numpy(), tidal_values(d, name)), f"{arch}: {name} differs from tidal's decoding")
        cfg = json.load(open(os.path.join(d, "config.json")))
        gen = json.load(open(os.path.join(d, "generation_config.json")))
        check(cfg["model_type"] == arch and cfg["architectures"][0].lower().startswith(arch), f"{arch}: config arch {cfg['architectures']}")
        C, NH, NKV, HD, F, V = (cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                                 "intermediate_size", "vocab_size"))
        check(tuple(tensors["model.layers.0.self_attn.q_proj.weight"].shape) == (NH * HD, C), f"{arch}: q_proj shape")
        check(tuple(tensors["model.layers.1.self_attn.k_proj.weight"].shape) == (NKV * HD, C), f"{arch}: k_proj shape")
        check(tuple(tensors["model.layers.1.mlp.down_proj.weight"].shape) == (C, F), f"{arch}: down_proj shape")
        check(("lm_head.weight" in tensors) == (not cfg["tie_word_embeddings"]), f"{arch}: lm_head vs tie")
        check(cfg["tie_word_embeddings"] == ("--tie" in extra), f"{arch}: tie flag")
        check(("model.layers.0.self_attn.q_proj.bias" in tensors) == (arch == "qwen2"), f"{arch}: qkv bias")
        check(("model.layers.0.self_attn.q_norm.weight" in tensors) == (arch == "qwen3"), f"{arch}: qk norm")
        check(tuple(tensors["model.embed_tokens.weight"].shape) == (V, C), f"{arch}: embed shape")
        check(cfg["torch_dtype"] == {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[dt], f"{arch}: torch_dtype")
        check(gen.get("eos_token_id") == cfg["eos_token_id"], f"{arch}: generation_config eos")
        norm = tensors["model.norm.weight"].float()
        check(0.8 < float(norm.mean()) < 1.2 and float(norm.std()) > 0.05, f"{arch}: norm weights are 1 + 0.1 N(0,1)")


def test_python_written(tmp):
    rng = np.random.default_rng(0)
    base = rng.standard_normal(37).astype(np.float32) * 3
    base[:6] = [0.0, -0.0, 1e-40, 448.0, -448.0, 2.0 ** -9]   # zeros, f32 subnormal, e4m3 extremes/subnormal
    base[6] = np.nan
    arrays = {
        "x_f8": base.astype(ml_dtypes.float8_e4m3fn),
        "y_bf16": base.astype(ml_dtypes.bfloat16).reshape(1, 37),
        "z_f16": base.astype(np.float16)[:35].reshape(5, 7),
        "w_f32": base.copy(),
        "v_f8_2d": rng.standard_normal((3, 5)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn),
    }
    path = os.path.join(tmp, "py.safetensors")
    np_save_file(arrays, path, metadata={"written_by": "python"})
    out = subprocess.run([INSPECT, path], capture_output=True, text=True)
    check(out.returncode == 0, f"tidal-inspect on the Python file failed: {out.stderr}")
    for name, a in arrays.items():
        want = a.astype(np.float32)
        check(same_bits(want, tidal_values(path, name)), f"python-written {name} ({a.dtype}) decoded differently by tidal")
        shape = "(" + ", ".join(str(s) for s in a.shape) + ")"
        check(shape in out.stdout, f"{name}: shape {shape} not listed by tidal-inspect")


def test_shards_and_truncation(tmp):
    d = os.path.join(tmp, "sharded")
    subprocess.run([INIT, "--arch", "qwen2", "--preset", "tiny", "--dtype", "bf16", "--seed", "9", "-o", d],
                   check=True, capture_output=True)
    single = os.path.join(d, "model.safetensors")
    whole = torch_load_file(single)
    names = sorted(whole)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(halves):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        torch_save_file({n: whole[n] for n in part}, os.path.join(d, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    truncated = os.path.join(tmp, "truncated.safetensors")
    with open(single, "rb") as fi, open(truncated, "wb") as fo:
        fo.write(fi.read()[: os.path.getsize(single) // 2])
    os.remove(single)
    out = subprocess.run([INSPECT, d], capture_output=True, text=True)
    check(out.returncode == 0 and "tensors match config: yes" in out.stdout, f"sharded checkpoint: {out.stdout} {out.stderr}")
    for n in (halves[0][0], halves[1][-1]):
        check(same_bits(whole[n].float().numpy(), tidal_values(d, n)), f"sharded: {n} differs")
    out = subprocess.run([INSPECT, truncated], capture_output=True, text=True)
    check(out.returncode == 1 and truncated in out.stderr and "data_offsets" in out.stderr,
          f"truncated file: rc={out.returncode} {out.stderr}")


def main():
    for tool in (INIT, INSPECT):
        if not os.access(tool, os.X_OK):
            print(f"FAIL: {tool} not built")
            return 1
    tmp = tempfile.mkdtemp(prefix="tidal-st-py-")
    try:
        test_tidal_written(tmp)
        test_python_written(tmp)
        test_shards_and_truncation(tmp)
    finally:
        shutil.rmtree(tmp)
    print(f"safetensors round trip: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
