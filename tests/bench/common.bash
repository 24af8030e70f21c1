# Helpers the bench scripts source (not a bench: tests/bench.sh runs *.sh only).
# best: the largest of the numbers on stdin (whitespace- or line-separated); empty when none
best() { tr -s ' \t' '\n\n' | sort -g | tail -n1; }
# ratio A B: A / B to two decimals, NA when either is missing or not positive
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "NA" }'; }
