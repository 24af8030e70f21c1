"""Docs that cannot rot (issue 37): README.md and docs/*.md are checked against the tools.

1. Every ```sh / ```bash block runs, in order within its file, with bash -e -o pipefail in a
   scratch directory per file that looks like the source tree (build/bin = this build's tools,
   datasets, .venv: symlinks), so what a block writes stays there. A block preceded by an HTML
   comment `<!-- not run: REASON -->` is not run (a GPU, a long run, a program tidal does not
   ship); `<!-- not run here: TEST -->` names the test that runs it. A marker without a reason
   fails.
2. Every `--flag` named for a tidal tool exists in that tool's --help: in a shell block, the
   flags of each tidal command line; in prose, a code span that starts with a tool's name checks
   its flags against that tool, and a bare `--flag` must belong to some tidal tool (or to the few
   other programs the docs name, listed below). A miss names the file, the line and the flag.
3. docs/cli/TOOL.md is what `make docs-cli` (tools/cli-docs.sh) makes from the built tools now.
4. README.md holds at most 200 lines and the two commands; docs/ holds at least 6 guides;
   `tidal`'s table (tools/tidal.c) names every tools/tidal-*.c (test_newcomer.py runs it).
Kept small: the examples use datasets/models/add with 2-step runs; the whole file takes well
under a minute on two cores.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from tidal_check import BIN, check, failures  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BINDIR = os.path.join(ROOT, BIN)
ENV = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
           PATH=BINDIR + os.pathsep + os.environ.get("PATH", ""), SOURCE_DATE_EPOCH="0")
t_start = time.time()

docs = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"<!--\s*not run( here)?\s*(:\s*(.*?))?\s*-->")


def blocks(path):
    """(language, first line number, text, marker or None) of each fenced block."""
    lines = open(path).read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i + 1
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        k = i - 1   # the marker: the last non-blank line before the fence
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = MARK.search(lines[k]) if k >= 0 else None
        out.append((lang, start + 1, "\n".join(lines[start:j]), mark))
        i = j + 1
    return out


# ---- the tools' options, from their --help
def help_flags(text):
    flags = set()
    for ln in text.split("\n"):
        m = re.match(r"^\s+(?:-\w, )?--([a-z0-9][\w-]*)", ln)
        if m:
            flags.add(m.group(1))
        m = re.match(r"^\s+\(also (.*)\)\s*$", ln)
        if m:
            flags.update(f.lstrip("-") for f in m.group(1).split())
    return {f.replace("_", "-") for f in flags} | {"help", "version"}


tools = sorted(os.path.basename(t) for t in glob.glob(os.path.join(BINDIR, "tidal*")) if os.access(t, os.X_OK))
opts = {}
for t in tools:
    h = subprocess.run([os.path.join(BINDIR, t), "--help"], capture_output=True, text=True, env=ENV).stdout
    if t == "tidal-task":   # subcommands with their own options
        for c in ("generate", "score"):
            h += subprocess.run([os.path.join(BINDIR, t), c, "--help"], capture_output=True, text=True, env=ENV).stdout
    opts[t] = help_flags(h)
every = set().union(*opts.values())
# options of other programs the docs name in prose (TensorBoard, Slurm, pkg-config, the shipped
# reward scripts datasets/rewards/*.py) and the placeholders of the option convention
FOREIGN = {"logdir", "array", "dependency", "cflags", "libs", "static", "require-think", "verifier", "timeout",
           "workers", "memory-mb", "opt", "opt-name", "k", "flag"}

TOOL_RE = re.compile(r"(?:^|[\s/;&|(`])(tidal(?:-[a-z]+(?:-[a-z]+)?)?)(?=[\s`]|$)")


def command_flags(text):
    """(tool, flag) of each tidal command line of a shell text; continuation lines joined."""
    text = re.sub(r"\\\n", " ", text)
    text = re.sub(r"<<'?EOF'?.*?\nEOF\n?", "\n", text, flags=re.S)   # here-documents are data
    out = []
    for ln in text.split("\n"):
        for seg in re.split(r"\|\||&&|[|;]", ln.split(" #")[0]):
            words = seg.split()
            for w_i, w in enumerate(words):
                name = os.path.basename(w)
                if name in opts:
                    tool, rest = name, words[w_i + 1:]
                    if tool == "tidal" and rest and "tidal-" + rest[0] in opts:   # `tidal diff ...`
                        tool, rest = "tidal-" + rest[0], rest[1:]
                    for a in rest:
                        m = re.match(r"^--([a-zA-Z0-9][\w-]*)", a)
                        if m:
                            out.append((tool, m.group(1).replace("_", "-")))
                    break
    return out


def check_flags(path):
    rel = os.path.relpath(path, ROOT)
    bad = []
    in_block, lang, buf, buf_line = False, "", [], 0
    for n, ln in enumerate(open(path).read().split("\n"), 1):
        m = FENCE.match(ln) if not in_block else (ln.startswith("```") or None)
        if not in_block and m:
            in_block, lang, buf, buf_line = True, m.group(1), [], n + 1
            continue
        if in_block:
            if ln.startswith("```"):
                in_block = False
                if lang in ("sh", "bash"):
                    text = "\n".join(buf)
                    for tool, flag in command_flags(text):
                        if flag not in opts[tool]:
                            where = next((buf_line + i for i, b in enumerate(buf) if "--" + flag in b), buf_line)
                            bad.append(f"{rel}:{where}: {tool} has no --{flag}")
                continue
            buf.append(ln)
            continue
        for span in re.findall(r"`([^`]+)`", ln):
            cf = command_flags(span)
            if cf:
                for tool, flag in cf:
                    if flag not in opts[tool]:
                        bad.append(f"{rel}:{n}: {tool} has no --{flag}")
                continue
            for flag in re.findall(r"(?:^|[\s(/])--([a-zA-Z0-9][\w-]*)", span):
                f = flag.replace("_", "-")
                if f not in every and f not in FOREIGN:
                    bad.append(f"{rel}:{n}: no tidal tool has --{f}")
        for flag in re.findall(r"(?:^|\s)--([a-z0-9][\w-]*)", re.sub(r"`[^`]*`", "", ln)):
            f = flag.replace("_", "-")
            if f not in every and f not in FOREIGN:
                bad.append(f"{rel}:{n}: no tidal tool has --{f}")
    return bad


# ---- 2. flags
for path in docs:
    bad = check_flags(path)
    check(not bad, f"{os.path.relpath(path, ROOT)}: every --flag exists in its tool's --help"
          + ("" if not bad else ":\n    " + "\n    ".join(bad)))

# ---- 1. run the shell blocks
scratch_root = tempfile.mkdtemp(prefix="tidal-docs-")
n_run = n_marked = 0
for path in docs:
    rel = os.path.relpath(path, ROOT)
    scratch = os.path.join(scratch_root, rel.replace("/", "_"))
    os.makedirs(os.path.join(scratch, "build"))
    os.symlink(BINDIR, os.path.join(scratch, "build", "bin"))
    for d in ("datasets", ".venv", "include", "tests", "reports"):
        if os.path.exists(os.path.join(ROOT, d)):
            os.symlink(os.path.join(ROOT, d), os.path.join(scratch, d))
    for lang, line, text, mark in blocks(path):
        if lang not in ("sh", "bash"):
            continue
        if mark:
            n_marked += 1
            check(bool(mark.group(3)), f"{rel}:{line}: a block marked not run says why")
            continue
        t0 = time.time()
        try:
            p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], capture_output=True, text=True,
                               cwd=scratch, env=ENV, timeout=60)
        except subprocess.TimeoutExpired:
            p = subprocess.CompletedProcess(text, 124, "", "timed out after 60 s: keep documented examples tiny")
        n_run += 1
        check(p.returncode == 0, f"{rel}:{line}: the block runs ({time.time() - t0:.1f} s)"
              + ("" if p.returncode == 0 else f": exit {p.returncode}\n{p.stdout[-600:]}{p.stderr[-1500:]}"))
print(f"{n_run} blocks run, {n_marked} marked not run")
shutil.rmtree(scratch_root, ignore_errors=True)

# ---- 3. docs/cli is current
cli_tmp = tempfile.mkdtemp(prefix="tidal-docs-cli-")
p = subprocess.run(["bash", os.path.join(ROOT, "tools", "cli-docs.sh"), BINDIR, cli_tmp], capture_output=True, text=True,
                   env=ENV)
check(p.returncode == 0, "tools/cli-docs.sh runs" + ("" if p.returncode == 0 else ": " + p.stderr[-300:]))
stale = []
for f in sorted(os.listdir(cli_tmp)):
    have = os.path.join(ROOT, "docs", "cli", f)
    if not os.path.exists(have) or open(have).read() != open(os.path.join(cli_tmp, f)).read():
        stale.append(f)
check(not stale, f"docs/cli matches every tool's --help ({', '.join(stale) or 'all current'}; `make docs-cli` remakes them)")
shutil.rmtree(cli_tmp, ignore_errors=True)

# ---- 4. shape
readme = open(os.path.join(ROOT, "README.md")).read()
n_lines = readme.count("\n")
check(n_lines <= 200, f"README.md: {n_lines} lines (at most 200)")
check("make demo     # installs what is missing" in readme and "make check    # installs what is missing" in readme,
      "README.md: the two commands")
guides = [g for g in glob.glob(os.path.join(ROOT, "docs", "*.md")) if os.path.basename(g) != "README.md"]
check(len(guides) >= 6, f"docs/: {len(guides)} guides")
src = open(os.path.join(ROOT, "tools", "tidal.c")).read()
missing = [t for t in sorted(glob.glob(os.path.join(ROOT, "tools", "tidal-*.c")))
           if f'{{"{os.path.basename(t)[6:-2]}", ' not in src]
check(not missing, f"tools/tidal.c lists every tool ({[os.path.basename(m) for m in missing]} missing)")

print(f"{len(failures)} failed ({time.time() - t_start:.0f} s)")
sys.exit(1 if failures else 0)
