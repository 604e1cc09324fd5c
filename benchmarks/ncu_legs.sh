# Nsight Compute of the main backward beside patched copies of it, on the GPU machine: the implementations first,
# then each leg (kernels_src with <leg>.patch applied, through benchmarks/with_kernels.py), per shape. Cycles, tensor
# pipe, instructions and warp states; $OUT/ncu_cuts.tgz is rewritten after every step, so a call cut short keeps
# what it measured. Read it with benchmarks/read_cuts.py (its visit counts are those of the default shapes).
#
#   PATCHES=<folder of <leg>.patch> LEGS="a b" [IMPLS="ours_auto fa3"] [LEG_IMPLS=ours_auto] [SHAPES="...;..."] \
#     bash benchmarks/ncu_legs.sh
#
# IMPLS: device_run.sh's ncu implementations (fa3 needs .whl carried); LEG_IMPLS: those each leg runs as; SHAPES:
# ncu_bwd.py shapes separated by ';' (default full 3840, B 4); FALLBACK_PATCHES: a second folder searched for a
# leg's patch. Legs are patched once per machine, into /tmp/legs/<leg>.
R=${OUT:-/root/out}   # the device's $OUT (device_run.sh below gets its own)
export CUPY_DASH_CACHE_DIR=${CUPY_DASH_CACHE_DIR:-/tmp/dash_cache} PYTHONUNBUFFERED=1
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
m=sm__cycles_active.avg,sm__cycles_elapsed.max,sm__cycles_elapsed.avg,sm__pipe_tensor_cycles_active.avg
m=$m,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,gpu__time_duration.sum
m=$m,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed
m=$m,smsp__issue_active.avg.pct_of_peak_sustained_active
m=$m,launch__grid_size,gpc__cycles_elapsed.avg.per_second
export NCU_SECTIONS="--metrics $m --section WarpStateStats" NCU_PROFILE_BWD=0 NO_INSTALL=1 OUT=/tmp/ncu_legs_out
save() { (cd /tmp/ncu && tar czf $R/ncu_cuts.tgz *.raw.csv *.log *.json 2>/dev/null); }
IFS=';' read -ra shapes <<<"${SHAPES:---seqlen 3840 --batch 4}"
for shape in "${shapes[@]}"; do   # every leg of a shape before the next shape: what a call cut short keeps
  if [ -n "${IMPLS-ours_auto fa3}" ]; then
    NCU_SHAPES="$shape" FA3_WHL=1 NCU_IMPLS="${IMPLS-ours_auto fa3}" timeout 120 \
      bash benchmarks/device_run.sh ncu 2>&1 | grep -E "elapsed|cycles_active|inst_executed|rror"; save
  fi
  for leg in ${LEGS:-}; do
    [ -d /tmp/legs/$leg ] || { mkdir -p /tmp/legs/$leg && cp -r kernels_src /tmp/legs/$leg/ &&
      f=${PATCHES:?set PATCHES}/$leg.patch; [ -f $f ] || f=${FALLBACK_PATCHES:-$PATCHES}/$leg.patch
      patch -s -d /tmp/legs/$leg -p1 < $f; }
    NCU_SHAPES="$shape" NCU_KSRC=/tmp/legs/$leg/kernels_src NCU_TAG=_$leg NCU_IMPLS=${LEG_IMPLS:-ours_auto} \
      timeout 90 bash benchmarks/device_run.sh ncu 2>&1 | grep -E "elapsed|cycles_active|inst_executed|rror"; save
  done
done
