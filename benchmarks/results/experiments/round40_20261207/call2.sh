# Round 40, call 2 (carry .whl; ~10 min with the start): the rank chain's turn per dQ slice (patches/turn_slices.patch)
# and the chain's whole wait (patches/no_turn_wait.patch, timing only: its adds race). First the pieces tests on the
# tree (round 39's sixths case among them), then turn_slices' bits against the tree's and the backward's GPU tests
# with its kernels, then ours deterministic in bursts and steady loops (burst_bench.py), tree / turn_slices /
# no_turn_wait in alternating processes (the tree's process times its atomic path too) while time is left.
# $OUT: tests.log, legs_tests.log, bits/, ab.tgz, log.txt.
. benchmarks/device_env.sh
LEGS="turn_slices no_turn_wait" HDIMS="128 64" . benchmarks/results/experiments/round40_20261207/legs.sh
timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/gpu/test_gpu_pieces.py > $O/tests.log 2>&1
tail -2 $O/tests.log | sed "s/^/tree pieces /" | tee -a $O/log.txt
mkdir -p $O/bits
timeout 100 python3 benchmarks/bits_digest.py --out $O/bits/tree.json > $O/bits/log.txt 2>&1
timeout 100 python3 benchmarks/with_kernels.py /tmp/legs/turn_slices/kernels_src benchmarks/bits_digest.py \
  --out $O/bits/turn_slices.json >> $O/bits/log.txt 2>&1
echo "turn_slices bits: $(python3 benchmarks/bits_digest.py --compare $O/bits/tree.json $O/bits/turn_slices.json \
  2>&1 | tail -1)" | tee -a $O/log.txt
rm -rf /tmp/pristine && cp -r kernels_src /tmp/pristine && rm -rf kernels_src && cp -r /tmp/legs/turn_slices/kernels_src .
timeout -s INT -k 10 170 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/gpu/test_gpu_attention.py \
  tests/gpu/test_gpu_stall_bound.py tests/gpu/test_gpu_pieces.py \
  -k "stall or pieces or (backward and not d96 and not d192 and not d256)" > $O/legs_tests.log 2>&1
tail -3 $O/legs_tests.log | sed "s/^/turn_slices tests /" | tee -a $O/log.txt
rm -rf kernels_src && cp -r /tmp/pristine kernels_src
T=/tmp/ab; mkdir -p $T
burst() {  # burst <leg> <round> <impls...>
  local leg=$1 n=$2; shift 2
  local run=(python3); [ $leg = tree ] || run=(python3 benchmarks/with_kernels.py /tmp/legs/$leg/kernels_src)
  timeout 90 "${run[@]}" benchmarks/burst_bench.py --impls "$@" --rounds 3 --json $T/${leg}_$n.json 2>&1 \
    | grep -E "ours det|rror" | sed "s/^/$leg $n /" | tee -a $O/log.txt
  (cd $T && tar czf $O/ab.tgz *.json)
}
for n in 1 2 3; do
  [ $SECONDS -gt 430 ] && break
  burst tree $n dash_det dash_atomic
  burst turn_slices $n dash_det
  burst no_turn_wait $n dash_det
done
echo "call2: $SECONDS s" | tee -a $O/log.txt
