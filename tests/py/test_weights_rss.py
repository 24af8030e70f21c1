"""Memory of a bf16 checkpoint (src/model/load.c, weights_recipe.c): weights stay in their storage
dtype, shared between paths whose recipes round them the same way; what a recipe changes is copied
narrow. A Llama-shaped bf16 checkpoint of ~200M parameters (C 1024, L 8, F 4096, V 32000; 0.4 GB
bf16, 0.8 GB as fp32) written by tidal-init, then tidal-diff on 2 prompts x 8 new tokens:
  bf16-train vs bf16-infer    no copy at all: peak RSS < bf16 size + 15% of the fp32 size
                              (the loader's fp32 copy alone would be the fp32 size; the old
                              design held 3x it: the fp32 copy plus one rounded copy per path)
  bf16-train vs fp8-rollout   + the FP8 copy of the GEMM matrices at 1 byte per weight (codes
                              + 128x128 block scales): peak < bf16 + matrices x 1 byte + the
                              same margin (fp32 copies of them would add 4 bytes per weight)
Peak RSS from wait4's rusage (ru_maxrss). Exit 0 pass, 1 fail, 77 skip (ASan).
"""
import os
import subprocess
import sys
import tempfile

BUILD = os.environ.get("BUILD", "build")
if "asan" in BUILD:
    print("skip: peak RSS is not meaningful under AddressSanitizer")
    sys.exit(77)
BIN = os.path.join(BUILD, "bin")
C, L, F, V, NH = 1024, 8, 4096, 32000, 8


def peak_rss_kb(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        print("FAIL: %s: %s" % (" ".join(cmd), err.decode()[-400:]))
        sys.exit(1)
    return ru.ru_maxrss


with tempfile.TemporaryDirectory() as d:
    m = os.path.join(d, "m")
    subprocess.run([os.path.join(BIN, "tidal-init"), "--arch", "llama", "--hidden-size", str(C), "--num-layers", str(L),
                    "--num-heads", str(NH), "--intermediate-size", str(F), "--vocab-size", str(V), "--no-tie",
                    "--dtype", "bf16", "--seed", "1", "-o", m], check=True, capture_output=True)
    matrices = L * (4 * C * C + 3 * C * F)
    params = matrices + 2 * V * C + (2 * L + 1) * C
    s16, s32 = 2 * params / 1024, 4 * params / 1024           # KiB
    margin = 0.15 * s32
    pf = os.path.join(d, "p.jsonl")
    with open(pf, "w") as f:
        f.write('{"tokens": [5, 17, 300, 4000, 12]}\n{"tokens": [9, 8, 7]}\n')
    ok = True
    for b, extra in (("bf16-infer", 0), ("fp8-rollout", matrices / 1024)):
        peak = peak_rss_kb([os.path.join(BIN, "tidal-diff"), "--model", m, "--prompts", pf, "-o",
                            os.path.join(d, b + ".h5"), "--recipe-a", "bf16-train", "--recipe-b", b,
                            "--max-new-tokens", "8", "--seed", "1", "--no-stop-at-eos"])
        bound = s16 + extra + margin
        good = peak < bound
        ok &= good
        print("bf16-train vs %-12s peak RSS %7.0f MiB   bound %7.0f MiB (bf16 %.0f + fp8 copies %.0f + %.0f)"
              "   fp32 size %.0f MiB: %s" % (b, peak / 1024, bound / 1024, s16 / 1024, extra / 1024, margin / 1024,
                                            s32 / 1024, "ok" if good else "FAIL"))
    sys.exit(0 if ok else 1)
