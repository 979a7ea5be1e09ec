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


# The tree: what ``git ls-files`` holds is source, and the root holds only the project's own files.

ROOT = Path(__file__).resolve().parents[1]

#: the largest a tracked file may be (a picture of the docs is under 0.5 MB)
MAX_TRACKED_BYTES = 5 * 1024 * 1024

#: what the repository's root holds: the package, its tests, benchmarks, docs and examples
ROOT_ENTRIES = {".ci", ".gitignore", "README.md", "benchmarks", "docs", "examples", "pyproject.toml",
                "tests", "tools", "tvm_roialign"}

#: scratch files that tools write into the working directory (ONNX Runtime's quantizer: its shape
#: inference's model, external weights named by a uuid)
SCRATCH = ("sym_shape_infer_temp.onnx", "*.data", "*.onnx")


def _git(*args: str) -> list[str]:
    run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return [line for line in run.stdout.split("\0") if line]


def tree_faults(
    root: Path, tracked: list[str], untracked: list[str], limit: int = MAX_TRACKED_BYTES
) -> list[str]:
    """What the tree should not hold: tracked files over ``limit`` bytes, entries of the root
    (tracked, or untracked and not ignored) that are not :data:`ROOT_ENTRIES`, and scratch files
    (:data:`SCRATCH`) at the root, ignored or not."""
    faults = []
    for name in tracked:
        path = root / name
        if path.is_file() and path.stat().st_size > limit:
            faults.append(
                f"{name}: {path.stat().st_size / 2**20:.1f} MB tracked (at most {limit / 2**20:.0f} MB)"
            )
    for name in sorted({n.split("/")[0] for n in (*tracked, *untracked)} - ROOT_ENTRIES):
        faults.append(f"{name}: not one of the root's entries ({', '.join(sorted(ROOT_ENTRIES))})")
    for pattern in SCRATCH:
        faults += [f"{p.name}: a tool's scratch file at the root" for p in sorted(root.glob(pattern))]
    return faults


def test_the_tree_check_finds_a_large_file_and_a_stray_one(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"\0" * 2048)
    (tmp_path / "sym_shape_infer_temp.onnx").write_bytes(b"")
    faults = tree_faults(tmp_path, ["big.bin", "README.md"], ["sym_shape_infer_temp.onnx"], limit=1024)
    assert faults[0].startswith("big.bin: 0.0 MB tracked"), faults
    assert [f.split(":")[0] for f in faults] == ["big.bin", "big.bin", "sym_shape_infer_temp.onnx",
                                                 "sym_shape_infer_temp.onnx", "sym_shape_infer_temp.onnx"]


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="a git checkout")
def test_the_tree_holds_only_source():
    tracked = _git("ls-files", "-z")
    untracked = _git("ls-files", "-z", "--others", "--exclude-standard")
    faults = tree_faults(ROOT, tracked, untracked)
    assert not faults, "\n".join(faults)
