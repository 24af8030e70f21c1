#!/usr/bin/env python3
"""Records for the GPU collapse experiment (reports/rl/gpu/README.md), in the shape tidal-rl reads
as a TRL user's own task ({"prompt": str, "answer": ..., other fields}) with the prompt template
the FP16 paper's sanity test applies (oat's `r1_distill_qwen`, or `qwen_math` for Qwen2.5 base
models), scored by datasets/rewards/math_boxed.py.

    # the FP16 paper's sanity-test problems (sail/Sanity-Test-R1D-1.5B, 1,460 MATH problems
    # with "problem" and "answer"), downloaded by you as .jsonl, .json or .parquet:
    python3 reports/rl/gpu/prepare_data.py --math sanity.parquet -o build/rl/gpu/data
    # or a task tidal generates, no download: countdown (TinyZero's task) with 4 numbers
    python3 reports/rl/gpu/prepare_data.py --countdown 4000 -o build/rl/gpu/data

Writes OUT/train.jsonl and OUT/test.jsonl (the last --test-size records held out, for tidal-rl's
clean evaluation, --eval-steps) and OUT/generation.json (this command line, the counts).
"""
import argparse
import json
import os
import subprocess
import sys

TEMPLATES = {
    # oat/main.py apply_r1_distill_qwen_template (DeepSeek-R1's usage recommendations)
    "r1_distill_qwen": lambda q: ("<｜begin▁of▁sentence｜><｜User｜>" + q
                                  + " Please reason step by step, and put your final answer"
                                  " within \\boxed{}.\n<｜Assistant｜><think>\n"),
    # oat/main.py apply_qwen_math_template
    "qwen_math": lambda q: ("<|im_start|>system\nPlease reason step by step, and put your final"
                            " answer within \\boxed{}.<|im_end|>\n<|im_start|>user\n" + q
                            + "<|im_end|>\n<|im_start|>assistant\n"),
}


def read_records(path):
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            sys.exit(f"prepare_data.py: {path}: reading .parquet needs pyarrow (pip install "
                     "pyarrow), or give the records as .jsonl")
        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8-sig") as f:
        text = f.read()
    if path.endswith(".json") and text.lstrip().startswith("["):
        return json.loads(text)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError as e:
                sys.exit(f"prepare_data.py: {path}:{n}: not JSON ({e})")
    return out


def math_records(path, template, qkey, akey):
    recs = []
    for n, r in enumerate(read_records(path), 1):
        if qkey not in r or akey not in r:
            sys.exit(f"prepare_data.py: {path}: record {n} lacks \"{qkey}\" or \"{akey}\" "
                     f"(has {sorted(r)}; --question-key/--answer-key name them)")
        recs.append({"prompt": TEMPLATES[template](str(r[qkey])), "answer": str(r[akey]),
                     "source": os.path.basename(path), "index": n - 1})
    return recs


def countdown_records(n, seed, tidal_task):
    """tidal-task's countdown problems (a reachable target, 4 numbers up to 20), asked in words."""
    tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tidal-countdown-{os.getpid()}")
    subprocess.run([tidal_task, "generate", "--task", "countdown", "--seed", str(seed),
                    "--length", "short", "--train-size", str(n), "--test-size", "1",
                    "--output-dir", tmp], check=True, stdout=subprocess.DEVNULL)
    recs = []
    for r in read_records(os.path.join(tmp, "train.jsonl")):
        words = r["prompt"].split()          # "reach 43 with 10 2 16 15"
        target, numbers = int(words[1]), [int(w) for w in words[3:]]
        q = (f"Using the numbers {numbers}, create an equation that equals {target}. You can use "
             "basic arithmetic operations (+, -, *, /) and each number can only be used once.")
        recs.append({"prompt": q, "answer": str(target), "numbers": numbers, "id": r["id"]})
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)
    return recs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--math", metavar="FILE", help="math problems (.jsonl/.json/.parquet)")
    src.add_argument("--countdown", metavar="N", type=int, help="N countdown problems from tidal-task")
    ap.add_argument("-o", "--output-dir", required=True)
    ap.add_argument("--template", choices=sorted(TEMPLATES), default="r1_distill_qwen")
    ap.add_argument("--question-key", default="problem")
    ap.add_argument("--answer-key", default="answer")
    ap.add_argument("--test-size", type=int, default=100, help="records held out (default 100)")
    ap.add_argument("--seed", type=int, default=2026, help="countdown's generator seed")
    ap.add_argument("--tidal-task", default=os.path.join(os.environ.get("BUILD", "build"), "bin", "tidal-task"))
    a = ap.parse_args()
    if a.math:
        recs = math_records(a.math, a.template, a.question_key, a.answer_key)
    else:
        recs = countdown_records(a.countdown, a.seed, a.tidal_task)
        for r in recs:
            r["prompt"] = TEMPLATES[a.template](r["prompt"])
    if len(recs) <= a.test_size:
        sys.exit(f"prepare_data.py: {len(recs)} records, not more than --test-size {a.test_size}")
    os.makedirs(a.output_dir, exist_ok=True)
    train, test = recs[:-a.test_size], recs[-a.test_size:]
    for name, part in (("train", train), ("test", test)):
        with open(os.path.join(a.output_dir, name + ".jsonl"), "w", encoding="utf-8") as f:
            for r in part:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(a.output_dir, "generation.json"), "w") as f:
        json.dump({"command": [os.path.basename(sys.argv[0])] + sys.argv[1:], "template": a.template,
                   "train": len(train), "test": len(test)}, f, indent=1)
        f.write("\n")
    print(f"prepare_data.py: {len(train)} train + {len(test)} test records in {a.output_dir}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
