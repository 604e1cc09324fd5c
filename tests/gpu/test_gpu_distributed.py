"""The distributed examples, launched as a user launches them: examples/train_data_parallel.py (DDP and FSDP2)
under ``torchrun --nproc-per-node 2`` with nccl (one GPU per rank; needs two GPUs) and with gloo on one GPU (both
ranks on cuda:0: CUDA_VISIBLE_DEVICES=0), and examples/train_jax_dp.py over every local GPU. Each example trains
twice from one seed; the test reads its --json and requires every loss and the final weights bitwise equal
between the runs and (DDP, JAX) the ranks' (GPUs') copies of the weights equal; FSDP2 compares each rank's shards
between the runs. A run that hangs is stopped, its output kept. Skipped without a Hopper GPU and the framework."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

cupy = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 20
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                 "NCCL_DEBUG": "WARN"}


def _gpus() -> int:
    return cupy.cuda.runtime.getDeviceCount()


def _run(cmd, out: Path, env=None, timeout=180) -> dict:
    """Run ``cmd`` in examples/ (multicast off, the package importable), require exit 0 within ``timeout`` s, return
    its --json. Its output is kept beside it (``out`` with the suffix .log), also when it hangs: then its process
    group is stopped (:func:`_kill_group`)."""
    environ = dict(os.environ, **MULTICAST_OFF, **(env or {}))
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES.parent), environ.get("PYTHONPATH")]))
    proc = subprocess.Popen([*cmd, "--steps", str(STEPS), "--json", str(out)], cwd=EXAMPLES, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stdout = stderr = ""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(cmd)}: no exit within {timeout} s (killed)\n{stdout[-4000:]}\n{stderr[-8000:]}")
    finally:
        out.with_suffix(".log").write_text(f"{' '.join(cmd)}\n{stdout}\n{stderr}")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout[-4000:]}\n{stderr[-8000:]}"
    return json.loads(out.read_text())


def _kill_group(proc) -> None:
    """SIGTERM to the process group of ``proc``, SIGKILL 45 s later. torchrun's ranks run in sessions of their own,
    which the group's signal does not reach: torchrun stops them on SIGTERM (SIGKILL after its own 30 s), so it gets
    the time to, and no rank is left holding a GPU."""
    for sig, wait in ((signal.SIGTERM, 45), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.parametrize("backend", ["nccl", "gloo"], ids=["nccl_two_gpus", "gloo_one_gpu"])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_torch_example_repeats_bitwise_over_two_ranks(strategy, backend, tmp_path):
    pytest.importorskip("torch")
    env = None
    if backend == "nccl" and _gpus() < 2:
        pytest.skip(f"nccl with two ranks needs two GPUs, found {_gpus()}")
    if backend == "gloo":
        env = {"CUDA_VISIBLE_DEVICES": "0"}                   # both ranks on one GPU
    result = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   "train_data_parallel.py", "--strategy", strategy, "--backend", backend], tmp_path / "out.json", env)
    assert (result["world"], result["backend"], result["steps"]) == (2, backend, STEPS)
    assert result["runs_identical"], result
    # DDP: every rank's own replica compared; FSDP2: the ranks hold different shards (compared run to run)
    assert result["replicas_identical"] is (True if strategy == "ddp" else None), result
    for rank in result["ranks"]:
        first, second = rank
        assert len(first["losses"]) == STEPS and first["losses"] == second["losses"]
        assert first["losses"][-1] < first["losses"][0]                 # it trains


def test_jax_example_repeats_bitwise_over_every_gpu(tmp_path):
    jax = pytest.importorskip("jax")
    if not [d for d in jax.devices() if d.platform == "gpu"]:
        pytest.skip("JAX has no GPU backend")
    result = _run([sys.executable, "train_jax_dp.py"], tmp_path / "out.json")
    assert result["devices"] == _gpus() and result["steps"] == STEPS
    assert result["runs_identical"] and result["replicas_identical"], result
    a, b = result["runs"]
    assert a["losses"] == b["losses"] and a["weights_sha256"] == b["weights_sha256"]
    assert a["losses"][-1] < a["losses"][0]
