# Round 37, call 2b (call 2 cut to what a session's last device minutes hold; carry .whl; ~4 min with the start):
# the tree's tables against benchmarks/with_split_tail.py 3 (the full-mask last wave in thirds) at full 3840 / 15360.
# $OUT: full.tgz, log.txt.
TAG=full LEG=3 SHAPES="full:3840 full:15360" bash benchmarks/results/experiments/round37_20261207/tables_ab.sh
