# Round 37, call 3 (prepared for the next session; carry .whl; ~3 min with the start): the tree's tables against
# benchmarks/with_split_tail.py trim (causal lists cut at the mean load, the remainders to the least-loaded CTAs)
# at causal 8k / 16k. $OUT: causal.tgz, log.txt.
TAG=causal LEG=trim SHAPES="causal:8192 causal:16384" \
  bash benchmarks/results/experiments/round37_20261207/tables_ab.sh
