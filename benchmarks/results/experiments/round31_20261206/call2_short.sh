# Round 31's call 2 cut to full 3840 for a call of ~4 min (a session left with ~300 s of device time): ours
# deterministic, the four legs that tell most (the math together, then the dQ store, the dS^T store, ex2), FA3 last.
# Same archive and reader as call2.sh ($OUT/ncu_cuts.tgz, read_cuts.py), saved after each leg.
R=${OUT:-/root/out}
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/experiments/round31_20261206
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
m=sm__cycles_active.avg,sm__cycles_elapsed.max,sm__cycles_elapsed.avg,sm__pipe_tensor_cycles_active.avg
m=$m,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,gpu__time_duration.sum
m=$m,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed
m=$m,smsp__issue_active.avg.pct_of_peak_sustained_active
m=$m,launch__grid_size,gpc__cycles_elapsed.avg.per_second
export NCU_SECTIONS="--metrics $m --section WarpStateStats" NCU_PROFILE_BWD=0 NO_INSTALL=1 OUT=/tmp/c2
save() { (cd /tmp/ncu && tar czf $R/ncu_cuts.tgz *.raw.csv *.log *.json 2>/dev/null); }
full="--seqlen 3840 --batch 4"
NCU_SHAPES="$full" NCU_IMPLS="ours_auto" timeout 60 bash benchmarks/device_run.sh ncu 2>&1 |
  grep -E "elapsed|cycles_active|inst_executed|rror"; save
for leg in cut_math cut_dq_store cut_ds_store cut_exp2; do
  mkdir -p /tmp/legs/$leg && cp -r kernels_src /tmp/legs/$leg/ && patch -s -d /tmp/legs/$leg -p1 < $D/patches/$leg.patch
  NCU_SHAPES="$full" NCU_KSRC=/tmp/legs/$leg/kernels_src NCU_TAG=_$leg NCU_IMPLS=ours_auto timeout 50 \
    bash benchmarks/device_run.sh ncu 2>&1 | grep -E "elapsed|cycles_active|inst_executed|rror"; save
done
NCU_SHAPES="$full" FA3_WHL=1 NCU_IMPLS="fa3" timeout 90 bash benchmarks/device_run.sh ncu 2>&1 |
  grep -E "elapsed|cycles_active|inst_executed|rror"; save
