# Round 43, call 6 (carry .whl; ~6 min with the start; after call 4): Nsight Compute's full set and SASS source pages
# of ours deterministic (`auto`) and FA3's non-deterministic main backward at causal 16k (B 1) and full 3840 (B 4),
# on the merged tree: the per-instruction stall samples of both hand-offs (the dQ store, the bulk add, the waits
# around them) and benchmarks/sass_ops.py's per-stretch comparison, as round 36's call 6 asked at full 3840 only.
# $OUT: ncu.tgz (details, raw, source pages, sass_ops), log.txt.
. benchmarks/device_env.sh
NO_INSTALL=1 NCU_PROFILE_BWD=0 FA3_WHL=1 NCU_SHAPES="--causal --seqlen 16384 --batch 1;--seqlen 3840 --batch 4" \
  OUT=$O timeout 500 bash benchmarks/device_run.sh ncu 2>&1 | grep -E "elapsed|FA3 against|rror|stalls" \
  | tee -a $O/log.txt
echo "call6: $SECONDS s" | tee -a $O/log.txt
