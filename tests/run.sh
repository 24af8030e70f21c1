#!/usr/bin/env bash
# Runs every test program given on the command line and the Python cross-checks in tests/py,
# then prints one closing line "N passed, N failed". Exit status: 0 only if nothing failed.
# A Python check that exits 77 is counted as skipped (its helper package is missing).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
pass=0; fail=0; skip=0; failed=()
# Each test program gets a fresh TMPDIR (Python's tempfile, the C tests' helpers and the tools all
# honour it), removed when the test ends: the suite's temporary files never accumulate on the disk
# (a CI run once failed on "No space left on device" after tests had left 60 GB in /tmp). A failed
# test's directory is removed too; its messages name what it wrote. The closing line of each test
# says how much it wrote there.
TMP_ROOT=${TMPDIR:-/tmp}
trap '[ -n "${TEST_TMP:-}" ] && rm -rf "$TEST_TMP"' EXIT
tmp_begin() { TEST_TMP=$(mktemp -d "$TMP_ROOT/tt.XXXXXX") || { echo "tests/run.sh: cannot create a directory under $TMP_ROOT" >&2; exit 1; }; }
tmp_end() {  # prints the size written, then removes the directory
  local kib; kib=$(du -sk "$TEST_TMP" 2>/dev/null | cut -f1)
  rm -rf "$TEST_TMP"
  echo "$((${kib:-0} / 1024)) MiB in TMPDIR"
}
run_c() {  # $1: label, then the command
  local label=$1; shift
  echo "=== $label"
  local t0=$SECONDS
  tmp_begin
  out=$(TMPDIR=$TEST_TMP "$@" 2>&1); rc=$?
  echo "$out"
  echo "--- $label: $((SECONDS - t0)) s, $(tmp_end)"
  tally "$label" "$rc" "$out"
}
tally() {  # $1: label, $2: exit status, $3: output; counts cmocka's PASSED / FAILED lines
  local n_ok n_bad
  n_ok=$(echo "$3" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -n1)
  n_bad=$(echo "$3" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -n1)
  pass=$((pass + ${n_ok:-0})); fail=$((fail + ${n_bad:-0}))
  if [ "$2" -ne 0 ]; then failed+=("$1"); [ -z "$n_bad" ] && fail=$((fail + 1)); fi
}
tally_py() {  # $1: the check, $2: its exit status (77: skipped)
  if [ "$2" -eq 0 ]; then pass=$((pass + 1));
  elif [ "$2" -eq 77 ]; then skip=$((skip + 1));
  else fail=$((fail + 1)); failed+=("$1"); fi
}
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
# The simulator's tests (*/sim/*) run one thread each (fibers; tests/cudasim), so they run side by
# side, TIDAL_TEST_JOBS at once (default: the CPU count), each in its own TMPDIR; their outputs
# are printed whole, in the order given, as each finishes in turn. So do the Python checks whose
# time is the simulator's (PY_SIDE, below). The other programs use the OpenMP threads themselves
# and run one at a time.
par_dir=$(mktemp -d "$TMP_ROOT/tp.XXXXXX") || { echo "tests/run.sh: cannot create a directory under $TMP_ROOT" >&2; exit 1; }
trap '[ -n "${TEST_TMP:-}" ] && rm -rf "$TEST_TMP"; rm -rf "$par_dir"' EXIT
run_side_by_side() {  # $1: c (test programs) or py (Python checks), then the tests, TIDAL_TEST_JOBS at once
  local kind=$1 jobs=${TIDAL_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)} i=0 t f
  shift
  for t in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    f=$par_dir/$kind.$i
    ( tmp_begin; t0=$SECONDS
      if [ "$kind" = py ]; then TMPDIR=$TEST_TMP BUILD=$BUILD "$PY" "$t"; else TMPDIR=$TEST_TMP "$t"; fi > "$f.out" 2>&1
      echo $? > "$f.rc.tmp"
      echo "$((SECONDS - t0)) s, $(tmp_end)" > "$f.took"; mv "$f.rc.tmp" "$f.rc" ) &
    i=$((i + 1))
  done
  i=0
  for t in "$@"; do
    f=$par_dir/$kind.$i
    # a job that ended without its status (its shell killed, no TMPDIR) counts as failed: no wait
    # for a file that will never come
    while [ ! -e "$f.rc" ] && [ -n "$(jobs -rp)" ]; do wait -n 2>/dev/null || sleep 0.2; done
    echo "=== $t"
    out=$(cat "$f.out" 2>/dev/null); rc=$(cat "$f.rc" 2>/dev/null || echo 1)
    echo "$out"
    echo "--- $t: $(cat "$f.took" 2>/dev/null || echo "no status:") (side by side)"
    if [ "$kind" = py ]; then tally_py "$t" "$rc"; else tally "$t" "$rc" "$out"; fi
    i=$((i + 1))
  done
  wait
}
side=()
for t in "$@"; do
  case $t in */sim/*) side+=("$t") ;; *) run_c "$t" "$t" ;; esac
done
[ ${#side[@]} -gt 0 ] && run_side_by_side c "${side[@]}"
# the kernels' narrower forms too (include/tidal/isa.h): what an AVX2-only machine and a plain
# one run, on this CPU
for isa in avx2 portable; do
  for t in "$@"; do
    case $t in */test_gemm|*/test_formats|*/test_roundings|*/test_scaling) run_c "TIDAL_ISA=$isa $t" env TIDAL_ISA=$isa "$t" ;; esac
  done
done
# and each of the bf16 dot-product order's kernels, not only the faster one here (src/recipe/gemm_bf16dp.c)
for k in dp fma; do
  for t in "$@"; do
    case $t in */test_gemm) run_c "TIDAL_BF16DP_KERNEL=$k $t" env TIDAL_BF16DP_KERNEL=$k "$t" ;; esac
  done
done
# TIDAL_SKIP_PY="test_a.py test_b.py": Python checks left out of this run (check-asan leaves out the
# ones whose code paths others cover there, to keep CI inside its budget: see the Makefile).
# PY_SIDE: the checks whose time is the simulator's tools (one thread each: user time equals wall
# time), run side by side first; on 2 Zen 3 cores their 315 s one after another took 168 s.
PY_SIDE=" test_device_rl.py test_device_sft.py test_device_sim.py test_device_moe.py test_device_metrics.py test_memplan_moe.py "
side=() serial=()
for t in tests/py/test_*.py; do
  [ -e "$t" ] || continue
  case " ${TIDAL_SKIP_PY:-} " in *" $(basename "$t") "*) echo "=== $t: left out of this run (TIDAL_SKIP_PY)"; skip=$((skip + 1)); continue ;; esac
  case $PY_SIDE in *" $(basename "$t") "*) side+=("$t") ;; *) serial+=("$t") ;; esac
done
[ ${#side[@]} -gt 0 ] && run_side_by_side py "${side[@]}"
for t in ${serial[@]+"${serial[@]}"}; do
  echo "=== $t"
  t0=$SECONDS
  tmp_begin
  TMPDIR=$TEST_TMP BUILD=$BUILD "$PY" "$t"; rc=$?
  echo "--- $t: $((SECONDS - t0)) s, $(tmp_end)"
  tally_py "$t" "$rc"
done
echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped ($SECONDS s)"
[ $fail -eq 0 ]
