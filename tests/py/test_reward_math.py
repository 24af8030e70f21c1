"""datasets/rewards/math_boxed.py, the math reward of reports/rl/gpu's design (seconds):

1. the protocol tidal-rl speaks (one JSON object per completion in, one line out, in order) on
   hand-written cases whose grade a reader can check: the last \\boxed{} with nested braces,
   \\fbox, --require-think (R1-distilled: no </think> = no answer; a boxed answer inside the
   thinking does not count), normalisation (\\dfrac, \\left, units, x =, 1,000, 50\\%, 0.5 vs
   \\frac{1}{2}), wrong answers, countdown expressions (right, number used twice, number not
   given, wrong value), a conversational completion, a malformed line (0 and a message, the
   run goes on); reports/rl/gpu/prepare_data.py --countdown's records with tidal-task's own
   reference expressions boxed: all 60 graded right (and wrong with one + made -).
2. against HF's math-verify (the verifier oat runs by default) when it is installed: on every
   case where the reference and the boxed answer are plain forms both graders read, the default
   grader agrees with math_verify.verify; and --verifier math_verify runs through the script.
"""
import json
import re
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import check, failures  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "datasets", "rewards", "math_boxed.py")


def run(jobs, *flags, raw=None):
    text = raw if raw is not None else "".join(json.dumps(j) + "\n" for j in jobs)
    p = subprocess.run([sys.executable, SCRIPT, *flags], input=text, capture_output=True,
                       text=True, timeout=120)
    return p.returncode, [json.loads(l) for l in p.stdout.splitlines()], p.stderr


# (completion, answer, correct) under the default grader, no --require-think
CASES = [
    ("so the answer is \\boxed{42}.", "42", 1),
    ("first \\boxed{41} then \\boxed{42}", "42", 1),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1),
    ("\\boxed{\\frac12}", "\\frac{1}{2}", 1),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1),
    ("\\boxed{1/2}", "0.5", 1),
    ("\\boxed{\\left( 3, 4 \\right)}", "(3,4)", 1),
    ("\\boxed{x = 7}", "7", 1),
    ("\\boxed{5 \\text{ cm}}", "5", 1),
    ("\\boxed{1,000}", "1000", 1),
    ("\\boxed{50\\%}", "0.5", 1),
    ("\\boxed{30^\\circ}", "30", 1),
    ("\\fbox{12}", "12", 1),
    ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", 1),
    ("\\boxed{\\sqrt2}", "\\sqrt{2}", 1),
    ("\\boxed{43}", "42", 0),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0),
    ("the answer is 42", "42", 0),
    ("\\boxed{42", "42", 0),
]


def main():
    # 1. the protocol, in order
    jobs = [{"prompt": "p", "completion": c, "answer": a} for c, a, _ in CASES]
    rc, out, err = run(jobs)
    check(rc == 0 and len(out) == len(CASES), f"{len(CASES)} answers, exit 0 (rc {rc}: {err})")
    for (c, a, want), got in zip(CASES, out):
        check(got.get("correct") == want, f"{c!r} vs {a!r}: correct {want} (got {got})")
    check(out[-2]["formatted"] == 0 and out[0]["formatted"] == 1, "formatted: 1 with a box, 0 without")

    think = [
        {"completion": "hmm \\boxed{7} wait</think>The answer is \\boxed{8}.", "answer": "8"},
        {"completion": "hmm \\boxed{8} ... still thinking", "answer": "8"},
        {"completion": "</think>\\boxed{7}", "answer": "8"},
    ]
    rc, out, _ = run(think, "--require-think")
    check(rc == 0 and [o["correct"] for o in out] == [1, 0, 0],
          f"--require-think: after </think> only, none without it ({out})")
    check(out[1]["formatted"] == 0, "--require-think: no </think> = not formatted")

    cd = [
        ("\\boxed{(15+16)+(10+2)}", [10, 2, 16, 15], "43", 1),
        ("\\boxed{15 \\times 2 + 13}", [15, 2, 13], "43", 1),
        ("\\boxed{20*5 + 20 + 11 = 131}", [5, 11, 20, 20], "131", 1),
        ("\\boxed{15+15+13}", [15, 2, 13], "43", 0),          # 15 used twice
        ("\\boxed{40+3}", [15, 2, 13], "43", 0),              # numbers not given
        ("\\boxed{15+2+13}", [15, 2, 13], "43", 0),           # 30
        ("\\boxed{15/0+2}", [15, 0, 2], "43", 0),
        ("\\boxed{__import__('os')}", [1], "1", 0),
    ]
    rc, out, _ = run([{"completion": c, "numbers": n, "answer": a} for c, n, a, _ in cd])
    for (c, n, a, want), got in zip(cd, out):
        check(got["correct"] == want, f"countdown {c!r} over {n} = {a}: {want} (got {got})")

    conv = {"completion": [{"role": "assistant", "content": "\\boxed{9}"}], "answer": "9"}
    rc, out, err = run(None, raw=json.dumps(conv) + "\n{not json\n" + json.dumps(conv) + "\n")
    check(rc == 0 and [o["correct"] for o in out] == [1, 0, 1],
          f"conversational completion graded; a malformed line answers 0 and the run goes on ({out})")
    check("stdin line 2" in err, f"the malformed line is named on stderr ({err.strip()!r})")

    # tidal-task's own countdown solutions, boxed, through prepare_data.py's records: all right
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        build = os.environ.get("BUILD", "build")
        subprocess.run([os.path.join(build, "bin", "tidal-task"), "generate", "--task", "countdown",
                        "--seed", "7", "--train-size", "60", "--test-size", "1", "-o", d + "/t"],
                       check=True, capture_output=True)
        p = subprocess.run([sys.executable, os.path.join(ROOT, "reports", "rl", "gpu", "prepare_data.py"),
                            "--countdown", "60", "--seed", "7", "--test-size", "10", "-o", d + "/p"],
                           capture_output=True, text=True, env=dict(os.environ, BUILD=build))
        check(p.returncode == 0, f"prepare_data.py --countdown runs ({p.stderr.strip()[-200:]})")
        ref = [json.loads(l) for l in open(d + "/t/train.jsonl")]
        got = [json.loads(l) for l in open(d + "/p/train.jsonl")] + \
              [json.loads(l) for l in open(d + "/p/test.jsonl")]
        check(len(got) == 60 and all("\\boxed{}" in g["prompt"] and g["prompt"].endswith("<think>\n")
                                     for g in got), "60 records in the r1_distill_qwen template")
        jobs = [dict(g, completion="</think>\\boxed{" + r["completion"].splitlines()[-1] + "}")
                for g, r in zip(got, ref)]
        rc, out, _ = run(jobs, "--require-think")
        check(rc == 0 and sum(o["correct"] for o in out) == 60,
              f"tidal-task's 60 reference expressions graded right ({sum(o['correct'] for o in out)})")
        bad = [dict(j, completion=j["completion"].replace("+", "-", 1)) for j in jobs]
        rc, out, _ = run(bad, "--require-think")
        check(sum(o["correct"] for o in out) <= 6, "the same with one + made - mostly wrong")

    # 2. against HF's math-verify
    try:
        from math_verify import parse, verify
    except ImportError:
        print("math-verify not installed: the cross-check is skipped (.ci/deps.sh installs it)")
        return 1 if failures else 0
    agree = 0
    for c, a, want in CASES:
        m = re.search(r"\\boxed\{(.*)\}", c)
        if (not m or c.count("\\boxed") > 1 or "\\text" in c or "%" in c or "x =" in c
                or "circ" in c or "1,000" in c):
            continue      # forms the graders read differently on purpose (math_verify takes
                          # the first of several boxes; oat's and this grader the last)
        mv = int(bool(verify(parse("$" + a + "$"), parse(c))))
        check(mv == want, f"math_verify agrees on {c!r} vs {a!r}: {want} (math_verify {mv})")
        agree += 1
    check(agree >= 10, f"at least 10 cases cross-checked ({agree})")
    rc, out, err = run(jobs[:3], "--verifier", "math_verify")
    check(rc == 0 and [o["correct"] for o in out] == [1, 1, 1],
          f"--verifier math_verify grades through the script ({out} {err.strip()[-200:]})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
