"""benchmarks/device_run.sh, the script every GPU run goes through, checked before device time is spent on it: bash
parses it and the stages file it sources (benchmarks/device_stages_ab.sh), and the stages its usage line names are
the stages the two have (each an `if [ "$stage" = NAME ]` branch), so that no documented stage silently does
nothing. CPU only."""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "device_run.sh"
STAGES = SCRIPT.with_name("device_stages_ab.sh")       # sourced by SCRIPT
INTERNAL = {"engine_bits"}       # set by the engine stage itself, not asked for on the command line


def _usage_stages(text: str) -> set:
    usage = re.search(r"device_run\.sh \[([^\]]*)\]", text.replace("\n#", ""), re.S)
    assert usage, "no usage line [a|b|...] in the header"
    return {s.strip() for s in usage.group(1).split("|")}


def _branch_stages(text: str) -> set:
    return set(re.findall(r'"\$stage" = ([a-z_0-9]+)', text))


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_parses_it():
    for script in (SCRIPT, STAGES):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, (script.name, proc.stderr)


def test_it_sources_the_stages_file():
    assert f'/{STAGES.name}"' in SCRIPT.read_text()


def test_the_usage_line_names_exactly_its_stages():
    text = SCRIPT.read_text()
    usage, branches = _usage_stages(text), _branch_stages(text + STAGES.read_text())
    assert usage - branches == set(), f"named in the usage line, with no branch: {sorted(usage - branches)}"
    omitted = branches - usage - INTERNAL
    assert omitted == set(), f"branches the usage line omits: {sorted(omitted)}"


def test_the_check_sees_a_stale_name():
    text = ('# bash benchmarks/device_run.sh [a|b|gone]\n'
            'if [ "$stage" = a ]; then :; fi\nif [ "$stage" = b ]; then :; fi\n')
    assert _usage_stages(text) - _branch_stages(text) == {"gone"}


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="no bash / timeout")
@pytest.mark.parametrize("suite, lanes, warned", [("a:500 b:100", 1, ["lane 0 may take 630 s"]),
                                                  ("a:500 b:100", 2, []), ("a:300 b:50 c:260", 2,
                                                                           ["lane 0 may take 590 s"])],
                         ids=["one-lane-over", "two-lanes-fit", "first-lane-over"])
def test_suite_warns_when_a_lane_could_outrun_the_call(tmp_path, suite, lanes, warned):
    """The suite stage adds each lane's file limits plus the 15 s each may run past its limit, and says so when a
    lane could outrun the device call (the twenty-first round lost a call that way). python3 and nvidia-smi are
    stand-ins here: every pytest run ends at once."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in (("python3", "exit 0"), ("nvidia-smi", "echo stand-in")):
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "NO_INSTALL": "1", "SUITE": suite,
           "SUITE_LANES": str(lanes), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(SCRIPT), "suite"], capture_output=True, text=True, env=env, timeout=60,
                          cwd=SCRIPT.parents[1])
    assert proc.returncode == 0, proc.stderr
    assert re.findall(r"lane \d may take \d+ s", proc.stdout) == warned
    assert (tmp_path / "out" / "gpu_tests_per_file.log").exists()
