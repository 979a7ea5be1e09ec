"""Tuning tasks: the distinct fused PrimFuncs of a module as the pipeline's tuned-schedule phase
sees it, keyed (and merged across modules) the way MetaSchedule keys its records."""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import tirx

#: Substrings of fused task names tuned by default (Winograd's products are matmuls).
DEFAULT_OPS = ("conv2d", "matmul")


@dataclass
class Task:
    """A tuning task: one distinct fused PrimFunc (``mod``, normalized as MetaSchedule keys it),
    ``weight`` calls of it in the modules."""

    name: str
    mod: tvm.IRModule
    weight: int = 1


@dataclass
class TaskSet:
    """The tasks :func:`extract_tasks` selected (iterable), and the names of the matching
    functions it could not tune because their shapes are symbolic."""

    tasks: list[Task] = field(default_factory=list)
    symbolic: list[str] = field(default_factory=list)

    def __iter__(self):
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)


def as_target(target) -> tvm.target.Target:
    from ..target import parse_target

    return parse_target(target)


def normalize(func: tirx.PrimFunc) -> tvm.IRModule:
    """``func`` as the one-function module MetaSchedule hashes (task extraction, database query)."""
    from tvm.s_tir import meta_schedule  # noqa: F401 - registers normalize_mod

    return tvm.get_global_func("tvm.s_tir.meta_schedule.normalize_mod")(func)


def is_static(func: tirx.PrimFunc) -> bool:
    """Whether every buffer of ``func`` has a static shape (MetaSchedule tunes no other)."""
    return all(
        isinstance(dim, tirx.IntImm)
        for param in func.params
        if isinstance(param.ty, tirx.BufferType)
        for dim in param.ty.shape
    )


def matches(name: str, ops) -> bool:
    """Whether a fused function's name contains one of ``ops`` (empty: any)."""
    return not ops or any(op in name for op in ops)


def is_scheduled(func) -> bool:
    return isinstance(func, tirx.PrimFunc) and bool(func.attrs.get("tirx.is_scheduled", False))


def slot_module(mod: tvm.IRModule, target, **pipeline_options) -> tvm.IRModule:
    """``mod`` as the tuned-schedule phase of the build pipeline sees it (``pipeline_options``:
    ``layout``, ``fold_batch_norm``, ``pad_channels``, ``winograd``, as given to
    ``pipeline.build``)."""
    from ..pipeline_phases import prepare_pipeline

    target = as_target(target)
    with target:
        return prepare_pipeline(target, **pipeline_options)(mod)


def extract_tasks(mods, target, ops=DEFAULT_OPS, **pipeline_options) -> TaskSet:
    """The tuning tasks of ``mods`` (a Relax module, or several: a detector's pieces) whose fused
    name contains one of ``ops`` (empty: all), merged across modules (weights add up).

    Functions already scheduled (RoIAlign's strategies) are never tasks; matching functions with
    symbolic shapes are listed in ``TaskSet.symbolic``.
    """
    from tvm.s_tir import meta_schedule as ms

    target = as_target(target)
    ops = tuple(ops or ())
    merged: dict[int, Task] = {}
    result = TaskSet()
    for mod in [mods] if isinstance(mods, tvm.IRModule) else list(mods):
        fused = slot_module(mod, target, **pipeline_options)
        scheduled = {gv.name_hint for gv, f in fused.functions_items() if is_scheduled(f)}
        for found in ms.relax_integration.extract_tasks(fused, target):
            name = str(found.task_name)
            if name in scheduled or not matches(name, ops):
                continue
            task_mod = found.dispatched[0]
            if not is_static(task_mod["main"]):
                result.symbolic.append(name)
                continue
            key = tvm_ffi.structural_hash(task_mod)
            if key in merged:
                merged[key].weight += int(found.weight)
            else:
                merged[key] = Task(name, task_mod, int(found.weight))
    result.tasks = list(merged.values())
    return result


def select(tasks: list[Task], indices) -> list[Task]:
    """The tasks at ``indices`` (in :func:`extract_tasks`' order, as ``tune --tasks list`` shows
    them), each once, in that order; an index out of range is a ValueError naming the range."""
    chosen = []
    for i in dict.fromkeys(int(i) for i in indices):
        if not 0 <= i < len(tasks):
            raise ValueError(
                f"task index {i} is out of range: the model has tasks 0-{len(tasks) - 1} "
                "(tune --tasks list shows them)"
            )
        chosen.append(tasks[i])
    if not chosen:
        raise ValueError("no task selected")
    return chosen


def flops(task: Task) -> float | None:
    """Floating-point operations of one call of ``task`` (TVM's estimate; None if it has none)."""
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(task.mod))
    except Exception:  # noqa: BLE001 - loops the estimator cannot bound
        return None


__all__ = [
    "DEFAULT_OPS",
    "Task",
    "TaskSet",
    "as_target",
    "extract_tasks",
    "flops",
    "is_scheduled",
    "is_static",
    "matches",
    "normalize",
    "select",
    "slot_module",
]
