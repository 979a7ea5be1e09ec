"""Timing and per-kernel profiles of a Relax VM function (what ``tvm-roialign run`` prints).

:func:`time_vm` is TVM's ``time_evaluator`` (one warm-up call, then ``repeat`` measurements of
``number`` calls each), summarized as tvmc did. :func:`profile_vm` times every call the VM makes
(TVM 0.27's Relax VM has no profiler of its own): an instrument (``VirtualMachine.set_instrument``)
takes the time before and after each kernel, synchronizing the device first, so each row is the
kernel's wall time plus a few microseconds of Python; the VM's own builtins (allocation, shape
checks) are summed in one row.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

BUILTINS = "vm.builtin.*"


@dataclass
class TimingSummary:
    """Seconds per call over ``repeat`` measurements (each the mean of ``number`` calls)."""

    mean_s: float
    median_s: float
    min_s: float
    max_s: float
    std_s: float
    repeat: int
    number: int
    results_s: tuple[float, ...] = ()


@dataclass
class KernelTime:
    """One kernel (PrimFunc, or all VM builtins) in a profile: calls and seconds per run."""

    name: str
    calls: int
    total_s: float

    @property
    def mean_s(self) -> float:
        return self.total_s / self.calls if self.calls else 0.0


def time_vm(vm, device, args, number: int = 1, repeat: int = 1, func: str = "main") -> TimingSummary:
    """Time ``vm[func](*args)`` with ``time_evaluator``: a warm-up call, then ``repeat`` x ``number``."""
    if number < 1 or repeat < 1:
        raise ValueError(f"number and repeat must be at least 1, got {number} and {repeat}")
    result = vm.time_evaluator(func, device, number=number, repeat=repeat)(*args)
    results = tuple(float(r) for r in result.results)
    return TimingSummary(
        mean_s=float(result.mean),
        median_s=float(result.median),
        min_s=min(results),
        max_s=max(results),
        std_s=float(result.std),
        repeat=repeat,
        number=number,
        results_s=results,
    )


def profile_vm(vm, device, args, runs: int = 1, func: str = "main") -> tuple[list[KernelTime], float]:
    """Per-kernel times of ``vm[func](*args)``, averaged over ``runs`` calls after one warm-up.

    Returns the kernels sorted by time (seconds per run) and the mean wall time of a run with the
    instrument in place. The instrument stays on ``vm``: use a VM of its own for profiling.
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    vm[func](*args)
    device.sync()
    totals: dict[str, list] = {}
    stack: list[tuple[str, float]] = []

    def instrument(_func, symbol, before_run, _ret, *_args):
        name = str(symbol)
        name = BUILTINS if name.startswith("vm.builtin.") else name
        if before_run:
            device.sync()
            stack.append((name, time.perf_counter()))
        else:
            device.sync()
            _, start = stack.pop()
            entry = totals.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - start
        return 0

    vm.set_instrument(instrument)
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        vm[func](*args)
        device.sync()
        walls.append(time.perf_counter() - t0)
    kernels = [KernelTime(name, calls // runs, seconds / runs) for name, (calls, seconds) in totals.items()]
    kernels.sort(key=lambda k: k.total_s, reverse=True)
    return kernels, statistics.fmean(walls)


__all__ = ["BUILTINS", "KernelTime", "TimingSummary", "profile_vm", "time_vm"]
