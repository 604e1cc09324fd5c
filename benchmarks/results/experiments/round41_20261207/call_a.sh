# Round 41, call A (prepared, not run: no device was lent after the first refusals; carry .whl; ~9 min with the
# start): the rotations spread over their rectangles (spread_shift.py: patches/spread_rectangles.patch's tables,
# applied to the tree's records) on the GPU. The backward's GPU tests with them (as a pytest plugin; compact tables
# read the same records), then ours deterministic in bursts: the tree (plain rotations), spread, and round 40's
# no_turn_wait kernels with the tree's tables (timing only: the bound), one process each, alternating rounds, five
# shapes. $OUT: tests.log, ab.tgz, log.txt. A short device budget: A_TESTS=0 leaves the tests out, A_LEGS="tree
# spread" the bound.
. benchmarks/device_env.sh
LEGS="no_turn_wait" HDIMS="128" . benchmarks/results/experiments/round40_20261207/legs.sh
R=benchmarks/results/experiments/round41_20261207
[ "${A_TESTS:-1}" = 1 ] && PYTHONPATH=$R:$PYTHONPATH timeout -s INT -k 10 170 python3 -m pytest -q -rf -n 8 \
  -p no:cacheprovider -p spread_shift tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_stall_bound.py \
  tests/gpu/test_gpu_pieces.py tests/gpu/test_gpu_compact.py \
  -k "stall or pieces or same_bits or float64 or long_context or (backward and not d96 and not d192 and not d256)" \
  > $O/tests.log 2>&1
tail -2 $O/tests.log | sed "s/^/spread tests /" | tee -a $O/log.txt
T=/tmp/ab; mkdir -p $T
SH="full:1280 full:3840 full:15360 causal:8192 causal:16384"
for n in 1 2 3; do
  [ $SECONDS -gt 430 ] && break
  for leg in ${A_LEGS:-tree spread no_turn_wait}; do
    case $leg in
      tree) run=(python3) ;;
      spread) run=(python3 $R/spread_shift.py) ;;
      *) run=(python3 benchmarks/with_kernels.py /tmp/legs/$leg/kernels_src) ;;
    esac
    timeout 80 "${run[@]}" benchmarks/burst_bench.py --impls dash_det --rounds 3 --shapes $SH \
      --json $T/${leg}_$n.json 2>&1 | grep -E "ours det|rror" | sed "s/^/$leg $n /" | tee -a $O/log.txt
  done
  (cd $T && tar czf $O/ab.tgz *.json)
done
echo "call A: $SECONDS s" | tee -a $O/log.txt
