# Round 41, call C (prepared, not run; carry .whl; ~5 min with the start): the patched tree itself, after call A
# (what spread_shift.py cannot reach: varlen tables, and the builder's own records). Applies
# patches/spread_rectangles.patch to the device's copy, rebuilds the extensions, runs the patch's unit tests, then
# the varlen backward's GPU tests and the backward's bits and float64 tests with the patched tables. $OUT: tests.log,
# log.txt. When the patch is merged, the same tests run on the tree and this script is not needed.
. benchmarks/device_env.sh
R=benchmarks/results/experiments/round41_20261207
patch -s -p1 < $R/patches/spread_rectangles.patch || exit 1
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1 || exit 1
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/unit/test_schedule_spread.py \
  tests/unit/test_schedule_varlen_fast.py tests/unit/test_schedule_one_builder.py > $O/tests.log 2>&1
tail -1 $O/tests.log | sed "s/^/patched unit /" | tee -a $O/log.txt
timeout -s INT -k 10 240 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/gpu/test_gpu_varlen_bwd.py \
  tests/gpu/test_gpu_attention.py -k "varlen or bitwise or (backward and d128 and not small_grid)" >> $O/tests.log 2>&1
tail -2 $O/tests.log | sed "s/^/patched gpu /" | tee -a $O/log.txt
echo "call C: $SECONDS s" | tee -a $O/log.txt
