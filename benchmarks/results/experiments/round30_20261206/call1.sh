# Round 30, call 1 (~8 min with the start; carry .whl): the order in which the two MMA warpgroups hand their GEMMs to
# the tensor pipe (benchmarks/NOTES.md, "Issue 19", item 2). Patches: wg_order (warpgroup 1's S^T after warpgroup 0's
# dP^T), wg_order_dk0 (and warpgroup 0 issues dK before the dS barrier), wg_order_dk (both warpgroups do).
# 1) the bits of each patch against the tree's (the order changes no arithmetic: they must be equal);
# 2) steady_ab, two processes per leg, ours deterministic beside FA3's non-deterministic backward;
# 3) the timelines' GEMM order report, tree and wg_order (whose timeline build spills 40 bytes: a rough reading).
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} FA3_WHL=1 LEGS=2 PYTHONUNBUFFERED=1
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache
TOP=${OUT:-/root/out}; mkdir -p $TOP/bits $TOP/tl
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee $TOP/device_info.txt
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
for p in wg_order wg_order_dk0 wg_order_dk; do
  mkdir -p .p_$p && cp -r kernels_src .p_$p/ && (cd .p_$p && patch -s -p1 <../benchmarks/patches/$p.patch)
done
timeout 150 python3 benchmarks/bits_digest.py --out $TOP/bits/tree.json > $TOP/bits/log.txt 2>&1
for p in wg_order wg_order_dk0 wg_order_dk; do
  timeout 100 python3 benchmarks/with_kernels.py .p_$p/kernels_src benchmarks/bits_digest.py --out $TOP/bits/$p.json \
    >> $TOP/bits/log.txt 2>&1 || echo "$p: bits_digest failed or timed out"
  echo "$p: $(python3 benchmarks/bits_digest.py --compare $TOP/bits/tree.json $TOP/bits/$p.json 2>&1 | tail -3)"
done
OUT=$TOP/ab AB_PATCHES="wg_order wg_order_dk0 wg_order_dk" \
  STEADY_ARGS="--shapes full:3840 full:15360 causal:8192 --rounds 4 --loop-s 0.4" \
  timeout 330 bash benchmarks/device_run.sh steady_ab 2>&1 | tail -26
export CUPY_DASH_BWD_FULL_BLOCK_M=80 CUPY_DASH_BWD_CAUSAL_BLOCK_M=80
cd benchmarks
timeout 60 python3 timeline.py --shapes 128:full:3840 128:causal:8192 --policies symmetric_shift \
  > $TOP/tl/tree.txt 2>&1
grep -E "^d128|completion orders|mean cycles after|in either|CTA cycles per" $TOP/tl/tree.txt
timeout 60 python3 with_kernels.py ../.p_wg_order/kernels_src timeline.py --shapes 128:full:3840 128:causal:8192 \
  --policies symmetric_shift > $TOP/tl/wg_order.txt 2>&1
grep -E "^d128|completion orders|mean cycles after|in either|CTA cycles per" $TOP/tl/wg_order.txt
cd ..; rm -rf .p_* .ab_*
