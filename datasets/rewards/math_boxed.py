#!/usr/bin/env python3
"""A reward for tidal-rl --reward-command: the final \\boxed{} answer of a math completion.

    tidal-rl ... --dataset-path math.jsonl \\
        --reward-command "python3 datasets/rewards/math_boxed.py --require-think"

Records carry the reference as TRL math datasets do (MATH, the FP16 paper's sanity test):
{"prompt": ..., "answer": "\\frac{1}{2}"}; a record with "numbers" is a countdown problem
(reports/rl/gpu/prepare_data.py): the boxed expression must use those numbers, each at most
once, and equal "answer".

tidal writes one JSON object per completion on stdin (the record's fields, "prompt",
"completion", "completion_ids"); this script answers one line per completion, in order:

    {"correct": 1 or 0, "formatted": 1 if a \\boxed{} answer was found, else 0}

Grading, as the reasoning-RL recipes do (Dr. GRPO / oat's "fast" grader, DeepSeek's usage
notes for R1-distilled models):
- the answer is the content of the LAST \\boxed{...} (or \\fbox{...}), braces balanced; with
  --require-think only the text after the last </think> counts (an R1-distilled model that
  never closed its thinking has no answer);
- both sides are normalised (spaces, \\left/\\right, \\!, \\, and friends, \\dfrac/\\tfrac ->
  \\frac, a \\text{...} unit after a number, a trailing period, $ signs, "x =" prefixes, degree
  signs, thousands separators) and compared as strings, then as numbers (fractions, decimals,
  percentages within 1e-9 relative) when both parse;
- --verifier math_verify uses HF's math-verify package instead (pip install math-verify), as
  oat's default verifier does; it is not needed for the default grader.

A truncated completion is graded like any other: give tidal-rl --mask-truncated-completions to
keep it out of the loss, as TRL does. Diagnostics go to stderr; stdout carries only the rewards.
"""
import argparse
import ast
import fractions
import json
import operator
import re
import sys


def last_boxed(text):
    """The content of the last \\boxed{...} / \\fbox{...} in text, braces balanced, or None."""
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            best = text[m.end():i - 1]
    return best


SPACES = re.compile(r"\\[,;:! ]|\\quad|\\qquad|~")


def strip_braced(s, cmd):
    """\\cmd{x} -> x, nested braces kept balanced."""
    out, i = [], 0
    key = "\\" + cmd + "{"
    while True:
        j = s.find(key, i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        out.append(s[i:j])
        depth, k = 1, j + len(key)
        while k < len(s) and depth:
            depth += {"{": 1, "}": -1}.get(s[k], 0)
            k += 1
        out.append(s[j + len(key):k - 1])
        i = k


def normalise(s):
    s = s.strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = SPACES.sub("", s)
    s = s.replace("$", "").replace("^\\circ", "").replace("^{\\circ}", "").replace("°", "")
    s = s.replace("\\%", "%")
    s = re.sub(r"^(?:[a-zA-Z]\s*=\s*)", "", s)            # "x = 3" -> "3"
    m = re.match(r"^([-+]?[\d.,/]+)\s*\\(?:text|mbox|mathrm)\{[^{}]*\}$", s)
    if m:                                                 # "5 \text{ cm}" -> "5"
        s = m.group(1)
    for cmd in ("text", "mbox", "mathrm", "textbf"):
        s = strip_braced(s, cmd)
    s = s.replace(" ", "").rstrip(".")
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")                            # 1,000 -> 1000
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)   # \frac12 -> \frac{1}{2}
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)
    return s


def as_number(s):
    """A normalised answer as an exact fraction, or None."""
    pct = s.endswith("%")
    if pct:
        s = s[:-1]
    m = re.fullmatch(r"([-+]?)\\frac\{([-+]?\d+)\}\{([-+]?\d+)\}", s)
    try:
        if m:
            v = fractions.Fraction(int(m.group(2)), int(m.group(3)))
            v = -v if m.group(1) == "-" else v
        elif re.fullmatch(r"[-+]?(\d+(\.\d*)?|\.\d+)(/\d+)?", s):
            v = fractions.Fraction(s)
        else:
            return None
    except (ValueError, ZeroDivisionError):
        return None
    return v / 100 if pct else v


def same_answer(pred, ref):
    a, b = normalise(pred), normalise(ref)
    if a == b:
        return True
    x, y = as_number(a), as_number(b)
    if x is None or y is None:
        return False
    return x == y or abs(x - y) <= 1e-9 * max(abs(x), abs(y))


OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.Div: operator.truediv}


def countdown_value(expr, numbers):
    """The value of an arithmetic expression over `numbers` (each at most once), or None."""
    expr = expr.replace("\\times", "*").replace("\\cdot", "*").replace("\\div", "/")
    expr = expr.replace("×", "*").replace("÷", "/").replace("{", "(").replace("}", ")")
    expr = expr.split("=")[0]
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return None
    pool = list(numbers)

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.BinOp) and type(n.op) in OPS:
            return OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.Constant) and isinstance(n.value, int) and not isinstance(n.value, bool):
            if n.value not in pool:
                raise ValueError("number not given or used twice")
            pool.remove(n.value)
            return fractions.Fraction(n.value)
        raise ValueError("not arithmetic")

    try:
        return ev(tree)
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


def grade(job, require_think, verifier):
    text = job.get("completion", "")
    if isinstance(text, list):                       # conversational: the assistant's content
        text = "".join(m.get("content", "") for m in text if isinstance(m, dict))
    if require_think:
        k = text.rfind("</think>")
        if k < 0:
            return {"correct": 0, "formatted": 0}
        text = text[k + len("</think>"):]
    pred = last_boxed(text)
    if pred is None:
        return {"correct": 0, "formatted": 0}
    ref = str(job.get("answer", job.get("solution", "")))
    if "numbers" in job:
        v = countdown_value(pred, [int(x) for x in job["numbers"]])
        ok = v is not None and as_number(normalise(ref)) == v
    elif verifier == "math_verify":
        from math_verify import parse, verify
        ok = bool(verify(parse("$" + ref + "$"), parse("\\boxed{" + pred + "}")))
    else:
        ok = same_answer(pred, ref)
    return {"correct": int(ok), "formatted": 1}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--require-think", action="store_true",
                    help="grade only the text after the last </think> (R1-distilled models)")
    ap.add_argument("--verifier", choices=("fast", "math_verify"), default="fast",
                    help="the default string/number grader, or HF math-verify")
    a = ap.parse_args()
    if a.verifier == "math_verify":
        try:
            import math_verify  # noqa: F401
        except ImportError:
            print("math_boxed.py: --verifier math_verify needs `pip install math-verify`",
                  file=sys.stderr)
            return 2
    for n, line in enumerate(sys.stdin, 1):
        try:
            out = grade(json.loads(line), a.require_think, a.verifier)
        except (ValueError, TypeError, AttributeError) as e:
            print(f"math_boxed.py: stdin line {n}: {type(e).__name__}: {e}", file=sys.stderr)
            out = {"correct": 0, "formatted": 0}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
