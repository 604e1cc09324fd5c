"""The benchmark of benchmarks/ (a standalone script, not part of the package): the report (markdown and PNG)
from a synthetic result set, the argument parsing, the script run as ``python benchmarks/bench.py`` and under
benchmarks/with_kernels.py. No GPU needed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cupy_dash.cli.measure import SCHEDULES

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))      # the scripts import their siblings by name, as `python SCRIPT` does

import bench  # noqa: E402
import bench_report  # noqa: E402


def _report():
    configs = []
    for hdim in (64, 128):
        for causal in (False, True):
            for S in (1024, 4096):
                res = {"dash_fwd": dict(median_ms=1.0, tflops=300.0)}
                for i, s in enumerate(SCHEDULES):
                    res[f"dash_bwd_{s}"] = dict(median_ms=2.0 + 0.1 * i, tflops=400.0 - i, repeats_bits=True)
                res["dash_bwd_atomic"] = dict(median_ms=1.8, tflops=444.0)
                res["torch_bwd_det"] = dict(median_ms=4.0, tflops=200.0, repeats_bits=True)
                res["torch_fwd"] = dict(median_ms=1.1, tflops=273.0)
                if hdim == 128:
                    res["fa3_fwd"] = dict(median_ms=0.8, tflops=375.0)
                    res["fa3_bwd_det"] = dict(median_ms=2.5, tflops=320.0, repeats_bits=S != 1024)
                    res["fa3_bwd_nondet"] = dict(error="RuntimeError: boom")
                configs.append(dict(hdim=hdim, causal=causal, seqlen=S, results=res))
    meta = dict(date="2026-12-01", command="python benchmarks/bench.py", dtype="bf16", tokens=16384, hidden=2048,
                repeats=20, warmup=3, input_sets=2, flush_l2=False, missing_peers={"fa3": "not importable"})
    return dict(meta=meta, configs=configs)


def test_markdown_report_has_ratios_repeatability_and_failures():
    md = bench_report.markdown_report(_report())
    assert "| FA3 det bwd | 320 | 320 |" in md
    assert "| best cupy_dash det / FA3 det (speed) | 1.25 | 1.25 |" in md      # 2.5 ms / 2.0 ms (fa3 schedule)
    assert "| best cupy_dash det / our atomic (speed) | 0.90 | 0.90 |" in md
    assert "| FA3 det bwd | **no** | yes |" in md
    assert "fa3_bwd_nondet" not in md and "FA3 non-det bwd: RuntimeError: boom" in md
    assert "Missing peers: fa3: not importable" in md
    assert "| cupy_dash fwd / torch FA2 fwd (speed) | 1.10 | 1.10 |" in md
    assert "| cupy_dash fwd / FA3 fwd (speed) | 0.80 | 0.80 |" in md
    assert md.count("cupy_dash fwd / FA3 fwd") == 2                             # d128 full and causal only


def test_plot_report_writes_a_png(tmp_path):
    path = tmp_path / "bench.png"
    bench_report.plot_report(_report(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_parse_args_defaults_and_errors():
    opts = bench.parse_args(["--quick", "--no-fa3"])
    assert opts["seqlens"] == (1024, 4096) and opts["hdims"] == (128,) and not opts["fa3"] and opts["torch"]
    assert opts["schedules"] == SCHEDULES + ("atomic",)
    with pytest.raises(SystemExit):
        bench.parse_args(["--seqlens", "1000", "--tokens", "16384"])          # does not divide 16384 tokens
    assert bench.parse_args(["--seqlens", "1280", "3840", "15360"])["tokens"] == 15360
    assert bench.parse_args(["--seqlens", "1024", "4096"])["tokens"] == 16384
    assert bench.parse_args(["--seqlens", "32768"])["tokens"] == 32768
    with pytest.raises(SystemExit):
        bench.parse_args(["--schedules", "random"])
    assert bench.parse_args(["--group", "8"])["group"] == 8 and bench.parse_args([])["group"] == 1
    with pytest.raises(SystemExit, match="--group: 3"):
        bench.parse_args(["--group", "3"])               # 32 heads of head dim 64 are not a multiple of 3
    assert bench.parse_args(["--pending-head-dims"])["pending_head_dims"]
    assert not bench.parse_args([])["pending_head_dims"]


def _run(*argv, cwd=BENCHMARKS.parent):
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_script_runs_standalone():
    """`python benchmarks/bench.py` from any folder: its imports resolve, --help names it, and without a Hopper GPU
    it says so and exits 1 before measuring anything."""
    p = _run(str(BENCHMARKS / "bench.py"), "--help", cwd="/")
    assert p.returncode == 0 and p.stdout.startswith("usage: python benchmarks/bench.py"), p.stderr
    for option in ("--seqlens", "--schedules", "--fwd-only", "--group", "--no-fa3", "--out"):
        assert option in p.stdout
    import cupy
    if cupy.cuda.is_available():
        pytest.skip("a GPU is present: the script would benchmark it")
    p = _run("benchmarks/bench.py", "--quick", "--no-fa3")
    assert p.returncode == 1 and "nothing to benchmark" in p.stderr, p.stderr


def test_with_kernels_runs_a_script_with_other_kernel_sources(tmp_path):
    src = tmp_path / "kernels_src"
    src.mkdir()
    (src / "bwd_main.cu").write_text("")
    script = tmp_path / "show.py"
    script.write_text("import sys\nfrom cupy_dash.cuda import jit\nprint(jit._default_kernel_dir(), sys.argv[1:], "
                      "sys.path[0])\n")
    p = _run("benchmarks/with_kernels.py", str(src), str(script), "--x", "1")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(src), "['--x',", "'1']", str(tmp_path)]


def test_value_head_dim_in_the_arguments_flops_and_report(tmp_path):
    """--hdim-v: accepted where kernels.VALUE_HEAD_DIMS has it (a SystemExit naming it otherwise), FLOPs per GEMM
    width, its own table and panel apart from the equal-width runs."""
    from cupy_dash.cli.measure import attention_flops
    assert bench.parse_args(["--hdims", "192", "--hdim-v", "128", "--hidden", "1536"])["hdim_v"] == 128
    with pytest.raises(SystemExit, match="--hdim-v: 128 is not a value head dim of head dim 64"):
        bench.parse_args(["--hdims", "64", "--hdim-v", "128"])
    assert attention_flops(2, 8, 1024, 1024, 128, False, "bwd") == 2.5 * attention_flops(2, 8, 1024, 1024, 128, False)
    assert attention_flops(1, 1, 10, 10, 192, True, "fwd", 128) == 2 * 100 * (192 + 128) / 2
    assert attention_flops(1, 1, 10, 10, 192, False, "bwd", 128) == 2 * 100 * (3 * 192 + 2 * 128)
    report = _report()
    res = {"dash_fwd": dict(median_ms=1.0, tflops=300.0), "dash_bwd_auto": dict(median_ms=2.0, tflops=200.0)}
    report["configs"] += [dict(hdim=192, hdim_v=128, causal=False, seqlen=1024, results=res),
                          dict(hdim=192, causal=False, seqlen=1024, results=res)]
    md = bench_report.markdown_report(report)
    assert "| head dim 192, value head dim 128, full | 1k |" in md and "| head dim 192, full | 1k |" in md
    bench_report.plot_report(report, str(tmp_path / "v.png"))
