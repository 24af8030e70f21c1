"""Independent Python check of the task datasets and rewards (src/tasks/, tools/tidal-task.c).

The reference is plain Python: int() sums for add, sorted() for sort, and for countdown the
expression parsed by Python's own parser (ast) and evaluated in exact integers, every division
checked for a remainder, the numbers counted with collections.Counter. It checks:

1. every shipped folder in datasets/tasks/ comes out byte for byte the same when its
   generation.json command runs again (the generator is deterministic across builds);
2. every shipped record: characters inside the documented alphabet, ids unique, the prompt in
   the split FNV-1a-64 % 8 gives it, train and test disjoint, prompts distinct, the knobs of
   generation.json, and the reference completion right step by step (each scratch-pad column
   sum of add; each countdown step exact, consuming the given numbers; the final expression
   reaching the target with every number once; the sorted list);
3. tidal-task score gives, on the reference completions and on mutations of them (edits,
   truncations, EOS cuts, garbage, reused numbers, inexact division, overlong text), the reward,
   exact and parsed flags this file's Python verifiers give;
4. the tool's contract: --help on stdout with exit 0, usage errors exit 2, an existing output is
   not replaced without --force (exit 1, file untouched), bad completion lines named by file
   and line.
Exit 0 pass, 1 fail.
"""
import ast
import json
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
from collections import Counter

BUILD = os.environ.get("BUILD", "build")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, BUILD, "bin", "tidal-task")
DATA = os.path.join(ROOT, "datasets", "tasks")
ALPHABET = set("0123456789abcdefghijklmnopqrstuvwxyz +-*/=()\n")
EOS = "<eos>"
MAX_COMPLETION = 4096
INT64 = (-(1 << 63), (1 << 63) - 1)

sys.setrecursionlimit(20000)
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        if len(failures) <= 30:
            print("FAIL:", msg)


def fnv1a(s):
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# ---- the verifiers, written from the spec in include/tidal/tasks.h ----

def answer_line(text):
    """The common preparation: cut at EOS, overlong -> None, trailing spaces/newlines, last line."""
    i = text.find(EOS)
    if i >= 0:
        text = text[:i]
    if len(text.encode()) > MAX_COMPLETION:
        return None
    return text.rstrip(" \n").rsplit("\n", 1)[-1]


def reward_add(prompt, answer, line):
    a, b = prompt[:-1].split("+")
    truth = str(int(a) + int(b))
    assert truth == answer
    if not re.fullmatch(r"[0-9]{1,80}", line):
        return 0.0, False
    if line == truth:
        return 1.0, True
    same = sum(1 for k in range(1, min(len(line), len(truth)) + 1) if line[-k] == truth[-k])
    return same / max(len(line), len(truth)), True


def reward_sort(prompt, answer, line):
    want = sorted(int(x) for x in prompt[len("sort "):-1].split(" "))
    assert " ".join(map(str, want)) == answer
    if not re.fullmatch(r"[0-9]{1,9}( [0-9]{1,9})*", line):
        return 0.0, False
    got = [int(x) for x in line.split(" ")]
    if got == want:
        return 1.0, True
    same = sum(1 for x, y in zip(got, want) if x == y)
    return same / max(len(got), len(want)), True


class Invalid(Exception):
    pass


def evaluate(node, literals):
    """Exact integer value of an ast of int constants and + - * /; Invalid for a division with a
    remainder or by zero or a value outside int64; ValueError for any other construct."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        literals.append(node.value)
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult, ast.Div):
        a, b = evaluate(node.left, literals), evaluate(node.right, literals)
        if isinstance(node.op, ast.Add):
            v = a + b
        elif isinstance(node.op, ast.Sub):
            v = a - b
        elif isinstance(node.op, ast.Mult):
            v = a * b
        else:
            if b == 0 or a % b != 0:
                raise Invalid()
            v = a // b
        if not INT64[0] <= v <= INT64[1]:
            raise Invalid()
        return v
    raise ValueError("not an arithmetic expression")


def parse_countdown(prompt):
    m = re.fullmatch(r"reach ([0-9]+) with((?: [0-9]+)+)\n", prompt)
    return int(m.group(1)), [int(x) for x in m.group(2).split()]


def paren_depth(s):
    d = best = 0
    for c in s:
        d += c == "("
        d -= c == ")"
        best = max(best, d)
    return best


def reward_countdown(prompt, answer, line):
    target, numbers = parse_countdown(prompt)
    assert str(target) == answer
    if not re.fullmatch(r"[0-9+\-*/()]+", line) or re.search(r"(?<![0-9])0[0-9]", line) or paren_depth(line) > 64:
        return 0.0, False
    try:
        tree = ast.parse(line, mode="eval").body
    except SyntaxError:
        return 0.0, False
    literals = []
    try:
        value = evaluate(tree, literals)
    except ValueError:
        return 0.0, False
    except Invalid:
        # still well-formed: make sure the rest of the tree is arithmetic too
        try:
            evaluate_shape(tree)
        except ValueError:
            return 0.0, False
        return 0.1, True
    if Counter(literals) - Counter(numbers) or value != target:
        return 0.1, True
    return 1.0, True


def evaluate_shape(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return
    if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult, ast.Div):
        evaluate_shape(node.left)
        evaluate_shape(node.right)
        return
    raise ValueError()


GRADERS = {"add": reward_add, "sort": reward_sort, "countdown": reward_countdown}


def reward(rec, completion):
    line = answer_line(completion)
    if line is None:
        return 0.0, False, False
    r, parsed = GRADERS[rec["task"]](rec["prompt"], rec["answer"], line)
    return r, r == 1.0, parsed


# ---- 2. the records and their reference completions ----

def check_reference(rec):
    rid, task, prompt, done = rec["id"], rec["task"], rec["prompt"], rec["completion"]
    lines = done.split("\n")
    if task == "add":
        a, b = prompt[:-1].split("+")
        check(len(a) == len(b) == rec["digits"] and a[0] != "0" and b[0] != "0", "%s: operands %r %r" % (rid, a, b))
        carry, cols = 0, []
        for i in range(rec["digits"]):
            x, y = int(a[-1 - i]), int(b[-1 - i])
            s = x + y + carry
            cols.append("%d+%d+%d=%02d" % (x, y, carry, s))
            carry = s // 10
        check(lines == cols + [str(int(a) + int(b))], "%s: scratch-pad or sum wrong: %r" % (rid, done))
    elif task == "sort":
        nums = [int(x) for x in prompt[len("sort "):-1].split(" ")]
        check(len(nums) == rec["count"] and all(0 <= x < 10 ** rec["digits"] for x in nums), "%s: list %r" % (rid, nums))
        check(done == " ".join(map(str, sorted(nums))), "%s: not sorted(): %r" % (rid, done))
    else:
        target, nums = parse_countdown(prompt)
        check(len(nums) == rec["count"] and all(1 <= x <= rec["max_value"] for x in nums), "%s: numbers %r" % (rid, nums))
        check(target not in nums and 1 <= target <= rec["max_target"], "%s: target %d" % (rid, target))
        pool = Counter(nums)
        for step in lines[:-1]:
            m = re.fullmatch(r"([0-9]+)([-+*/])([0-9]+)=([0-9]+)", step)
            check(m is not None, "%s: step %r" % (rid, step))
            if not m:
                return
            x, op, y, z = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
            v = {"+": x + y, "-": x - y, "*": x * y, "/": x // y if y and x % y == 0 else None}[op]
            check(v == z and 0 < z <= rec["max_target"], "%s: step %r is wrong" % (rid, step))
            check(pool[x] > 0 and (pool[y] > (x == y)), "%s: step %r uses a number not available" % (rid, step))
            pool[x] -= 1
            pool[y] -= 1
            pool[z] += 1
        check(+pool == Counter([target]), "%s: steps end with %r, not the target" % (rid, +pool))
        literals = []
        check(evaluate(ast.parse(lines[-1], mode="eval").body, literals) == target, "%s: expression misses" % rid)
        check(Counter(literals) == Counter(nums), "%s: expression does not use every number once" % rid)
    check(reward(rec, done) == (1.0, True, True), "%s: Python reward of the reference is %r" % (rid, reward(rec, done)))


def check_folder(name):
    folder = os.path.join(DATA, name)
    meta = json.load(open(os.path.join(folder, "generation.json")))
    splits = {}
    for split in ("train", "test"):
        recs = [json.loads(l) for l in open(os.path.join(folder, split + ".jsonl"))]
        check(len(recs) == meta[split]["records"], "%s/%s: %d records, generation.json says %d" % (name, split, len(recs), meta[split]["records"]))
        for r in recs:
            for key in ("prompt", "completion", "answer"):
                bad = set(r[key]) - ALPHABET
                check(not bad, "%s: %s has characters outside the alphabet: %r" % (r["id"], key, bad))
            check(r["task"] == meta["task"] and r["split"] == split, "%s: task/split fields" % r["id"])
            for k, v in meta["knobs"].items():
                check(r[k] == v, "%s: knob %s = %r, generation.json %r" % (r["id"], k, r[k], v))
            check((fnv1a(r["prompt"]) % 8 == 0) == (split == "test"), "%s: prompt in the wrong split" % r["id"])
            check(r["prompt"].endswith("\n") and "\n" not in r["prompt"][:-1], "%s: prompt shape" % r["id"])
            check_reference(r)
        prompts = [r["prompt"] for r in recs]
        check(len(set(prompts)) == len(prompts), "%s/%s: repeated prompts" % (name, split))
        check(len({r["id"] for r in recs}) == len(recs), "%s/%s: repeated ids" % (name, split))
        splits[split] = recs
    shared = {r["prompt"] for r in splits["train"]} & {r["prompt"] for r in splits["test"]}
    check(not shared, "%s: train and test share %d prompts" % (name, len(shared)))
    return meta, splits


# ---- 1. regenerate from the recorded command ----

def regenerate(name, meta, tmp):
    argv = shlex.split(meta["command"])
    out = os.path.join(tmp, "regen-" + name)
    i = argv.index("-o") if "-o" in argv else argv.index("--output-dir")
    argv[i + 1] = out
    argv[0] = TOOL
    p = subprocess.run(argv, capture_output=True, text=True)
    check(p.returncode == 0, "%s: regeneration failed: %s" % (name, p.stderr))
    for f in ("train.jsonl", "test.jsonl"):
        a = open(os.path.join(DATA, name, f), "rb").read()
        b = open(os.path.join(out, f), "rb").read() if p.returncode == 0 else b""
        check(a == b, "%s/%s: regenerated file differs from the shipped one" % (name, f))


# ---- 3. the C rewards against these ----

def mutations(rec, rng):
    ref = rec["completion"]
    last = ref.rsplit("\n", 1)[-1]
    head = ref[: len(ref) - len(last)]
    alpha = sorted(ALPHABET)
    out = [ref, ref + EOS + "junk 1+1", ref + "\n", ref + "  \n\n", "", EOS, ref[:-1], ref[: rng.randrange(len(ref))],
           head, "\n".join(ref.split("\n")[:-1]), ref + "\n" + last, ref * (MAX_COMPLETION // len(ref) + 2),
           "".join(rng.choice(alpha) for _ in range(rng.randrange(1, 40))), " " + last, last + last[-1]]
    for _ in range(12):   # one edit inside the answer line
        k = rng.randrange(len(last) + 1)
        kind = rng.randrange(3)
        c = rng.choice("0123456789+-*/() " if rec["task"] != "sort" else "0123456789 ")
        edited = last[:k] + c + last[k + 1:] if kind == 0 else last[:k] + last[k + 1:] if kind == 1 else last[:k] + c + last[k:]
        out.append(head + edited)
    if rec["task"] == "sort":
        xs = last.split(" ")
        i, j = rng.randrange(len(xs)), rng.randrange(len(xs))
        xs[i], xs[j] = xs[j], xs[i]
        out.append(" ".join(xs))
        out.append(last + " 5")
    if rec["task"] == "countdown":
        target, nums = parse_countdown(rec["prompt"])
        lits = re.findall(r"[0-9]+", last)
        # a number used twice: replace one literal by another given number
        if len(lits) > 1:
            out.append(re.sub(r"\b%s\b" % lits[0], lits[1], last, count=1))
        out += [last + "/7", last + "*1", "(" + last + ")/" + str(nums[0]), last + "+0", str(target), "-" + last,
                last + "-" + last, "(" * 70 + last + ")" * 70, last.replace("(", "", 1)]
    return out


def cross_check(all_recs, tmp):
    data = os.path.join(tmp, "data.jsonl")
    comp = os.path.join(tmp, "completions.jsonl")
    rng = random.Random(2026)
    rows = []
    with open(data, "w") as fd, open(comp, "w") as fc:
        for rec in all_recs:
            fd.write(json.dumps(rec) + "\n")
            for text in mutations(rec, rng):
                fc.write(json.dumps({"id": rec["id"], "completion": text}) + "\n")
                rows.append((rec, text))
    p = subprocess.run([TOOL, "score", "--dataset-path", data, "--completions", comp], capture_output=True, text=True)
    check(p.returncode == 0, "score failed: %s" % p.stderr)
    got = [json.loads(l) for l in p.stdout.splitlines()]
    check(len(got) == len(rows), "score wrote %d rows for %d completions" % (len(got), len(rows)))
    total = 0.0
    kinds = Counter()
    for (rec, text), g in zip(rows, got):
        want = reward(rec, text)
        total += want[0]
        kinds[(rec["task"], "exact" if want[1] else "unparsable" if not want[2] else "partial" if want[0] > 0 else "zero")] += 1
        ok = g["id"] == rec["id"] and abs(g["reward"] - want[0]) <= 1e-12 and g["exact"] == want[1] and g["parsed"] == want[2]
        check(ok, "%s: completion %r: tidal %r, Python (reward, exact, parsed) %r" % (rec["id"], text[:120], g, want))
    m = re.search(r"mean reward ([0-9.]+)", p.stderr)
    check(m and abs(float(m.group(1)) - total / len(rows)) < 1e-6, "summary line %r, Python mean %.6f" % (p.stderr, total / len(rows)))
    print("cross-check: %d completions of %d records; outcomes %s" % (len(rows), len(all_recs), dict(sorted(kinds.items()))))


# ---- 4. the tool's contract ----

def tool_contract(tmp):
    p = subprocess.run([TOOL, "generate", "--help"], capture_output=True, text=True)
    check(p.returncode == 0 and "--train-size" in p.stdout, "generate --help: rc %d" % p.returncode)
    p = subprocess.run([TOOL, "--version"], capture_output=True, text=True)
    check(p.returncode == 0 and p.stdout.startswith("tidal-task (tidal) "), "--version")
    for argv in (["generate", "--task", "mul", "-o", tmp + "/x"], ["generate", "--task", "add", "-o", tmp + "/x", "--count", "3"],
                 ["generate", "--task", "add"], ["score", "--bogus"], ["frobnicate"], []):
        p = subprocess.run([TOOL] + argv, capture_output=True, text=True)
        check(p.returncode == 2 and p.stderr, "%r: rc %d (expected a usage error, 2)" % (argv, p.returncode))
    out = os.path.join(tmp, "gen")
    p = subprocess.run([TOOL, "generate", "--task", "sort", "--train-size", "20", "--test-size", "5", "-o", out], capture_output=True, text=True)
    check(p.returncode == 0, "generate: %s" % p.stderr)
    before = open(os.path.join(out, "train.jsonl"), "rb").read()
    p = subprocess.run([TOOL, "generate", "--task", "sort", "--seed", "9", "--train-size", "20", "--test-size", "5", "-o", out],
                       capture_output=True, text=True)
    check(p.returncode == 1 and "already exists" in p.stderr, "overwrite without --force: rc %d %s" % (p.returncode, p.stderr))
    check(open(os.path.join(out, "train.jsonl"), "rb").read() == before, "the refused run changed train.jsonl")
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"completion": "1"}\n\n{"completion": 7}\n')
    p = subprocess.run([TOOL, "score", "--dataset-path", os.path.join(out, "train.jsonl"), "--completions", bad], capture_output=True, text=True)
    check(p.returncode == 1 and bad + ":3:" in p.stderr, "bad completion line: rc %d %r" % (p.returncode, p.stderr))
    dup = os.path.join(tmp, "dup.jsonl")
    rec = '{"id": "a", "task": "add", "prompt": "1+2\\n", "answer": "3"}\n'
    open(dup, "w").write(rec + rec)
    open(bad, "w").write('{"id": "a", "completion": "3"}\n')
    p = subprocess.run([TOOL, "score", "--dataset-path", dup, "--completions", bad], capture_output=True, text=True)
    check(p.returncode == 1 and "lines 1 and 2" in p.stderr, "repeated dataset ids: rc %d %r" % (p.returncode, p.stderr))


def main():
    if not os.access(TOOL, os.X_OK):
        print("FAIL: %s not built" % TOOL)
        return 1
    names = sorted(d for d in os.listdir(DATA) if os.path.isfile(os.path.join(DATA, d, "generation.json")))
    check(len({n.split("-")[0] for n in names}) >= 3, "fewer than three tasks shipped: %r" % names)
    all_recs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            meta, splits = check_folder(name)
            regenerate(name, meta, tmp)
            for r in splits["test"] + splits["train"][:60]:   # ids are unique within a folder: make them so across
                all_recs.append(dict(r, id=name + "/" + r["id"]))
            print("%-16s %4d train %4d test, mean response tokens %.1f / %.1f: checked" % (
                name, len(splits["train"]), len(splits["test"]),
                sum(len(r["completion"]) + 1 for r in splits["train"]) / len(splits["train"]),
                sum(len(r["completion"]) + 1 for r in splits["test"]) / len(splits["test"])))
        cross_check(all_recs, tmp)
        tool_contract(tmp)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
