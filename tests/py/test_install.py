"""`make install` as a C toolkit's (issue 37): under a temporary PREFIX, every tool (runs from there:
--version), libtidal.a, the headers, lib/pkgconfig/tidal.pc and a man page per tool made from its
--help; a small C program compiled with `pkg-config --cflags --libs --static tidal` against the
installed tree links and runs (a recipe preset and a bf16 rounding); `man -l` renders a page with
its NAME section; `make uninstall` removes what install put there. The install rule builds `all` first,
so it runs in the normal build's suite only (BUILD=build): in the sanitizer suite (build-asan, built
with other flags) a make of the default tree is not this check's business, and it says so.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BUILD, check, failures  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if os.path.normpath(BUILD) != "build":
    print(f"make install is checked in the normal build's suite (BUILD=build), not in {BUILD}'s")
    sys.exit(0)
pre = tempfile.mkdtemp(prefix="tidal-install-")
p = subprocess.run(["make", "--no-print-directory", "-s", "install", f"PREFIX={pre}"], cwd=ROOT, capture_output=True,
                   text=True)
check(p.returncode == 0, "make install PREFIX=tmp" + ("" if p.returncode == 0 else ": " + p.stderr[-400:]))
tools = sorted(os.path.basename(t)[:-2] for t in glob.glob(os.path.join(ROOT, "tools", "*.c")))
inst = sorted(os.listdir(os.path.join(pre, "bin")))
check(inst == tools, f"bin/ holds the {len(tools)} tools")
v = subprocess.run([os.path.join(pre, "bin", "tidal-diff"), "--version"], capture_output=True, text=True)
check(v.returncode == 0 and "tidal" in v.stdout + v.stderr, "the installed tidal-diff runs (--version)")
check(os.path.exists(os.path.join(pre, "lib", "libtidal.a")) and
      os.path.exists(os.path.join(pre, "include", "tidal", "recipe.h")), "lib/libtidal.a and include/tidal/*.h")
mans = sorted(f[:-2] for f in os.listdir(os.path.join(pre, "share", "man", "man1")))
check(mans == tools, "a man page per tool in share/man/man1")
if shutil.which("man"):
    m = subprocess.run(["man", "-l", os.path.join(pre, "share", "man", "man1", "tidal-rl.1")], capture_output=True,
                       text=True, env=dict(os.environ, MANWIDTH="100", MANPAGER="cat", PAGER="cat"))
    check(m.returncode == 0 and "NAME" in m.stdout and "--routing-replay" in m.stdout,
          "man -l renders tidal-rl.1 (NAME, and the options as --help prints them)")
prog = os.path.join(pre, "prog.c")
with open(prog, "w") as f:
    f.write('#include <stdio.h>\n#include "tidal/recipe.h"\n#include "tidal/formats.h"\n'
            'int main(void) { const td_recipe *r = td_recipe_find_preset("bf16-infer");\n'
            '  if (!r) return 1; printf("%s %.9g\\n", r->name, (double)td_round(TD_BF16, 1.00390625f)); return 0; }\n')
env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(pre, "lib", "pkgconfig"))
flags = subprocess.run(["pkg-config", "--cflags", "--libs", "--static", "tidal"], capture_output=True, text=True, env=env)
check(flags.returncode == 0, "pkg-config finds tidal.pc" + ("" if flags.returncode == 0 else ": " + flags.stderr))
exe = os.path.join(pre, "prog")
cc = subprocess.run(["cc", prog, "-o", exe, *flags.stdout.split()], capture_output=True, text=True)
run = subprocess.run([exe], capture_output=True, text=True) if cc.returncode == 0 else None
check(cc.returncode == 0 and run is not None and run.stdout.strip() == "bf16-infer 1",
      "a program built with pkg-config's flags against the installed libtidal runs (bf16-infer, bf16(1 + 2^-8) = 1)"
      + ("" if cc.returncode == 0 else ": " + cc.stderr[-300:]))
u = subprocess.run(["make", "--no-print-directory", "-s", "uninstall", f"PREFIX={pre}"], cwd=ROOT, capture_output=True,
                   text=True)
left = [os.path.relpath(os.path.join(d, f), pre) for d, _, fs in os.walk(pre) for f in fs if not f.startswith("prog")]
check(u.returncode == 0 and not left, f"make uninstall removes what install wrote ({left[:3]} left)")
shutil.rmtree(pre, ignore_errors=True)
sys.exit(1 if failures else 0)
