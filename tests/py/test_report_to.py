"""--report-to tensorboard|jsonl (include/tidal/tfevents.h) read back by TensorBoard's own code:

1. tidal-rl on the shipped tiny model (datasets/models/add, 4 steps of 8 completions) with
   --report-to all: every record of the events file has the length and data CRCs TensorBoard's
   masked_crc32c gives (TensorBoard's reader takes a bad CRC for the end of the file, so this is
   checked frame by frame) and the file_version "brain.Event:2" first; EventAccumulator's scalars
   are the run file's /steps columns, one tag per column (train/NAME, eval_X -> eval/X), their
   steps the /steps/step values and their values the float32 of the column's (NaN rows absent: a
   column NaN on every step, such as kl without --beta, has no tag);
   metrics.jsonl has one line per row with every column, equal to the double (null: NaN).
2. --resume of that run with --max-steps 6 (HF's way to continue a finished run): the first
   events file keeps steps 0..3, a second one holds 4..5, so TensorBoard sees every step once,
   equal to the new /steps; metrics.jsonl likewise has 6 lines. (The cut-back of steps logged
   past the checkpoint a killed run resumes from: tests/test_tfevents.c.)
3. tidal-sft (4 steps, /steps/step 1-based) with --report-to tensorboard: the same equalities;
   its --resume --max-steps 6 keeps steps 1..4 in the first file and adds one for 5..6.
4. tidal-sweep --report-to tensorboard over 2 seeds: `tensorboard --logdir OUTPUT_DIR`'s
   multiplexer finds both runs, each with its own run file's values.
TensorBoard is a test-only PyPI package (.ci/deps.sh); without it the test is skipped (77)."""
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    from tensorboard.backend.event_processing import plugin_event_multiplexer
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    from tensorboard.util import tensor_util
except ImportError as e:
    print(f"{e.name} missing (tensorboard is installed by .ci/deps.sh): skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BIN, check, failures  # noqa: E402

ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
tmp = tempfile.mkdtemp(prefix="tidal-report-to-")
MODEL = "datasets/models/add"
RL_ARGS = ["--model-path", MODEL, "--dataset-path", "datasets/tasks/add/train.jsonl", "--num-generations", "4",
           "--per-device-batch-size", "8", "--max-completion-length", "48", "--learning-rate", "1e-3", "-q"]


def sh(*args):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit("failed: " + " ".join(map(str, args)))
    return p


def tag_of(name):
    return "eval/" + name[5:] if name.startswith("eval_") else "train/" + name


def steps_table(h5):
    with h5py.File(h5, "r") as f:
        return {k: f["steps"][k][()] for k in f["steps"]}


def frames_ok(path):
    """Every TFRecord frame of path: (length, masked CRC of it, data, masked CRC of it) with
    TensorBoard's masked_crc32c; returns the number of records (None if a frame is bad)."""
    data = open(path, "rb").read()
    at = n = 0
    while at < len(data):
        if at + 12 > len(data):
            return None
        (length,) = struct.unpack_from("<Q", data, at)
        (crc_len,) = struct.unpack_from("<I", data, at + 8)
        body = data[at + 12:at + 12 + length]
        if crc_len != masked_crc32c(data[at:at + 8]) or len(body) != length or at + 16 + length > len(data):
            return None
        (crc_body,) = struct.unpack_from("<I", data, at + 12 + length)
        if crc_body != masked_crc32c(body):
            return None
        if n == 0 and b"brain.Event:2" not in body:
            return None
        at += 16 + length
        n += 1
    return n


def check_events(logdir, table, what):
    """TensorBoard's scalars in logdir (one run) against the /steps table."""
    files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
    check(files and all(frames_ok(f) for f in files), f"{what}: {len(files)} events file(s), every frame's CRCs "
          "are TensorBoard's masked_crc32c, file_version first")
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    cols = [c for c in table if c != "step" and not np.isnan(table[c].astype(np.float64)).all()]
    check(tags == {tag_of(c) for c in cols}, f"{what}: one tag per /steps column not NaN throughout ({len(cols)}), as "
          f"HF's rewrite_logs names them (missing {sorted({tag_of(c) for c in cols} - tags)}, extra {sorted(tags - {tag_of(c) for c in cols})})")
    steps = table["step"].astype(np.int64)
    bad = []
    for c in cols:
        if tag_of(c) not in tags:
            continue
        got = [(e.step, e.value) for e in acc.Scalars(tag_of(c))]
        want = [(int(s), float(np.float32(v))) for s, v in zip(steps, table[c]) if not np.isnan(v)]
        if got != want:
            bad.append((c, got[:3], want[:3]))
    check(not bad, f"{what}: every tag's (step, value) pairs are the /steps rows, float32, NaN rows left out"
          + (f" (first bad: {bad[0]})" if bad else ""))
    return acc


def check_jsonl(path, table, what):
    lines = open(path).read().splitlines()
    rows = [json.loads(s) for s in lines]
    n = len(table["step"])
    check(len(rows) == n and all(list(r)[0] == "step" for r in rows),
          f"{what}: metrics.jsonl has one object per /steps row ({len(rows)} of {n}), \"step\" first")
    bad = []
    for i, r in enumerate(rows[:n]):
        if set(r) != set(table):
            bad.append((i, "keys", sorted(set(r) ^ set(table))))
            continue
        for c, col in table.items():
            v = col[i]
            want = None if not math.isfinite(float(v)) else (int(v) if np.issubdtype(col.dtype, np.integer) or c == "step"
                                                           else float(v))
            if r[c] != want or type(r[c]) is not type(want):
                bad.append((i, c, r[c], want))
    check(not bad, f"{what}: every value is the /steps double exactly (null for NaN/inf), integers as integers"
          + (f" (first bad: {bad[0]})" if bad else ""))


try:
    # ---- 1. tidal-rl --report-to all
    out = os.path.join(tmp, "rl")
    rl = [os.path.join(BIN, "tidal-rl"), *RL_ARGS, "--max-steps", "4", "--save-steps", "2", "--output-dir", out]
    sh(*rl, "--report-to", "all")
    table = steps_table(os.path.join(out, "rl.h5"))
    check(len(table["step"]) == 4 and "collapse_fired" in table and np.nanmax(table["reward"]) > 0,
          "tidal-rl: 4 /steps rows with real rewards (the model answers some sums)")
    check_events(os.path.join(out, "runs"), table, "tidal-rl")
    check_jsonl(os.path.join(out, "metrics.jsonl"), table, "tidal-rl")
    first = sorted(glob.glob(os.path.join(out, "runs", "events.out.tfevents.*")))

    # ---- 2. --resume with a larger --max-steps (HF's way to continue a finished run): the first
    # events file keeps steps 0..3, a second holds 4..5, no step twice (the cut-back of steps past
    # a checkpoint after a kill: tests/test_tfevents.c)
    rl6 = [("6" if i and rl[i - 1] == "--max-steps" else a) for i, a in enumerate(rl)]
    sh(*rl6, "--report-to", "all", "--resume")
    table2 = steps_table(os.path.join(out, "rl.h5"))
    files = sorted(glob.glob(os.path.join(out, "runs", "events.out.tfevents.*")))
    acc_first = EventAccumulator(first[0], size_guidance={"scalars": 0})
    acc_first.Reload()
    acc_second = EventAccumulator(files[-1], size_guidance={"scalars": 0})
    acc_second.Reload()
    check(len(files) == 2 and files[0] == first[0] and
          [e.step for e in acc_first.Scalars("train/reward")] == [0, 1, 2, 3] and
          [e.step for e in acc_second.Scalars("train/reward")] == [4, 5],
          f"--resume --max-steps 6: the first events file keeps steps 0-3, a second holds 4, 5 ({len(files)} files)")
    check_events(os.path.join(out, "runs"), table2, "tidal-rl --resume")
    check_jsonl(os.path.join(out, "metrics.jsonl"), table2, "tidal-rl --resume")
    same = len(table2["step"]) == 6 and all(np.array_equal(table[c], table2[c][:4], equal_nan=True)
                                            for c in table if not c.startswith("time_"))
    check(same, "--resume: the first four rows are the first run's (timing aside), two more after them")

    # ---- 3. tidal-sft --report-to tensorboard
    sft = os.path.join(tmp, "sft")
    sft_cmd = [os.path.join(BIN, "tidal-sft"), "--model-path", MODEL, "--dataset-path", "datasets/tasks/add",
               "--output-dir", sft, "--max-steps", "4", "--per-device-batch-size", "4", "--eval-steps", "2",
               "--eval-max-samples", "8", "--save-steps", "2"]
    sh(*sft_cmd, "--report-to", "tensorboard")
    st = steps_table(os.path.join(sft, "sft.h5"))
    check(list(st["step"]) == [1, 2, 3, 4], "tidal-sft: /steps/step 1..4")
    check_events(os.path.join(sft, "runs"), st, "tidal-sft")
    check(not os.path.exists(os.path.join(sft, "metrics.jsonl")), "tidal-sft --report-to tensorboard: no metrics.jsonl")
    # --resume with --max-steps 6: steps 1..4 stay in the first file, 5..6 go to a second one
    sft6 = [("6" if i and sft_cmd[i - 1] == "--max-steps" else a) for i, a in enumerate(sft_cmd)]
    sh(*sft6, "--report-to", "all", "--resume")
    st2 = steps_table(os.path.join(sft, "sft.h5"))
    files = sorted(glob.glob(os.path.join(sft, "runs", "events.out.tfevents.*")))
    first = EventAccumulator(files[0], size_guidance={"scalars": 0})
    first.Reload()
    check(len(files) == 2 and [e.step for e in first.Scalars("train/loss")] == [1, 2, 3, 4],
          f"tidal-sft --resume --max-steps 6: the first events file keeps steps 1-4, a second one added ({len(files)} files)")
    check_events(os.path.join(sft, "runs"), st2, "tidal-sft --resume")
    check(len(open(os.path.join(sft, "metrics.jsonl")).readlines()) == 2,
          "tidal-sft --resume --report-to all: metrics.jsonl from the resumed steps 5, 6 only")

    # ---- 4. tidal-sweep --report-to tensorboard: the runs side by side
    sweep_out = os.path.join(tmp, "sweep")
    cfg = os.path.join(tmp, "sweep.json")
    args = {RL_ARGS[i][2:]: RL_ARGS[i + 1] for i in range(0, len(RL_ARGS) - 1, 2)}
    args.update({"max-steps": 2, "quiet": True})
    json.dump({"output_dir": sweep_out, "tool": os.path.join(BIN, "tidal-rl"), "args": args,
               "grid": [{"axis": "seed", "seed": True, "values": {"s1": {"seed": 1}, "s2": {"seed": 2}}}]},
              open(cfg, "w"))
    sh(os.path.join(BIN, "tidal-sweep"), cfg, "--report-to", "tensorboard", "--no-report")
    # the multiplexer TensorBoard's server reads a --logdir with (simple_value migrated to the
    # scalars plugin's tensors, as its UI sees them)
    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(sweep_out)
    mux.Reload()
    content = mux.PluginRunToTagToContent("scalars")
    runs = sorted(content)
    check(runs == ["s1/runs", "s2/runs"] and all("train/reward" in content[r] for r in runs),
          f"tidal-sweep: tensorboard --logdir OUTPUT_DIR's scalars plugin finds both runs ({runs})")
    for r in ("s1", "s2"):
        t = steps_table(os.path.join(sweep_out, r, "rl.h5"))
        got = ([(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in mux.Tensors(r + "/runs", "train/reward")]
               if r + "/runs" in runs else [])
        check(got == [(int(s), float(np.float32(v))) for s, v in zip(t["step"], t["reward"])],
              f"tidal-sweep: run {r}'s train/reward is its own rl.h5's")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

sys.exit(1 if failures else 0)
