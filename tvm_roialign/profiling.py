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

import tvm

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


def time_vm(
    vm, device, args, number: int = 1, repeat: int = 1, func: str = "main", stateful: bool = False
) -> TimingSummary:
    """Time ``vm[func](*args)`` with ``time_evaluator``: a warm-up call, then ``repeat`` x ``number``.
    ``stateful``: through ``set_input`` / ``invoke_stateful`` (what works over RPC)."""
    if number < 1 or repeat < 1:
        raise ValueError(f"number and repeat must be at least 1, got {number} and {repeat}")
    if stateful:
        vm.set_input(func, *args)
        timer = vm.time_evaluator("invoke_stateful", device, number=number, repeat=repeat)
        result = timer(func)
    else:
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


def kernel_signatures(mod) -> list[dict]:
    """The kernels a built module calls, for :func:`profile_kernels`: ``[{"name", "calls",
    "args": [{"shape", "dtype"}]}]`` from ``mod`` as the build pipeline left it (Relax functions
    calling scheduled PrimFuncs; ``compile`` records it in ``LIB.json``). Kernels with a
    non-tensor or symbolic-shape parameter are left out (they cannot be called on their own)."""
    import collections

    from tvm import relax, tirx

    calls: collections.Counter = collections.Counter()

    def visit(expr):
        if isinstance(expr, relax.Call):
            op = expr.op
            if isinstance(op, tvm.ir.Op) and op.name == "relax.call_tir":
                op = expr.args[0]
            if isinstance(op, tvm.ir.GlobalVar):
                calls[op.name_hint] += 1

    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    kernels = []
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or not calls.get(gv.name_hint):
            continue
        args = []
        for param in func.params:
            ty = getattr(param, "ty", None)
            if not isinstance(ty, tirx.BufferType) or not all(isinstance(d, tirx.IntImm) for d in ty.shape):
                args = None
                break
            args.append({"shape": [int(d) for d in ty.shape], "dtype": str(ty.dtype)})
        if args is not None:
            kernels.append({"name": gv.name_hint, "calls": calls[gv.name_hint], "args": args})
    return kernels


def profile_kernels(module, device, kernels: list[dict], runs: int = 1) -> tuple[list[KernelTime], float]:
    """Per-kernel times on a remote ``device``: each kernel of ``kernels``
    (:func:`kernel_signatures`) called on its own on inputs of its shapes (uniform [0, 1) floats,
    integers 0), a warm-up then ``runs`` calls, each timed here from the call to the device's
    synchronization; the fastest, less two RPC round trips (measured: the second value returned). This is
    what ``run --rpc --profile`` prints: a remote VM cannot call back into this process (so
    :func:`profile_vm`'s instrument does not work over RPC), and TVM's remote ``time_evaluator``
    only finds functions at a module's root, where a Relax library keeps its VM."""
    import numpy as np

    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    round_trip = _round_trip_s(device, runs)
    rng = np.random.default_rng(0)
    times = []
    for kernel in kernels:
        args = []
        for arg in kernel["args"]:
            dtype = np.dtype(arg["dtype"])
            shape = arg["shape"]
            host = rng.random(shape).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype)
            args.append(tvm.runtime.tensor(host, device))
        func = module.get_function(kernel["name"], query_imports=True)
        func(*args)
        device.sync()
        best = float("inf")
        for _ in range(runs):
            t0 = time.perf_counter()
            func(*args)
            device.sync()
            best = min(best, time.perf_counter() - t0)
        seconds = max(best - 2 * round_trip, 0.0)
        times.append(KernelTime(kernel["name"], int(kernel["calls"]), seconds * int(kernel["calls"])))
    times.sort(key=lambda k: k.total_s, reverse=True)
    return times, round_trip


def _round_trip_s(device, runs: int) -> float:
    """Seconds of one RPC round trip to ``device`` (a synchronization: the least of a few)."""
    best = float("inf")
    for _ in range(max(5, runs)):
        t0 = time.perf_counter()
        device.sync()
        best = min(best, time.perf_counter() - t0)
    return best


__all__ = [
    "BUILTINS",
    "KernelTime",
    "TimingSummary",
    "kernel_signatures",
    "profile_kernels",
    "profile_vm",
    "time_vm",
]
