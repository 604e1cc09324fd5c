# Round 39, call 4 (~4 min with the start): the same A/B as call 3 (knob_ab.sh), head dim 64 at full 1280 (B 12) /
# 1536 (B 10), below call 3's lengths. $OUT: ab4.tgz (<leg>_<hdim>_<n>.json), log.txt.
bash benchmarks/results/experiments/round39_20261207/knob_ab.sh ab4 ab4.tgz "64 full:1280 full:1536"
echo "call4: $SECONDS s" | tee -a ${OUT:-/root/out}/log.txt
