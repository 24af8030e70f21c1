"""tests/gpu/slim.sh: keeps reports' packed runs out of a device call (the tool sends a nested
repository without its files) and changes nothing else.

1. `on` makes every folder of packed runs (reports/.../runs) a nested repository marked as slim's,
   and `git status --porcelain` of the checkout is what it was (main's index and files untouched).
2. pack.sh's count of what a call carries (the same pipeline, run here without building) leaves
   those folders out: the count drops by their tracked bytes.
3. `off` removes exactly the nested .git folders `on` made (a folder that was a repository before
   keeps its own), and the status is again what it was. A bad verb is a usage error (exit 2).
Skips (exit 77) outside a git checkout.
"""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import check, failures  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if not os.path.isdir(os.path.join(ROOT, ".git")) or not shutil.which("git"):
    print("not a git checkout: skipped")
    sys.exit(77)


def sh(*args):
    return subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True)


def status():
    return sh("git", "status", "--porcelain").stdout


def carried():
    """pack.sh's count of the tree a call carries (its lines, without the build)"""
    pack = open(os.path.join(ROOT, "tests/gpu/pack.sh")).read()
    block = pack[pack.index("nested=$("):pack.index("packb=")]
    return int(sh("bash", "-c", block + 'echo "$tree"').stdout.split()[-1])


folders = sorted({re.sub(r"^(reports/(?:.+/)?runs)/.*", r"\1", f) for f in sh("git", "ls-files").stdout.split()
                  if re.match(r"^reports/(?:.+/)?runs/", f)})
before, size0 = status(), carried()
runs_bytes = sum(os.path.getsize(os.path.join(ROOT, f)) for f in sh("git", "ls-files", *folders).stdout.split())
try:
    p = sh("bash", "tests/gpu/slim.sh", "on")
    made = [d for d in folders if os.path.exists(os.path.join(ROOT, d, ".git", "tidal-slim"))]
    check(p.returncode == 0 and made == folders and status() == before,
          f"slim.sh on: {len(made)} folders of packed runs become nested repositories ({', '.join(folders)}); "
          "git status unchanged")
    size1 = carried()
    check(size0 - size1 == runs_bytes, f"pack.sh's count leaves them out: {size0 >> 20} -> {size1 >> 20} MiB "
          f"(their {runs_bytes >> 20} MiB)")
finally:
    p = sh("bash", "tests/gpu/slim.sh", "off")
left = [d for d in folders if os.path.exists(os.path.join(ROOT, d, ".git"))]
check(p.returncode == 0 and not left and status() == before, "slim.sh off: the nested .git folders gone, status as before")
check(sh("bash", "tests/gpu/slim.sh", "sideways").returncode == 2, "a bad verb: usage error (exit 2)")
sys.exit(1 if failures else 0)
