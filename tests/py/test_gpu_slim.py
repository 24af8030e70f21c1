"""tests/gpu/slim.sh: keeps reports' packed runs out of a device call (the device tool counts every
file `git ls-files` lists: on 2026-11-29 it refused a call at 77 MiB although the folders were
nested repositories, the way slim.sh had kept them out until then) and changes nothing else.

1. `on` takes every folder of packed runs (reports/.../runs) out of main's index and ignores it in
   .git/info/exclude: `git ls-files` lists none of their files, `git ls-files --others
   --exclude-standard` none either, and every file is still on disk with its bytes.
2. pack.sh's count of what a call carries (the same pipeline, run here without building) drops by
   their tracked bytes.
3. `off` puts the index and .git/info/exclude back: `git status --porcelain` and the exclude file
   are what they were. A second `off` changes nothing. A bad verb is a usage error (exit 2).
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
    block = pack[pack.index("tree=$("):pack.index("packb=")]
    return int(sh("bash", "-c", block + 'echo "$tree"').stdout.split()[-1])


def read(path):
    try:
        with open(os.path.join(ROOT, path), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


folders = sorted({re.sub(r"^(reports/(?:.+/)?runs)/.*", r"\1", f) for f in sh("git", "ls-files").stdout.split()
                  if re.match(r"^reports/(?:.+/)?runs/", f)})
files = sh("git", "ls-files", *folders).stdout.split()
before, size0, exclude0 = status(), carried(), read(".git/info/exclude")
runs_bytes = sum(os.path.getsize(os.path.join(ROOT, f)) for f in files)
digest0 = {f: read(f) for f in files}
try:
    p = sh("bash", "tests/gpu/slim.sh", "on")
    listed = sh("git", "ls-files", *folders).stdout.split()
    untracked = sh("git", "ls-files", "--others", "--exclude-standard", *folders).stdout.split()
    check(p.returncode == 0 and folders and not listed and not untracked,
          f"slim.sh on: {len(folders)} folders of packed runs ({', '.join(folders)}, {len(files)} files) are neither "
          f"tracked nor untracked-not-ignored")
    check(all(read(f) == digest0[f] for f in files), "slim.sh on: every packed run file still on disk, unchanged")
    size1 = carried()
    check(size0 - size1 == runs_bytes, f"pack.sh's count leaves them out: {size0 >> 20} -> {size1 >> 20} MiB "
          f"(their {runs_bytes >> 20} MiB)")
finally:
    p = sh("bash", "tests/gpu/slim.sh", "off")
check(p.returncode == 0 and status() == before and read(".git/info/exclude") == exclude0,
      "slim.sh off: git status and .git/info/exclude as before")
p = sh("bash", "tests/gpu/slim.sh", "off")
check(p.returncode == 0 and status() == before and read(".git/info/exclude") == exclude0,
      "slim.sh off again: nothing changes")
check(sh("bash", "tests/gpu/slim.sh", "sideways").returncode == 2, "a bad verb: usage error (exit 2)")
sys.exit(1 if failures else 0)
