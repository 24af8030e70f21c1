"""Memory stays bounded on long runs: tidal-diff's peak RSS must not grow with the number of
prompts. The same tiny model and prompt distribution, 8 prompts and then 64 (8x the batches);
peak RSS from wait4's rusage (ru_maxrss, KiB on Linux) of each child. Allowed growth: 4 MiB
(the prompt set itself is a few KB; the summary at the end holds 28 bytes per scored token, 28 KB
here). A leak of one batch's buffers per batch (~100 KB each here) over 16 batches would exceed it.
Exit 0 pass, 1 fail.
"""
import os
import random
import subprocess
import sys
import tempfile

BUILD = os.environ.get("BUILD", "build")
if "asan" in BUILD:   # ASan's quarantine keeps freed memory resident: RSS says nothing there
    print("skip: peak RSS is not meaningful under AddressSanitizer")
    sys.exit(77)
BIN = os.path.join(BUILD, "bin")
MARGIN_KB = 4096


def peak_rss_kb(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        print("FAIL: %s exited %d: %s" % (" ".join(cmd), p.returncode, err.decode()[-400:]))
        sys.exit(1)
    return ru.ru_maxrss


with tempfile.TemporaryDirectory() as d:
    m = os.path.join(d, "m")
    subprocess.run([os.path.join(BIN, "tidal-init"), "--arch", "qwen2", "--preset", "tiny", "--seed", "1", "-o", m],
                   check=True, capture_output=True)
    rng = random.Random(5)
    lines = ['{"tokens": [%s]}\n' % ", ".join(str(rng.randrange(3, 512)) for _ in range(rng.randrange(4, 13)))
             for _ in range(64)]
    peaks = {}
    for n in (8, 64):
        pf = os.path.join(d, "p%d.jsonl" % n)
        with open(pf, "w") as f:
            f.writelines(lines[:n])
        peaks[n] = peak_rss_kb([os.path.join(BIN, "tidal-diff"), "--model", m, "--prompts", pf, "-o",
                                os.path.join(d, "r%d.h5" % n), "--batch", "4", "--max-new-tokens", "16",
                                "--seed", "7", "--no-stop-at-eos"])
        print("tidal-diff, %d prompts (%d batches): peak RSS %d KiB" % (n, n // 4, peaks[n]))
    growth = peaks[64] - peaks[8]
    ok = growth <= MARGIN_KB
    print("growth %+d KiB (allowed %d): %s" % (growth, MARGIN_KB, "ok" if ok else "FAIL"))
    sys.exit(0 if ok else 1)
