# Round 35, call 8 (~3 min with the start): the forward with the O rescale skipped where a warp's rows all kept
# their max (patches/fwd_skip_rescale.patch: exact, corr = 1; README, "Call 8"). Its out / lse bits against the
# tree's (benchmarks/bits_digest.py --forward), then Nsight Compute of both forwards at causal 8k (B 2). $OUT: bits/,
# ncu_cuts.tgz.
# NOTES: the run (commit 4da65db's text) took the digests with this folder's fwd_digest.py, the same four cases and
# hashes, since folded into bits_digest.py as --forward.
R=${OUT:-/root/out}
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
D=benchmarks/results/experiments/round35_20261207
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
leg=fwd_skip_rescale
mkdir -p /tmp/legs/$leg $R/bits && cp -r kernels_src /tmp/legs/$leg/ &&
  patch -s -d /tmp/legs/$leg -p1 < $D/patches/$leg.patch
timeout 60 python3 benchmarks/bits_digest.py --forward --out $R/bits/tree.json > $R/bits/log.txt 2>&1
timeout 60 python3 benchmarks/with_kernels.py /tmp/legs/$leg/kernels_src benchmarks/bits_digest.py --forward \
  --out $R/bits/$leg.json >> $R/bits/log.txt 2>&1
python3 benchmarks/bits_digest.py --compare $R/bits/tree.json $R/bits/$leg.json
m=sm__cycles_active.avg,sm__cycles_elapsed.max,sm__cycles_elapsed.avg,smsp__inst_executed.sum,gpu__time_duration.sum
m=$m,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed
export NCU_SECTIONS="--metrics $m" NCU_PROFILE_BWD=0 NO_INSTALL=1 OUT=/tmp/c8 NCU_FORWARD=1
save() { (cd /tmp/ncu && tar czf $R/ncu_cuts.tgz *.raw.csv *.log 2>/dev/null); }
NCU_SHAPES="--causal --seqlen 8192 --batch 2" NCU_IMPLS="ours" timeout 60 bash benchmarks/device_run.sh ncu 2>&1 \
  | grep -E "cycles_active|inst_exec|rror"; save
NCU_SHAPES="--causal --seqlen 8192 --batch 2" NCU_KSRC=/tmp/legs/$leg/kernels_src NCU_TAG=_$leg NCU_IMPLS="ours" \
  timeout 60 bash benchmarks/device_run.sh ncu 2>&1 | grep -E "cycles_active|inst_exec|rror"; save
