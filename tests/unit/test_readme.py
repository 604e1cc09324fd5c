"""The README's set-up commands are the ones CI runs, and `python -m cupy_dash` works without a GPU."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands():
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    return [b.strip() for b in blocks]


def test_ci_runs_the_readme_test_command():
    main_job, tests = readme_commands()[:2]
    assert main_job == "pip install -e . && python -m cupy_dash"
    ci = (ROOT / ".ci" / "run").read_text()
    section = ci.split("# --- README test command")[1].split("# ---\n")[0]
    ci_steps = [re.sub(r"\s*\|\|\s*exit 1$", "", line).strip() for line in section.splitlines()[1:]]
    ci_steps = [s for s in ci_steps if s and not s.startswith(("rc=", "#"))]
    assert ci_steps == [s.strip() for s in tests.split("&&")]


def test_main_job_without_gpu_prints_the_schedule_analysis():
    import cupy
    if cupy.cuda.is_available():
        import pytest
        pytest.skip("a GPU is present: the main job runs the GPU demo instead")
    run = subprocess.run([sys.executable, "-m", "cupy_dash"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "No usable CUDA GPU" in run.stdout
    for policy in ("fa3", "descending", "shift", "symmetric_shift"):
        assert policy in run.stdout


def test_readme_is_short():
    """The README stays readable in five minutes: under 150 lines (details live in docs/)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines"
