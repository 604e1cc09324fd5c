# Round 41, call C (prepared, not run; carry .whl; ~5 min with the start): the patched tree itself, after call A
# (what spread_shift.py cannot reach: varlen tables, and the builder's own records). Copies the tree to
# /tmp/patched, applies patches/spread_rectangles.patch there and builds its extensions in place (the installed
# package, which later calls on the same machine use, stays the tree's), then runs from the copy the patch's unit
# tests, the varlen backward's GPU tests and the backward's bits and float64 tests. $OUT: tests.log, log.txt. When
# the patch is merged, the same tests run on the tree and this script is not needed.
. benchmarks/device_env.sh
R=benchmarks/results/experiments/round41_20261207
rm -rf /tmp/patched && mkdir -p /tmp/patched && cp -r . /tmp/patched/ && cd /tmp/patched || exit 1
patch -s -p1 < $R/patches/spread_rectangles.patch || exit 1
python3 setup.py build_ext --inplace -j 16 > /tmp/patched_build.log 2>&1 || { tail -5 /tmp/patched_build.log; exit 1; }
export PYTHONPATH=/tmp/patched:$PYTHONPATH
python3 -c "import cupy_dash; print('cupy_dash from', cupy_dash.__file__)" | tee -a $O/log.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/unit/test_schedule_spread.py \
  tests/unit/test_schedule_varlen_fast.py tests/unit/test_schedule_one_builder.py > $O/tests.log 2>&1
tail -1 $O/tests.log | sed "s/^/patched unit /" | tee -a $O/log.txt
timeout -s INT -k 10 240 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/gpu/test_gpu_varlen_bwd.py \
  tests/gpu/test_gpu_attention.py -k "varlen or bitwise or (backward and d128 and not small_grid)" >> $O/tests.log 2>&1
tail -2 $O/tests.log | sed "s/^/patched gpu /" | tee -a $O/log.txt
echo "call C: $SECONDS s" | tee -a $O/log.txt
