#!/usr/bin/env bash
# Long fuzz campaign: every target (or those named) for SECONDS each, JOBS at a time, niced,
# working corpora and findings under OUTDIR/NAME (the seed corpus in tests/fuzz/corpus/NAME is
# read, never written). Summary: the last "#N DONE" line of each log, and the artifacts.
#   bash tests/fuzz/run_long.sh [-t SECONDS] [-j JOBS] [-o OUTDIR] [NAME...]
set -u
cd "$(dirname "$0")/../.."
secs=600; jobs=2; out=/tmp/tidal-fuzz-long
while getopts "t:j:o:" o; do case $o in t) secs=$OPTARG;; j) jobs=$OPTARG;; o) out=$OPTARG;; *) exit 2;; esac; done
shift $((OPTIND - 1))
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(safetensors shard_index config tokenizer prompts recipe runfile)
B=${BUILD:-build}/fuzz
export LSAN_OPTIONS=suppressions=$PWD/tests/fuzz/lsan.supp
run_one() {
  local n=$1 d=$out/$1
  mkdir -p "$d/corpus" "$d/artifacts"
  # -fork with -ignore_crashes keeps going after a finding, so one finding does not end the run
  nice -n 10 "$B/fuzz_$n" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$d/artifacts/" "$d/corpus" "tests/fuzz/corpus/$n" >"$d/log" 2>&1
  echo "$n: $(grep -E '^#[0-9]+' "$d/log" | tail -n1)"
}
i=0
for n in "${names[@]}"; do
  run_one "$n" &
  i=$((i + 1)); [ $((i % jobs)) -eq 0 ] && wait
done
wait
for n in "${names[@]}"; do ls "$out/$n/artifacts" 2>/dev/null | sed "s|^|$n: finding |"; done
