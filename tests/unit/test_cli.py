"""``python -m cupy_dash``: the top-level dispatcher (help, version, unknown flags and commands) and the argument
checks of ``schedule`` (costs, sizes, ``--plot``). CPU only."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import cupy_dash
from cupy_dash import __main__ as entry
from cupy_dash.cli import gpu as cli_gpu, schedule as cli_schedule

REPO_ROOT = Path(cupy_dash.__file__).resolve().parent.parent
SMALL = ["--seqlen-q", "256", "--heads", "2", "--num-sms", "4"]     # a shape that simulates in milliseconds


def run_main(argv):
    """The exit status of ``python -m cupy_dash ARGV`` run in this process (argparse exits count too)."""
    try:
        code = entry.main(argv)
    except SystemExit as exc:
        code = exc.code
    return code


@pytest.fixture
def no_analysis(monkeypatch):
    """Make the schedule analysis (the default job's and the schedule command's) fail the test if it runs."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the schedule analysis ran")
    monkeypatch.setattr(cli_gpu, "print_default_analysis", forbidden)
    monkeypatch.setattr(cli_schedule, "analyse", forbidden)


# ------------------------------------------------------------------------------------------------ top level
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_exits_0(flag, capsys, no_analysis):
    assert run_main([flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m cupy_dash")
    for command in ("demo", "compile", "schedule"):
        assert f"  {command} " in out
    assert "bench" not in out


def test_bench_left_the_package(capsys, no_analysis):
    """The benchmark is benchmarks/bench.py now: the old command is an error that names it."""
    assert run_main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert "no command 'bench' in the package" in err and "python benchmarks/bench.py" in err


def test_version(capsys, no_analysis):
    assert run_main(["--version"]) == 0
    assert capsys.readouterr().out == f"cupy_dash {cupy_dash.__version__}\n"


@pytest.mark.parametrize("argv, named", [(["--bogus"], "--bogus"), (["frobnicate"], "'frobnicate'"),
                                         (["--seqlen", "4096"], "--seqlen"), (["--causal", "schedule"], "--causal")],
                         ids=["flag", "command", "flag-with-value", "flag-before-command"])
def test_unknown_flag_or_command_exits_2(argv, named, capsys, no_analysis):
    assert run_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "python -m cupy_dash: error:" in captured.err and named in captured.err.splitlines()[-1]


def test_dispatch(monkeypatch):
    calls = []
    monkeypatch.setattr(cli_gpu, "default_main", lambda argv: calls.append(("default", argv)) or 0)
    monkeypatch.setattr(cli_schedule, "main", lambda argv: calls.append(("schedule", argv)) or 0)
    assert run_main([]) == 0
    assert run_main(["schedule", "--help", "--causal"]) == 0          # a command's --help is the command's
    assert calls == [("default", []), ("schedule", ["--help", "--causal"])]


def test_python_m_help_on_this_machine():
    """The real entry point: no GPU here, where --help used to print the schedule analysis."""
    p = subprocess.run([sys.executable, "-m", "cupy_dash", "--help"], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("usage:") and "Schedule analysis" not in p.stdout, p.stderr
    p = subprocess.run([sys.executable, "-m", "cupy_dash", "--nope"], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and "--nope" in p.stderr


# ------------------------------------------------------------------------------------------------ schedule
BAD_NUMBERS = [["--c", "inf"], ["--c", "nan"], ["--c", "0"], ["--c", "-1"], ["--c", "fast"], ["--r", "inf"],
               ["--r", "nan"], ["--r", "-0.5"], ["--num-sms", "0"], ["--block-m", "-64"], ["--seqlen-k", "1.5"]]


@pytest.mark.parametrize("argv", BAD_NUMBERS, ids=["=".join(a) for a in BAD_NUMBERS])
def test_schedule_rejects_bad_numbers_before_the_analysis(argv, capsys, no_analysis):
    named = argv[0]
    assert run_main(["schedule", *argv]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and "\n" not in err
    assert err.startswith(f"cupy_dash schedule: error: argument {named}:") and repr(argv[1]) in err


def test_schedule_accepts_zero_reduction_cost(capsys):
    assert cli_schedule.main([*SMALL, "--r", "0"]) == 0
    out = capsys.readouterr().out
    assert "reduce r=0 per visit" in out and "nan" not in out and "inf" not in out


def _plot_targets(tmp_path):
    directory = tmp_path / "a-directory.png"
    directory.mkdir()
    return {
        "missing-directory": (tmp_path / "no" / "such" / "dir" / "gantt.png", "cannot write it"),
        "a-directory": (directory, "cannot write it"),
        "unsupported-extension": (tmp_path / "gantt.xyz", "unsupported file extension '.xyz'"),
        "no-extension": (tmp_path / "gantt", "no file extension"),
    }


@pytest.mark.parametrize("case", ["missing-directory", "a-directory", "unsupported-extension", "no-extension"])
def test_schedule_plot_path_checked_before_the_analysis(case, tmp_path, capsys, no_analysis):
    path, reason = _plot_targets(tmp_path)[case]
    assert run_main(["schedule", *SMALL, "--plot", str(path)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and "\n" not in err and "Traceback" not in err
    assert err.startswith(f"cupy_dash schedule: error: --plot {path}: {reason}")


def test_plot_path_check_leaves_files_as_they_were(tmp_path):
    new = tmp_path / "new.svg"
    assert cli_schedule.check_plot_path(str(new)) is None and not new.exists()
    old = tmp_path / "old.PDF"                     # extensions are case-insensitive, as in matplotlib
    old.write_bytes(b"keep me")
    assert cli_schedule.check_plot_path(str(old)) is None and old.read_bytes() == b"keep me"


def test_schedule_plot_writes_a_pdf(tmp_path, capsys):
    pdf = tmp_path / "gantt.pdf"
    assert cli_schedule.main([*SMALL, "--causal", "--plot", str(pdf)]) == 0
    assert pdf.read_bytes()[:5] == b"%PDF-" and f"wrote {pdf}" in capsys.readouterr().out


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, capsys, monkeypatch, no_analysis):
    for name in ("matplotlib", "matplotlib.backend_bases"):
        monkeypatch.setitem(sys.modules, name, None)            # "not installed": importing it raises
    assert run_main(["schedule", *SMALL, "--plot", str(tmp_path / "gantt.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--plot needs matplotlib" in err and "pip install matplotlib" in err and "cupy_dash[plot]" in err


def _module_level_imports(tree):
    """Names imported by statements that run when the module is imported (not inside a def or class)."""
    stack, names = list(tree.body), []
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack += [c for c in ast.iter_child_nodes(node) if isinstance(c, (ast.stmt, ast.excepthandler))]
    return names


def test_matplotlib_is_optional():
    """matplotlib is the `plot` extra, not a dependency: no module of the package imports it on import."""
    offenders = [f"{path.name}: {name}" for path in sorted((REPO_ROOT / "cupy_dash").glob("*.py"))
                 for name in _module_level_imports(ast.parse(path.read_text()))
                 if name.split(".")[0] == "matplotlib"]
    assert offenders == []


# ------------------------------------------------------------------------------------------------ what auto is
def _auto_lines(out):
    return [line for line in out.splitlines() if "auto" in line and "pick" in line]


@pytest.mark.parametrize("argv, policy, form", [
    (["--seqlen-q", "131072", "--causal"], "descending", "compact"),        # 16793600 visits: compact tables
    (SMALL + ["--causal"], None, "per-visit"),
    (SMALL + ["--causal", "--compact"], None, "per-visit"),                 # the analysis's form is not the backward's
], ids=["128k-causal", "small", "small-compact-analysis"])
def test_schedule_says_once_what_auto_runs(monkeypatch, capsys, argv, policy, form):
    """One line says what auto is for the problem: the backward's table form and its policy there
    (compact_device.backward_auto), whichever analysis the command runs (the 128k problem used to say
    'auto picks symmetric_shift' and then 'the compact build runs auto as descending')."""
    from cupy_dash import schedule
    from cupy_dash.schedule import compact_device
    monkeypatch.delenv(compact_device.ENV, raising=False)
    assert cli_schedule.main(argv) == 0
    lines = _auto_lines(capsys.readouterr().out)
    assert len(lines) == 1, lines
    if policy is None:              # per-visit tables: schedule.build's choice for the same problem
        policy = schedule.build("auto", seqlen_q=256, seqlen_k=256, block_m=64, block_n=128, num_heads=2,
                                causal=True, num_sms=4).policy
    assert lines[0].startswith(f"auto picks {policy!r}: the backward of this problem uses {form} tables (")
    others = {"fa3", "descending", "shift", "symmetric_shift"} - {policy}
    assert not any(f"'{p}'" in lines[0] for p in others), lines[0]


def test_schedule_says_where_the_backward_cuts_the_last_wave(monkeypatch, capsys):
    """At a long full mask the auto line adds the backward's split KV columns (pieces.num_pieces_for), unless
    CUPY_DASH_SPLIT_COLUMNS=0; a causal problem never has them."""
    argv = ["--seqlen-q", "3840", "--block-m", "80", "--heads", "64", "--model", "engine", "--r", "0.8"]
    monkeypatch.delenv("CUPY_DASH_SPLIT_COLUMNS", raising=False)
    monkeypatch.delenv("CUPY_DASH_SPLIT_PIECES", raising=False)
    assert cli_schedule.main(argv) == 0
    (line,) = _auto_lines(capsys.readouterr().out)
    assert line.endswith("it cuts their last wave into 72 split KV columns of 3 pieces, the busiest CTA's 720 visits "
                         "to 704 (docs/schedules.md, \"Split KV columns\")"), line
    monkeypatch.setenv("CUPY_DASH_SPLIT_COLUMNS", "0")
    assert cli_schedule.main(argv) == 0
    assert "split KV columns" not in _auto_lines(capsys.readouterr().out)[0]
    monkeypatch.delenv("CUPY_DASH_SPLIT_COLUMNS")
    assert cli_schedule.main(SMALL + ["--causal"]) == 0
    assert "split KV columns" not in _auto_lines(capsys.readouterr().out)[0]


def test_schedule_auto_follows_the_compact_tables_variable(monkeypatch, capsys):
    monkeypatch.setenv("CUPY_DASH_COMPACT_TABLES", "1")
    assert cli_schedule.main(SMALL + ["--causal"]) == 0
    assert _auto_lines(capsys.readouterr().out) == [
        "auto picks 'descending': the backward of this problem uses compact tables (CUPY_DASH_COMPACT_TABLES=1), "
        "where auto is the fastest closed-form rank rule (a counted rank, shift or symmetric_shift, runs the compact "
        "dQ writer at about half speed: docs/decisions/table-forms.md)"]


def test_default_job_is_the_schedule_command_it_names(monkeypatch, capsys):
    """Without a Hopper GPU the default job runs the schedule command with explicit options and names them (a
    causal shape in the engine model; the command's own defaults are a full mask in the DAG model): what follows
    its first line is exactly that command's output."""
    monkeypatch.setattr(cli_gpu, "_gpu_state", lambda: ("none", "no CUDA device"))
    assert run_main([]) == 0
    first, *rest = capsys.readouterr().out.splitlines()
    argv = cli_gpu.default_analysis_argv()
    assert first.startswith(f"No usable CUDA GPU (no CUDA device), so no demo: showing `python -m cupy_dash schedule "
                            f"{' '.join(argv)}`")
    assert "--causal" in argv and argv[argv.index("--model") + 1] == "engine"
    assert "full mask in the paper's DAG model" in first
    assert rest[0].startswith("Schedule analysis (engine model: compute c=1, reduce r=0.8") and "causal mask" in rest[0]
    assert run_main(["schedule", *argv]) == 0
    assert capsys.readouterr().out.splitlines() == rest
    assert run_main(["schedule"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("Schedule analysis (DAG model") and "full mask" in header


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--seqlen", "0"], ["--batch", "-1"], ["--heads", "x"]])
def test_demo_arguments_are_checked_as_usage_errors(argv, capsys):
    """The demo's sizes and repeats are positive integers: a bad one is a usage error (exit 2), not a traceback
    after the reference is computed."""
    with pytest.raises(SystemExit) as exc:
        cli_gpu._demo_parser().parse_args(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err
