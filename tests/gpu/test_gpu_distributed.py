"""The distributed examples, launched as a user launches them: examples/train_data_parallel.py (DDP and FSDP2)
under ``torchrun --nproc-per-node 2`` with nccl (one GPU per rank; needs two GPUs) and with gloo on one GPU (both
ranks on cuda:0: CUDA_VISIBLE_DEVICES=0), and examples/train_jax_dp.py over every local GPU. Each example trains
twice from one seed; the test reads its --json and requires every loss and the final weights bitwise equal
between the runs and the ranks' (GPUs') copies of the weights equal. Skipped without a Hopper GPU and the
framework."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

cupy = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 20
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _gpus() -> int:
    return cupy.cuda.runtime.getDeviceCount()


def _run(cmd, out: Path, env=None, timeout=420) -> dict:
    """Run ``cmd`` in examples/ (multicast off, the package importable), require exit 0, return its --json (its
    output is kept beside it, ``out`` with the suffix .log)."""
    environ = dict(os.environ, **MULTICAST_OFF, **(env or {}))
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES.parent), environ.get("PYTHONPATH")]))
    run = subprocess.run([*cmd, "--steps", str(STEPS), "--json", str(out)], cwd=EXAMPLES, env=environ,
                         capture_output=True, text=True, timeout=timeout)
    out.with_suffix(".log").write_text(f"{' '.join(cmd)}\n{run.stdout}\n{run.stderr}")
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-4000:]}\n{run.stderr[-8000:]}"
    return json.loads(out.read_text())


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
    assert result["runs_identical"] and result["replicas_identical"], result
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
