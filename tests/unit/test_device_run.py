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
