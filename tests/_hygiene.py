"""A pytest plugin that fails the run when processes started by the tests outlive them.

At the end of a session (after the session fixtures are torn down) each test process, the only one
without pytest-xdist or each xdist worker, lists the processes descended from it that are still
alive (``/proc``: Linux only; elsewhere nothing is checked). Any still alive after
:data:`GRACE_S` seconds are reported by pid and command line, killed, and the session fails: a
MetaSchedule process pool or an RPC server that a test (or the package) forgot to end. xdist
workers hand their lists to the controller, which reports them.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

#: How long a leftover process may take to end by itself after the session.
GRACE_S = float(os.environ.get("TVM_ROIALIGN_HYGIENE_GRACE_S", "10"))
_KEY = "hygiene_leftovers"
_PROC = Path("/proc")


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process."""
    parents = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid``."""
    parents = _parents()
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found


def command_line(pid: int) -> str:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"


def leftovers(grace_s: float = GRACE_S) -> list[str]:
    """``"PID CMDLINE"`` of the descendants of this process still alive after ``grace_s``; they
    are killed once listed."""
    if not _PROC.is_dir():
        return []
    deadline = time.monotonic() + grace_s
    alive = descendants(os.getpid())
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = descendants(os.getpid())
    listed = [f"{pid} {command_line(pid)}" for pid in alive]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return listed


def _is_xdist_controller(config) -> bool:
    return getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if _is_xdist_controller(config):
        found = config.stash.get(_LEFTOVERS, [])
    else:
        found = leftovers()
        if hasattr(config, "workeroutput"):  # an xdist worker: the controller reports
            config.workeroutput[_KEY] = found
            return
    if found:
        config.stash[_LEFTOVERS] = found
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: collect what a worker found."""
    found = getattr(node, "workeroutput", {}).get(_KEY, [])
    if found:
        stash = node.config.stash
        stash[_LEFTOVERS] = [*stash.get(_LEFTOVERS, []), *found]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    found = config.stash.get(_LEFTOVERS, [])
    if found:
        terminalreporter.section("processes that outlived the tests", sep="=", red=True)
        for line in found:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            f"{len(found)} process(es) started during the session were still alive {GRACE_S:g} s "
            "after it (listed, then killed): end pools, servers and subprocesses where they start"
        )


_LEFTOVERS = pytest.StashKey[list]()

__all__ = ["GRACE_S", "command_line", "descendants", "leftovers"]
