# Round 40, call 3 (carry .whl; ~9 min with the start): Nsight Compute's SM-active cycles per visit of the tree (ours
# deterministic and atomic) beside the two legs of call 2 (turn_slices, no_turn_wait) at full 3840 (B 4) and causal
# 8k (B 2), then the standing (head dims 128 and 64, the forward) while time is left. $OUT: ncu_cuts.tgz, call3.tgz,
# log.txt.
. benchmarks/device_env.sh
PATCHES=benchmarks/results/experiments/round40_20261207/patches LEGS="turn_slices no_turn_wait" \
  IMPLS="ours_auto ours_atomic" SHAPES="--seqlen 3840 --batch 4;--causal --seqlen 8192 --batch 2" \
  bash benchmarks/ncu_legs.sh 2>&1 | tee -a $O/log.txt
if [ $SECONDS -lt 330 ]; then
  TOP=/tmp/call3 bash benchmarks/standing.sh 2>&1 | tee -a $O/log.txt
  (cd /tmp/call3 && tar czf $O/call3.tgz *)
fi
echo "call3: $SECONDS s" | tee -a $O/log.txt
