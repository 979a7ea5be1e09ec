"""This machine as the package sees it: its CPU architecture, whether a target triple is for it, the
cores this process may use, and sizing TVM's CPU thread pool to them.

Standard library only (no TVM import), so the PyTorch-free runtime, the CLI, the schedule rules and the
benchmarks all ask one place, on Linux, macOS and Windows alike.

TVM sizes its CPU thread pool once, when the first parallel kernel runs, from ``TVM_NUM_THREADS``
(else, on x86, half of the logical cores: it assumes SMT siblings). ``runtime.config_threadpool``
cannot grow a pool past that first size, so the count has to be in the environment before the pool
starts. Importing :mod:`tvm_roialign` does not touch the environment; the places that create a
runtime for the user call :func:`use_usable_cores` (the CLI, :func:`tvm_roialign.pipeline.build` for
a target of this machine's architecture, :class:`tvm_roialign.runtime.Detector`,
:class:`tvm_roialign.models.maskrcnn.TVMMaskRCNN`, the benchmarks). A ``TVM_NUM_THREADS`` the user set
is always kept.

They also leave TVM's workers free to move between cores (``TVM_BIND_THREADS=0``, unless the user set
it): by default TVM pins worker ``i`` to core ``i``, and on a machine where another process holds one
of those cores, every parallel kernel then waits for the pinned worker's next time slice (the
measurement: docs/benchmarks.md, "Schedules and host settings"). TVM's own CI unpins its workers
for the same reason.
"""

from __future__ import annotations

import os
import platform

ENV_VAR = "TVM_NUM_THREADS"
#: TVM's switch for pinning its workers to cores (1, its default: pinned)
BIND_VAR = "TVM_BIND_THREADS"

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
    ``--threads`` flag), else a ``TVM_NUM_THREADS`` the user set, else :func:`usable_cores`; its
    workers unpinned unless the user set ``TVM_BIND_THREADS`` (module docstring). Returns the size
    in force.

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
    os.environ.setdefault(BIND_VAR, "0")
    chosen = os.environ.setdefault(ENV_VAR, str(usable_cores()))
    if not chosen.strip().isdigit() or int(chosen) < 1:
        raise ValueError(f"{ENV_VAR} must be a positive integer, got {chosen!r}")
    return int(chosen)


#: ``arch_prctl`` request for an extended CPU state, and the AMX tile data state's number (Linux)
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158  # x86-64

_amx_state: dict[str, object] = {}


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU flags of the first processor in ``path`` (x86 ``flags``, AArch64 ``Features``; empty
    where there is no such file)."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def request_amx(required: bool = False) -> bool:
    """Ask Linux for this process's use of the AMX tile state, which it must grant before the first
    AMX instruction runs (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``; without it the
    instruction kills the process). Done where a library built with AMX kernels is loaded or run
    (the CLI, :class:`tvm_roialign.runtime.Detector`, :func:`tvm_roialign.pipeline.build` for this
    machine), never on import; asked once per process.

    Returns whether the process may run AMX instructions: False on a machine without AMX or another
    OS. With ``required``, a ``RuntimeError`` in one line instead of False.
    """
    if "granted" not in _amx_state:
        granted, reason = False, "this CPU has no AMX (amx_tile)"
        if platform.system() == "Linux" and host_machine() == "x86_64" and "amx_tile" in cpu_flags():
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            result = libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
            granted = result == 0
            reason = "" if granted else f"Linux refused the AMX tile state: {os.strerror(ctypes.get_errno())}"
        elif platform.system() != "Linux":
            reason = f"AMX kernels are run on Linux only, not {platform.system()}"
        _amx_state.update(granted=granted, reason=reason)
    if required and not _amx_state["granted"]:
        raise RuntimeError(f"this library runs AMX bf16 kernels, but {_amx_state['reason']}")
    return bool(_amx_state["granted"])


__all__ = [
    "ENV_VAR",
    "host_machine",
    "is_host_triple",
    "request_amx",
    "usable_cores",
    "use_usable_cores",
]
