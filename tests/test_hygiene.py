"""The suite's check for processes that outlive the tests (tests/_hygiene.py), run on a tiny test
file in a pytest of its own: a test that leaves a ``sleep`` running fails the session, which lists
the process and ends it, with and without pytest-xdist; a clean test passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_LEAVES_A_PROCESS = """
import os, subprocess, sys

def test_leaves_a_sleep_behind():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "left-behind"])
    with open(os.environ["HYGIENE_PID_FILE"], "w") as f:
        f.write(str(proc.pid))
"""

_CLEAN = """
import subprocess, sys

def test_waits_for_its_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def _pytest(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_tiny.py").write_text(source)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        "TVM_ROIALIGN_HYGIENE_GRACE_S": "1",
        "HYGIENE_PID_FILE": str(tmp_path / "pid"),
    }
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "_hygiene", "-p", "no:cacheprovider"]
    argv += ["--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "base"), *args, "test_tiny.py"]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the check reads /proc (Linux)")
@pytest.mark.parametrize("xdist", [[], ["-n", "1"]], ids=["serial", "xdist"])
def test_a_process_left_running_fails_the_session_and_is_ended(tmp_path, xdist):
    if xdist:
        pytest.importorskip("xdist")
    run = _pytest(tmp_path, _LEAVES_A_PROCESS, *xdist)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "1 passed" in output, output
    assert "processes that outlived the tests" in output and "left-behind" in output, output
    pid = int((tmp_path / "pid").read_text())
    assert not _alive(pid), f"{pid} still running"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the check reads /proc (Linux)")
def test_a_clean_session_passes(tmp_path):
    run = _pytest(tmp_path, _CLEAN)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "outlived" not in run.stdout
