"""Helpers shared by the Python end-to-end checks: running tidal's tools and collecting
named checks (each printed ok/FAIL; the script's exit status comes from `failures`)."""
import os
import subprocess
import signal

# A suite started as a background job by a shell without job control (nohup CMD &, a CI runner's
# script) inherits SIGINT ignored, and the tools rightly keep an ignored SIGINT ignored (stop.c):
# the Ctrl-C checks then see runs that cannot be interrupted. Restore a handler here, so the tools
# these tests start get SIGINT's default disposition whatever started the suite.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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


def interrupt(cmd, ready, sig=None, times=1, timeout=120, env=None):
    """Starts cmd (a list), waits until ready(stderr_lines_so_far) is true, sends sig (default
    SIGINT) `times` times, and waits for the end. Returns (returncode, stderr text, sent): sent is
    False when the process ended before it was ready (a fast machine: the caller may retry)."""
    import signal
    import threading
    import time
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stderr.readline, "")), daemon=True)
    reader.start()
    t0, sent = time.time(), False
    while p.poll() is None and time.time() - t0 < timeout:
        if ready(list(lines)):
            for _ in range(times):
                p.send_signal(sig or signal.SIGINT)
                time.sleep(0.05)
            sent = True
            break
        time.sleep(0.01)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    reader.join(timeout=5)
    return p.returncode, "".join(lines), sent


def continue_command(stderr):
    """The command a stopped tool printed after "to continue..., run:" (split as a shell would)."""
    import shlex
    ls = stderr.splitlines()
    for i, ln in enumerate(ls):
        if ln.rstrip().endswith("run:") and "to continue" in ln and i + 1 < len(ls):
            return shlex.split(ls[i + 1].strip())
    return None
