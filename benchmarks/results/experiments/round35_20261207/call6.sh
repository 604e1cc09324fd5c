# Round 35, call 6 (~4-6 min with the start): Nsight Compute at full 3840 (B 4), ours deterministic and atomic, of
# dq_add_late (patches/: the writer adds visit j's dQ once both MMA warpgroups have issued visit j + 1's dV; README,
# "Call 6"), then the bits of dq_add_late against the tree's (the order of the adds is unchanged: equal).
# $OUT: ncu_cuts.tgz, bits/.
R=${OUT:-/root/out}
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
D=benchmarks/results/experiments/round35_20261207
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
m=sm__cycles_active.avg,sm__cycles_elapsed.max,sm__cycles_elapsed.avg,sm__pipe_tensor_cycles_active.avg
m=$m,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,gpu__time_duration.sum
m=$m,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed
m=$m,smsp__issue_active.avg.pct_of_peak_sustained_active
m=$m,launch__grid_size,gpc__cycles_elapsed.avg.per_second
export NCU_SECTIONS="--metrics $m --section WarpStateStats" NCU_PROFILE_BWD=0 NO_INSTALL=1 OUT=/tmp/c6
save() { (cd /tmp/ncu && tar czf $R/ncu_cuts.tgz *.raw.csv *.log 2>/dev/null); }
leg=dq_add_late
mkdir -p /tmp/legs/$leg && cp -r kernels_src /tmp/legs/$leg/ && patch -s -d /tmp/legs/$leg -p1 < $D/patches/$leg.patch
NCU_SHAPES="--seqlen 3840 --batch 4" NCU_KSRC=/tmp/legs/$leg/kernels_src NCU_TAG=_$leg \
  NCU_IMPLS="ours_auto ours_atomic" timeout 120 bash benchmarks/device_run.sh ncu 2>&1 | grep -E "cycles_active|rror"
save
NCU_SHAPES="--seqlen 3840 --batch 4" NCU_IMPLS="ours_auto" timeout 60 bash benchmarks/device_run.sh ncu 2>&1 \
  | grep -E "cycles_active|rror"
save
mkdir -p $R/bits
timeout 150 python3 benchmarks/with_kernels.py /tmp/legs/$leg/kernels_src benchmarks/bits_digest.py \
  --out $R/bits/$leg.json > $R/bits/log.txt 2>&1
timeout 150 python3 benchmarks/bits_digest.py --out $R/bits/tree.json >> $R/bits/log.txt 2>&1
python3 benchmarks/bits_digest.py --compare $R/bits/tree.json $R/bits/$leg.json 2>&1 | tail -3
