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
4. All of it again in a clone made without git's templates (`git clone --template=`: no .git/info
   until slim.sh makes it, as in CI's clone, where slim.sh once failed for that), whose exclude
   file `off` removes again.
Skips (exit 77) outside a git checkout.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import check, failures  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if not os.path.isdir(os.path.join(ROOT, ".git")) or not shutil.which("git"):
    print("not a git checkout: skipped")
    sys.exit(77)


def sh(root, *args):
    return subprocess.run(list(args), cwd=root, capture_output=True, text=True)


def read(root, path):
    try:
        with open(os.path.join(root, path), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def carried(root):
    """pack.sh's count of the tree a call carries (its lines, without the build)"""
    pack = open(os.path.join(root, "tests/gpu/pack.sh")).read()
    block = pack[pack.index("tree=$("):pack.index("packb=")]
    return int(sh(root, "bash", "-c", block + 'echo "$tree"').stdout.split()[-1])


def exercise(root, where):
    status = lambda: sh(root, "git", "status", "--porcelain").stdout  # noqa: E731
    exclude = sh(root, "git", "rev-parse", "--git-path", "info/exclude").stdout.strip()
    folders = sorted({re.sub(r"^(reports/(?:.+/)?runs)/.*", r"\1", f) for f in sh(root, "git", "ls-files").stdout.split()
                      if re.match(r"^reports/(?:.+/)?runs/", f)})
    files = sh(root, "git", "ls-files", *folders).stdout.split()
    before, size0, exclude0 = status(), carried(root), read(root, exclude)
    runs_bytes = sum(os.path.getsize(os.path.join(root, f)) for f in files)
    digest0 = {f: read(root, f) for f in files}
    try:
        p = sh(root, "bash", "tests/gpu/slim.sh", "on")
        listed = sh(root, "git", "ls-files", *folders).stdout.split()
        untracked = sh(root, "git", "ls-files", "--others", "--exclude-standard", *folders).stdout.split()
        check(p.returncode == 0 and folders and not listed and not untracked,
              f"{where}: slim.sh on: {len(folders)} folders of packed runs ({', '.join(folders)}, {len(files)} files) "
              f"are neither tracked nor untracked-not-ignored {p.stderr.strip()}")
        check(all(read(root, f) == digest0[f] for f in files), f"{where}: slim.sh on: every packed run file still on disk, unchanged")
        size1 = carried(root)
        check(size0 - size1 == runs_bytes, f"{where}: pack.sh's count leaves them out: {size0 >> 20} -> {size1 >> 20} MiB "
              f"(their {runs_bytes >> 20} MiB)")
    finally:
        p = sh(root, "bash", "tests/gpu/slim.sh", "off")
    check(p.returncode == 0 and status() == before and read(root, exclude) == exclude0,
          f"{where}: slim.sh off: git status and {exclude} as before ({'absent' if exclude0 is None else 'present'})")
    p = sh(root, "bash", "tests/gpu/slim.sh", "off")
    check(p.returncode == 0 and status() == before and read(root, exclude) == exclude0,
          f"{where}: slim.sh off again: nothing changes")
    check(sh(root, "bash", "tests/gpu/slim.sh", "sideways").returncode == 2, f"{where}: a bad verb: usage error (exit 2)")


exercise(ROOT, "this checkout")
# the committed tree, cloned without templates; this checkout's slim.sh and pack.sh go with it
# (they may be newer than the last commit)
with tempfile.TemporaryDirectory() as tmp:
    clone = os.path.join(tmp, "bare-clone")
    p = sh(tmp, "git", "clone", "-q", "--template=", ROOT, clone)
    if p.returncode != 0:
        check(False, f"git clone --template= of this checkout: {p.stderr.strip()}")
    else:
        for f in ("tests/gpu/slim.sh", "tests/gpu/pack.sh"):
            shutil.copyfile(os.path.join(ROOT, f), os.path.join(clone, f))
        sh(clone, "git", "update-index", "--refresh")
        check(not os.path.exists(os.path.join(clone, ".git", "info")), "the clone without templates has no .git/info")
        exercise(clone, "a clone without templates")
sys.exit(1 if failures else 0)
