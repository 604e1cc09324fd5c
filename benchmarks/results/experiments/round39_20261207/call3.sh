# Round 39, call 3 (~7 min with the start): where `auto`'s split starts to pay, with the plan knob
# (CUPY_DASH_SPLIT_COLUMNS=0: uncut tables, =1: every table cut in thirds). Ours deterministic alone, burst_bench.py,
# three alternating rounds: head dim 128 at full 2560 (B 6) / 3072 (B 5), head dim 64 at full 1920 (B 8) / 2560
# (B 6). $OUT: ab3.tgz (<leg>_<hdim>_<n>.json), log.txt.
bash benchmarks/results/experiments/round39_20261207/knob_ab.sh ab3 ab3.tgz "128 full:2560 full:3072" \
  "64 full:1920 full:2560"
echo "call3: $SECONDS s" | tee -a ${OUT:-/root/out}/log.txt
