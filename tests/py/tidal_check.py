"""Helpers shared by the Python end-to-end checks: running tidal's tools and collecting
named checks (each printed ok/FAIL; the script's exit status comes from `failures`)."""
import os
import subprocess

BUILD = os.environ.get("BUILD", "build")
BIN = os.path.join(BUILD, "bin")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args, ok=True):
    """Runs BIN/args[0] with the other args; with ok=True a failure stops the script."""
    p = subprocess.run([os.path.join(BIN, args[0]), *args[1:]], capture_output=True, text=True)
    if ok and p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"command failed: {' '.join(args)}")
    return p
