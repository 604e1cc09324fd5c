"""The CPU time of the inputs and references (float64 and low precision) of every case of tests/gpu/test_gpu_gqa.py,
one case after another in one process with one BLAS thread: what the GQA file's workers compute besides the GPU
calls (each case once; a worker that meets a case's other schedules after its cache dropped it computes it again).
    OPENBLAS_NUM_THREADS=1 python benchmarks/results/experiments/round22_20261206/gqa_references.py"""
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT / "tests" / "gpu"), str(ROOT / "tests")]
import test_gpu_gqa as gqa  # noqa: E402  (imports cupy; needs no GPU)

cases = list(gqa.CASES) + list(gqa.FP16_CASES) + list(gqa.SMALL_GRID_CASES)
times = []
for case in cases:
    t0 = time.time()
    gqa._data.__wrapped__(case)
    times.append((time.time() - t0, case.id))
times.sort(reverse=True)
print(f"{len(cases)} cases, {sum(t for t, _ in times):.0f} s in all; the longest:")
for t, name in times[:8]:
    print(f"  {t:5.1f} s  {name}")
