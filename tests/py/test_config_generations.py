"""Checkpoints as transformers 4.x and 5.x save them give the same results, end to end.

References: the config.json pairs in tests/fixtures/configs/hf4 and hf5 (hf5 written by
transformers 5.23 from hf4, resave_tf5.py). For a tiny Qwen2 with rope_theta 1e6 and a tiny Llama
with llama3 rope scaling and an eos list, the same weights under either config must give
bit-identical tidal-diff run files (every /tokens and /seqs column, generated tokens included)
for an fp32/bf16 pair and an fp16/fp8 pair. A negative control (rope_theta 10000 inside
rope_parameters, what tidal silently used before) must differ, so the comparison can fail.
Also: eos lists stop generation at any listed id (generation_config.json's list winning), are
recorded in the run file; sliding windows refuse longer sequences naming the prompts line; a
broken rope_parameters exits 1 from every tool that loads a model.
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

try:
    import h5py
except ImportError:
    print("h5py not installed: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import check, failures, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "tests", "fixtures", "configs")


def model_with(base, config, dst, gen=None):
    """A copy of the checkpoint folder `base` with config.json replaced (dict or fixture path)."""
    shutil.copytree(base, dst)
    os.remove(os.path.join(dst, "generation_config.json"))
    if isinstance(config, str):
        shutil.copy(config, os.path.join(dst, "config.json"))
    else:
        with open(os.path.join(dst, "config.json"), "w") as f:
            json.dump(config, f)
    if gen is not None:
        with open(os.path.join(dst, "generation_config.json"), "w") as f:
            json.dump(gen, f)
    return dst


def columns(path):
    out = {}
    with h5py.File(path, "r") as f:
        for g in ("tokens", "seqs"):
            for k in f[g]:
                out[g + "/" + k] = f[g][k][()]
        out["attrs"] = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    return out


def diff(model, prompts, out, *extra, ok=True):
    return run("tidal-diff", "--model", model, "--prompts", prompts, "-o", out, "--max-new-tokens", "12",
               "--temperature", "1.0", "--seed", "3", *extra, ok=ok)


tmp = tempfile.mkdtemp(prefix="tidal-config-gen-")
try:
    prompts = os.path.join(tmp, "p.jsonl")
    rng = np.random.default_rng(7)
    with open(prompts, "w") as f:
        for _ in range(6):
            f.write(json.dumps({"tokens": rng.integers(8, 512, int(rng.integers(3, 9))).tolist()}) + "\n")

    for name, arch in (("tiny-qwen2-rope1e6", "qwen2"), ("tiny-llama-llama3", "llama")):
        base = os.path.join(tmp, name + "-base")
        run("tidal-init", "--arch", arch, "--preset", "tiny", "--seed", "4", "--embed-std", "0.5", "-o", base)
        m4 = model_with(base, os.path.join(FIX, "hf4", name + ".json"), os.path.join(tmp, name + "-4"))
        m5 = model_with(base, os.path.join(FIX, "hf5", name + ".json"), os.path.join(tmp, name + "-5"))
        with open(os.path.join(FIX, "hf5", name + ".json")) as f:
            wrong = json.load(f)
        wrong["rope_parameters"]["rope_theta"] = 10000.0
        mw = model_with(base, wrong, os.path.join(tmp, name + "-wrong"))
        for ra, rb in (("fp32", "bf16-infer"), ("fp16-train", "fp8-rollout")):
            runs = {}
            for tag, m in (("4", m4), ("5", m5), ("wrong", mw)):
                out = os.path.join(tmp, f"{name}-{tag}-{ra}.h5")
                diff(m, prompts, out, "--recipe-a", ra, "--recipe-b", rb)
                runs[tag] = columns(out)
            a, b = runs["4"], runs["5"]
            keys = [k for k in a if k != "attrs"]
            same = all(k in b and a[k].shape == b[k].shape and
                       np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in keys)
            check(same and len(keys) > 10, f"{name} {ra}/{rb}: 4.x and 5.x configs give bit-identical run files "
                  f"({len(keys)} columns, {len(a['tokens/logp_a'])} tokens)")
            w = runs["wrong"]
            n = min(len(w["tokens/logp_a"]), len(a["tokens/logp_a"]))
            dev = float(np.max(np.abs(w["tokens/logp_a"][:n] - a["tokens/logp_a"][:n]))) if n else 0.0
            check(dev > 1e-4, f"{name} {ra}: the theta-10000 control differs (max |dlogp| {dev:.3g}), so the check can fail")

    # eos lists: config.json's whole list is the stop set, generation_config.json's list wins
    base = os.path.join(tmp, "tiny-llama-llama3-base")
    m = os.path.join(tmp, "tiny-llama-llama3-5")
    free = os.path.join(tmp, "free.h5")
    diff(m, prompts, free, "--recipe-a", "fp32", "--recipe-b", "fp32", "--no-stop-at-eos")
    cols = columns(free)
    check(cols["attrs"].get("eos_token_ids") == "[2,5,7]", "config.json's eos list recorded: "
          + str(cols["attrs"].get("eos_token_ids")))
    seq, tok = cols["tokens/seq"], cols["tokens/token"]
    first = tok[seq == 0]
    # a token of sequence 0's response that is not its first and did not occur before it
    k = next(i for i in range(2, len(first)) if first[i] not in first[:i] and first[i] not in (2, 5, 7))
    gen = {"bos_token_id": 1, "eos_token_id": [511 if first[k] != 511 else 510, int(first[k])]}
    mg = model_with(base, os.path.join(FIX, "hf5", "tiny-llama-llama3.json"), os.path.join(tmp, "llama-gen"), gen)
    stop = os.path.join(tmp, "stop.h5")
    diff(mg, prompts, stop, "--recipe-a", "fp32", "--recipe-b", "fp32")
    sc = columns(stop)
    check(int(sc["seqs/response_len"][0]) == k + 1,
          f"generation stops at the second id of generation_config.json's list (response {sc['seqs/response_len'][0]} "
          f"tokens, expected {k + 1})")
    check(sc["attrs"].get("eos_token_ids") == "[%d,%d]" % tuple(gen["eos_token_id"]),
          "generation_config.json's list recorded: " + str(sc["attrs"].get("eos_token_ids")))

    # sliding window: sequences up to the window run, longer ones are refused naming the line
    base = os.path.join(tmp, "tiny-qwen2-rope1e6-base")
    ms = model_with(base, os.path.join(FIX, "hf5", "tiny-qwen2-sliding.json"), os.path.join(tmp, "sliding"))
    short = os.path.join(tmp, "short.jsonl")
    with open(short, "w") as f:
        f.write(json.dumps({"tokens": list(range(10, 20))}) + "\n")
    p = diff(ms, short, os.path.join(tmp, "sw-ok.h5"), "--max-new-tokens", "6", ok=False)
    check(p.returncode == 0, "10 prompt + 6 new tokens fit the window of 16: " + p.stderr.strip()[-200:])
    p = diff(ms, short, os.path.join(tmp, "sw-bad.h5"), "--max-new-tokens", "7", ok=False)
    check(p.returncode == 1 and "short.jsonl:1" in p.stderr and "sliding window of 16" in p.stderr,
          "17 positions refused, naming the line and the window: " + p.stderr.strip()[-300:])

    # a broken rope_parameters: exit 1 from every tool that loads a model, naming file and key
    with open(os.path.join(FIX, "hf5", "tiny-qwen2-rope1e6.json")) as f:
        bad = json.load(f)
    bad["rope_parameters"] = 1000000.0
    mb = model_with(base, bad, os.path.join(tmp, "bad"))
    for argv in (["tidal-diff", "--model", mb, "--prompts", prompts, "-o", os.path.join(tmp, "bad.h5")],
                 ["tidal-logprobs", "--model", mb, "--tokens", "1,2,3"],
                 ["tidal-inspect", mb]):
        p = run(*argv, ok=False)
        check(p.returncode == 1 and "config.json" in p.stderr and "\"rope_parameters\" must be an object" in p.stderr,
              f"{argv[0]}: broken rope_parameters -> exit {p.returncode}: {p.stderr.strip()[-160:]}")
    # tidal-init writes the seed user's shape without hand-editing: the llama-3.1-8b-instruct
    # preset (shape flags shrink it) against the hub's own config.json, and the flags by name
    small = ["--num-layers", "1", "--hidden-size", "64", "--num-heads", "4", "--num-kv-heads", "2",
             "--intermediate-size", "128"]
    l31 = os.path.join(tmp, "l31")
    p = run("tidal-init", "--preset", "llama-3.1-8b-instruct", *small, "-o", l31)
    check("\r" not in p.stderr, "tidal-init's progress is one line per report when stderr is a file")
    with open(os.path.join(l31, "config.json")) as f:
        got = json.load(f)
    with open(os.path.join(FIX, "hf4", "llama-3.1-8b-instruct.json")) as f:
        hub = json.load(f)
    for key in ("vocab_size", "rope_theta", "rope_scaling", "eos_token_id", "bos_token_id",
                "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "head_dim"):
        if key == "head_dim":
            check(got[key] == 16, f"head_dim follows the shrunk shape: {got[key]}")
            continue
        check(got.get(key) == hub.get(key), f"preset llama-3.1-8b-instruct {key}: {got.get(key)} (hub {hub.get(key)})")
    rs = json.dumps({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192})
    tl = os.path.join(tmp, "tiny-l31")
    run("tidal-init", "--preset", "tiny", "--rope-scaling", rs, "--eos-token-id", "2,5,7", "--bos-token-id", "1", "-o", tl)
    with open(os.path.join(tl, "config.json")) as f:
        got = json.load(f)
    check(got["rope_scaling"] == json.loads(rs) and got["eos_token_id"] == [2, 5, 7] and got["bos_token_id"] == 1,
          f"--rope-scaling/--eos-token-id/--bos-token-id into config.json: {got['rope_scaling']} {got['eos_token_id']}")
    p = run("tidal-logprobs", "--model", tl, "--tokens", "1,2,3")
    for bad, what in ((["--rope-scaling", "{\"rope_type\": \"yarn\", \"factor\": 4}"], "yarn"),
                      (["--rope-scaling", "{\"factor\": "], "invalid JSON"),
                      (["--eos-token-id", "2,x"], "comma-separated"),
                      (["--eos-token-id", "600"], "outside the vocabulary")):
        p = run("tidal-init", "--preset", "tiny", *bad, "-o", os.path.join(tmp, "bad-init"), ok=False)
        check(p.returncode == 2 and what in p.stderr and not os.path.exists(os.path.join(tmp, "bad-init", "model.safetensors")),
              f"tidal-init {' '.join(bad)}: exit 2 naming it ({p.stderr.strip()[-160:]})")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failures else 0)
