"""The default rules' schedule of each tuning task, measured on the tuning's own runner: the bar a
record must beat to be applied (tuning never makes a kernel slower than the untuned build).

:func:`measure_baselines` builds each task with the pipeline's default rules (phase 5 of
:func:`tvm_roialign.pipeline.cpu_pipeline`) and measures it with MetaSchedule's builder and the
runner of the search (local, or a board through an RPC tracker), with the same evaluator settings
as the candidates. The results go to :data:`BASELINE_FILE` in the database directory, keyed by the
structural hash of the task (the key MetaSchedule's database matches workloads by).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import tvm
import tvm_ffi

logger = logging.getLogger(__name__)

#: Beside the database: per task, its name, weight and the default rules' mean seconds.
BASELINE_FILE = "tvm_roialign_baselines.json"

#: A record is applied when its time is below the default rules' by more than this fraction. On a
#: shared machine one kernel's time drifts by tens of percent from minute to minute, so the two
#: are compared in interleaved pairs (:func:`check_records`) and a tie keeps the default rules.
MARGIN = 0.10

#: Interleaved measurements of each (default, record) pair in :func:`check_records`.
PAIRS = 3


def workload_key(mod: tvm.IRModule) -> str:
    """The key of a task (a normalized one-function module) in :data:`BASELINE_FILE`."""
    return str(tvm_ffi.structural_hash(mod))


def read_baselines(work_dir) -> dict[str, dict]:
    """``{workload key: {"name", "weight", "default_s"}}`` of a database directory ({} if none)."""
    path = Path(work_dir) / BASELINE_FILE
    if not path.is_file():
        return {}
    try:
        return dict(json.loads(path.read_text()).get("tasks", {}))
    except (json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"tuning baselines {str(path)!r} are not valid JSON ({err})") from None


def _write(work_dir, baselines: dict) -> None:
    path = Path(work_dir) / BASELINE_FILE
    path.write_text(json.dumps({"margin": MARGIN, "tasks": baselines}, indent=2) + "\n")


def default_schedule(task_mod: tvm.IRModule, target) -> tvm.IRModule:
    """``task_mod`` scheduled by the pipeline's default rules, as the untuned build schedules it."""
    from ..pipeline_phases import cpu_schedule_pass

    # a module of its own: ApplyDefaultSchedule updates the module it is given in place
    copy = tvm.IRModule(dict(task_mod.functions_items()), attrs=task_mod.attrs)
    with target:
        return cpu_schedule_pass()(copy)


def _mean(run_secs) -> float | None:
    secs = [float(s) for s in run_secs or []]
    return sum(secs) / len(secs) if secs else None


def _measure(mods, target, builder, runner) -> list[float | None]:
    """Mean seconds of each scheduled module (None where it failed to build or run)."""
    from tvm.s_tir import meta_schedule as ms

    device_type = "cpu" if target.kind.name == "llvm" else target.kind.name
    built = builder.build([ms.builder.BuilderInput(m, target) for m in mods])
    inputs, where = [], []
    for i, (mod, result) in enumerate(zip(mods, built)):
        if result.error_msg is None:
            args = ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)
            inputs.append(ms.runner.RunnerInput(result.artifact_path, device_type, args))
            where.append(i)
        else:
            logger.warning("baseline: a build failed: %s", result.error_msg.strip()[-300:])
    means: list[float | None] = [None] * len(mods)
    try:
        for i, future in zip(where, runner.run(inputs) if inputs else []):
            result = future.result()
            if result.error_msg is None:
                means[i] = _mean(result.run_secs)
            else:
                logger.warning("baseline: a run failed: %s", str(result.error_msg).strip()[-300:])
    finally:
        for each in inputs:  # each build's own temporary directory
            shutil.rmtree(os.path.dirname(str(each.artifact_path)), ignore_errors=True)
    return means


def measure_baselines(tasks, target, builder, runner, work_dir, progress=None) -> dict[str, dict]:
    """Measure the default schedule of each of ``tasks`` that has no baseline in ``work_dir`` yet
    (with ``builder`` and ``runner``, MetaSchedule's), write them, and return all baselines."""
    baselines = read_baselines(work_dir)
    todo = [t for t in tasks if workload_key(t.mod) not in baselines]
    if not todo:
        return baselines
    if progress is not None:
        progress(f"measuring the default rules' schedule of {len(todo)} task(s) (the baseline)")
    means = _measure([default_schedule(t.mod, target) for t in todo], target, builder, runner)
    for task, mean in zip(todo, means):
        if mean is not None:
            entry = {"name": task.name, "weight": int(task.weight), "default_s": mean}
            baselines[workload_key(task.mod)] = entry
    _write(work_dir, baselines)
    return baselines


def _plain(value):
    """A trace's JSON form as plain Python values, numbers as text: a record fresh from the search
    holds ``IntImm`` (and an annotation's value as the string "32") where the same record read
    back from the database file holds ``int`` (32)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, int)):
        return str(int(value))
    if isinstance(value, float):
        return repr(value)
    if hasattr(value, "dtype") and hasattr(value, "value"):  # IntImm, FloatImm
        return _plain(value.value)
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "__iter__"):
        return [_plain(v) for v in value]
    return str(value)


def trace_key(record) -> str:
    """Which record a check was made for: its schedule's trace, the same whether the record comes
    from the search (in memory) or from the database file (``compile``). The structural hash of
    ``trace.as_json()`` is not: it tells ``IntImm`` from ``int``, so no check ever matched at
    ``compile`` time."""
    text = json.dumps(_plain(record.trace.as_json()), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def check_records(tasks, database, target, builder, runner, work_dir, progress=None) -> dict:
    """After a search: each task's best record that beat its baseline is measured again against
    the default rules' schedule in :data:`PAIRS` interleaved pairs (drift hits both); the medians
    are kept as the task's ``check`` (``record_s``, ``default_s``, ``trace``), which decides."""
    import statistics

    baselines = read_baselines(work_dir)
    todo = []
    for task in tasks:
        entry = baselines.get(workload_key(task.mod))
        if entry is None or not database.has_workload(task.mod):
            continue
        top = database.get_top_k(database.commit_workload(task.mod), 1)
        if not top or not beats(_mean(top[0].run_secs), entry, checked=False):
            continue
        if entry.get("check", {}).get("trace") == trace_key(top[0]):
            continue
        schedule = database.query_schedule(task.mod, target, task.name)
        if schedule is not None:
            todo.append((task, entry, top[0], schedule.mod))
    if not todo:
        return baselines
    if progress is not None:
        progress(f"checking {len(todo)} record(s) against the default rules in interleaved pairs")
    mods = []
    for task, _entry, _record, tuned in todo:
        for _ in range(PAIRS):
            mods += [default_schedule(task.mod, target), tuned]
    means = _measure(mods, target, builder, runner)
    for i, (_task, entry, record, _tuned) in enumerate(todo):
        pairs = means[2 * PAIRS * i : 2 * PAIRS * (i + 1)]
        defaults, records = [m for m in pairs[0::2] if m], [m for m in pairs[1::2] if m]
        if defaults and records:
            entry["check"] = {
                "default_s": statistics.median(defaults),
                "record_s": statistics.median(records),
                "trace": trace_key(record),
            }
    _write(work_dir, baselines)
    return baselines


def evidence(record_s: float | None, baseline: dict | None, record=None, checked: bool = True):
    """``(default_s, record_s)``: the two times a record is judged by, or None when there is no
    baseline (databases tuned before baselines were measured) or no time of the record. The
    interleaved ``check`` when it was made for this ``record`` (any record when ``record`` is None)
    and ``checked``, else the search's time against the default rules' measured when tuning."""
    if record_s is None or baseline is None:
        return None
    check = baseline.get("check")
    if checked and check and (record is None or check.get("trace") == trace_key(record)):
        return float(check["default_s"]), float(check["record_s"])
    return float(baseline["default_s"]), float(record_s)


def beats(record_s: float | None, baseline: dict | None, record=None, checked: bool = True) -> bool:
    """Whether a record of mean ``record_s`` seconds beats ``baseline`` by :data:`MARGIN`, judged
    on :func:`evidence` (True without a baseline: databases tuned before baselines were
    measured)."""
    if record_s is None:
        return False
    times = evidence(record_s, baseline, record, checked)
    if times is None:
        return True
    default_s, measured_s = times
    return measured_s < default_s * (1.0 - MARGIN)


__all__ = [
    "BASELINE_FILE",
    "MARGIN",
    "PAIRS",
    "beats",
    "check_records",
    "default_schedule",
    "evidence",
    "measure_baselines",
    "read_baselines",
    "trace_key",
    "workload_key",
]
