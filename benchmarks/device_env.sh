# Sourced at the top of a GPU call script on the device machine (carry .whl for FA3): the environment the
# benchmarks expect, cupy_dash installed from the tree and the flash-attn3-jax wheel under /tmp/site on PYTHONPATH
# (once per machine: a second script in the same call skips the installs), and the card's name, power limit and top
# clock appended to $OUT/log.txt. Sets O to the output folder.
export CUPY_DASH_CACHE_DIR=${CUPY_DASH_CACHE_DIR:-/tmp/dash_cache} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
O=${OUT:-/root/out}
if [ ! -f /tmp/device_env.done ]; then
  python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
  touch /tmp/device_env.done
fi
case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} ;; esac
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee -a $O/log.txt
