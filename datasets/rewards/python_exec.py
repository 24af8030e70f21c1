#!/usr/bin/env python3
"""A reward for tidal-rl --reward-command that runs generated Python against the record's tests.

    tidal-rl ... --dataset-path code.jsonl \
        --reward-command "python3 datasets/rewards/python_exec.py --timeout 2 --memory-mb 256" \
        --reward-weights passed=1,compiled=0.1

Each record carries its tests as TRL datasets do (MBPP's "test_list" or "tests": a list of
Python statements, usually asserts; optional "test_setup_code"):

    {"prompt": [{"role": "user", "content": "Write add(a, b)."}], "tests": ["assert add(2, 3) == 5"]}

tidal writes one JSON object per completion on stdin (the record's fields, "prompt",
"completion", "completion_ids"); this script answers one line per completion, in order:

    {"passed": <share of the tests that passed>, "compiled": <1 if the code compiled, else 0>}

The code is the completion's first ```python fenced block if it has one, else its whole text.
It runs in a fresh `python3 -I` (isolated: no user site, no PYTHON* variables) per completion,
in an empty temporary directory, in its own session (a timeout kills everything it started),
with rlimits on address space (--memory-mb), CPU seconds and written file size, no stdin, and a
wall-clock --timeout; completions run in parallel on --workers threads and are answered in
order. This keeps a wrong or runaway program from hurting the run; it is not a sandbox against
code written to escape (it can still read files and use the network): for that run this script
inside a container or a jail (bubblewrap, nsjail, firejail) with the same interface.
tidal itself never executes generated text: only this script, which you chose, does.

Diagnostics go to stderr; stdout carries only the rewards.
"""
import argparse
import collections
import concurrent.futures as cf
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

# Runs inside the child: sets its limits (argv[2] MiB of address space, argv[3] CPU seconds),
# compiles and runs the code, then each test, and writes the counts as JSON to the file named by
# argv[1] (not stdout, which the generated program may fill).
HARNESS = r"""
import contextlib, io, json, resource, sys
result, mem, cpu = sys.argv[1], int(sys.argv[2]) << 20, int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
job = json.loads(sys.stdin.read())
out = {"compiled": 0, "passed": 0, "total": len(job["tests"])}
def save():
    with open(result, "w") as f:
        json.dump(out, f)
save()
sink = io.StringIO()
g = {"__name__": "__main__"}
try:
    code = compile(job["code"], "<completion>", "exec")
    out["compiled"] = 1
    save()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        exec(job.get("setup", ""), g)
        exec(code, g)
except BaseException:
    pass
for t in job["tests"]:
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            exec(t, g)
        out["passed"] += 1
        save()
    except BaseException:
        pass
"""

FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.S)


def completion_text(c):
    """TRL's completion: a string, or [{"role": "assistant", "content": ...}]."""
    if isinstance(c, list):
        return "".join(m.get("content", "") for m in c if isinstance(m, dict))
    return c if isinstance(c, str) else ""


def extract_code(text):
    m = FENCE.search(text)
    return m.group(1) if m else text


def score(record, args):
    tests = record.get("tests", record.get("test_list", []))
    if isinstance(tests, str):
        tests = [tests]
    code = extract_code(completion_text(record.get("completion", "")))
    job = json.dumps({"code": code, "tests": tests, "setup": record.get("test_setup_code", "")})
    with tempfile.TemporaryDirectory(prefix="tidal-reward-") as d:
        result = os.path.join(d, "result.json")
        try:
            cpu = str(max(1, int(args.timeout + 0.999)))
            subprocess.run([sys.executable, "-I", "-c", HARNESS, result, str(args.memory_mb), cpu], input=job,
                           text=True, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=args.timeout, start_new_session=True, env={"PATH": "/usr/bin:/bin"})
        except subprocess.TimeoutExpired:
            pass   # run() killed the child; the tests passed before the timeout still count
        try:
            with open(result) as f:
                out = json.load(f)
        except (OSError, ValueError):
            out = {"compiled": 0, "passed": 0, "total": len(tests)}
    return {"passed": out["passed"] / out["total"] if out["total"] else 0.0, "compiled": float(out["compiled"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--timeout", type=float, default=2.0, help="wall-clock seconds per completion (default 2)")
    ap.add_argument("--memory-mb", type=int, default=512, help="address-space limit per completion (default 512)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="completions run at once")
    args = ap.parse_args()
    pending = collections.deque()
    ready = threading.Condition()
    done = object()

    def writer():   # answers in input order, each as soon as it and those before it are scored
        while True:
            with ready:
                while not pending:
                    ready.wait()
                fut = pending.popleft()
            if fut is done:
                return
            try:
                print(json.dumps(fut.result()), flush=True)
            except Exception as e:   # a bad input line: say so and exit (tidal names the record)
                print(f"python_exec.py: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                os._exit(1)

    w = threading.Thread(target=writer)
    w.start()
    with cf.ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for line in sys.stdin:
            if line.strip():
                fut = pool.submit(score, json.loads(line), args)
                with ready:
                    pending.append(fut)
                    ready.notify()
        with ready:
            pending.append(done)
            ready.notify()
        w.join()


if __name__ == "__main__":
    main()
