# Round 40, call 5 (prepared for the next session, not run; carry .whl; ~7 min with the start): what the release in
# the rank chain's hop costs. patches/relaxed_release.patch (timing only: a relaxed add publishes the turn, so the
# next rank's adds are not ordered after this rank's by the memory model) against the tree and no_turn_wait, ours
# deterministic alone in each process, three alternating rounds of burst_bench.py; then its bits against the tree's
# (same bits would say only that the order held on this run). $OUT: ab5.tgz, bits/, log.txt.
. benchmarks/device_env.sh
LEGS="relaxed_release no_turn_wait" HDIMS="128" . benchmarks/results/experiments/round40_20261207/legs.sh
T=/tmp/ab5; mkdir -p $T
for n in 1 2 3; do
  [ $SECONDS -gt 400 ] && break
  for leg in tree relaxed_release no_turn_wait; do
    run=(python3); [ $leg = tree ] || run=(python3 benchmarks/with_kernels.py /tmp/legs/$leg/kernels_src)
    timeout 60 "${run[@]}" benchmarks/burst_bench.py --impls dash_det --rounds 3 --json $T/${leg}_$n.json 2>&1 \
      | grep -E "ours det|rror" | sed "s/^/$leg $n /" | tee -a $O/log.txt
  done
  (cd $T && tar czf $O/ab5.tgz *.json)
done
mkdir -p $O/bits
timeout 100 python3 benchmarks/bits_digest.py --out $O/bits/tree.json > $O/bits/log.txt 2>&1
timeout 100 python3 benchmarks/with_kernels.py /tmp/legs/relaxed_release/kernels_src benchmarks/bits_digest.py \
  --out $O/bits/relaxed_release.json >> $O/bits/log.txt 2>&1
echo "relaxed_release bits: $(python3 benchmarks/bits_digest.py --compare $O/bits/tree.json \
  $O/bits/relaxed_release.json 2>&1 | tail -1)" | tee -a $O/log.txt
echo "call5: $SECONDS s" | tee -a $O/log.txt
