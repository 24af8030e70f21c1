"""A training batch for tests/helpers/train_probe (tests/bench/train.sh, moe.sh): BATCH sequences of
LEN random token ids below VOCAB (seed 1), 90 % of the targets in the loss mask, as JSON on stdout.

  make_batch.py VOCAB BATCH LEN
"""
import json
import random
import sys

random.seed(1)
v, b, n = (int(x) for x in sys.argv[1:4])
print(json.dumps({"tokens": [[random.randrange(v) for _ in range(n)] for _ in range(b)],
                  "mask": [[int(random.random() < 0.9) for _ in range(n - 1)] for _ in range(b)]}))
