"""This machine as the package sees it: its CPU architecture, whether a target triple is for it, the
cores this process may use, and sizing TVM's CPU thread pool to them.

Standard library only (no TVM import), so the PyTorch-free runtime, the CLI, the schedule rules and the
benchmarks all ask one place, on Linux, macOS and Windows alike.

TVM sizes its CPU thread pool once, when the first parallel kernel runs, from ``TVM_NUM_THREADS``
(else, on x86, half of the logical cores: it assumes SMT siblings). ``runtime.config_threadpool``
cannot grow a pool past that first size, so the count has to be in the environment before the pool
starts. Importing :mod:`tvm_roialign` does not touch the environment; the places that create a
runtime for the user call :func:`use_usable_cores` (the CLI, :class:`tvm_roialign.runtime.Detector`,
:class:`tvm_roialign.models.maskrcnn.TVMMaskRCNN`, the benchmarks). A ``TVM_NUM_THREADS`` the user set
is always kept.
"""

from __future__ import annotations

import os
import platform

ENV_VAR = "TVM_NUM_THREADS"

_MACHINE_ALIASES = {"arm64": "aarch64", "amd64": "x86_64", "x64": "x86_64"}


def host_machine() -> str:
    """This machine's CPU architecture as the first word of an LLVM triple (``x86_64``,
    ``aarch64``), from ``platform.machine()`` (macOS says ``arm64``, Windows ``AMD64``)."""
    machine = platform.machine().lower()
    return _MACHINE_ALIASES.get(machine, machine)


def is_host_triple(triple: str | None) -> bool:
    """Whether code for LLVM ``triple`` runs on this machine (an empty triple means the host)."""
    triple = str(triple or "")
    return not triple or triple.startswith(host_machine())


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity where the OS reports one (Linux), else
    ``os.process_cpu_count()`` (Python 3.13+, which honours affinity on every OS), else
    ``os.cpu_count()``; at least 1."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        try:
            return max(len(affinity(0)), 1)
        except OSError:
            pass
    counter = getattr(os, "process_cpu_count", None) or os.cpu_count
    return max(counter() or 1, 1)


def use_usable_cores(threads: int | None = None) -> int:
    """Size TVM's thread pool: ``threads`` when given (a caller's explicit choice, e.g. a
    ``--threads`` flag), else a ``TVM_NUM_THREADS`` the user set, else :func:`usable_cores`.
    Returns the size in force.

    Call it before the first TVM kernel of the process runs (later calls change nothing for the
    pool that is already running).

    Raises
    ------
    ValueError
        ``threads`` below 1, or a ``TVM_NUM_THREADS`` that is not a positive integer.
    """
    if threads is not None:
        if int(threads) < 1:
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        os.environ[ENV_VAR] = str(int(threads))
    chosen = os.environ.setdefault(ENV_VAR, str(usable_cores()))
    if not chosen.strip().isdigit() or int(chosen) < 1:
        raise ValueError(f"{ENV_VAR} must be a positive integer, got {chosen!r}")
    return int(chosen)


__all__ = ["ENV_VAR", "host_machine", "is_host_triple", "usable_cores", "use_usable_cores"]
