# Round 43, call 2 (carry .whl; ~3-5 min with the start): the standing on whichever card comes. On an H200 (the
# issue's card; no H200 standing since the dQ store split) the whole of benchmarks/standing.sh; on an H100 (a third
# process beside call 1's two) only head dim 128. $OUT: call2.tgz, log.txt.
. benchmarks/device_env.sh
case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in *H200*) PARTS="d128 d64 fwd" ;; *) PARTS="d128" ;; esac
PARTS="$PARTS" TOP=/tmp/call2 bash benchmarks/standing.sh 2>&1 | tee -a $O/log.txt
(cd /tmp/call2 && tar czf $O/call2.tgz *)
echo "call2: $SECONDS s" | tee -a $O/log.txt
