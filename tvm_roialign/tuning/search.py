"""Searching schedules with MetaSchedule into a database directory: :func:`tune`, :func:`rpc_runner`."""

from __future__ import annotations

import importlib
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import tvm
import tvm_ffi

from .baseline import check_records, measure_baselines, workload_key
from .records import RECORD_FILE, check_metadata, open_database, read_metadata, write_metadata
from .search_loop import COST_MODEL_FILE, SearchRun, SearchStatus, meta_schedule_console
from .tasks import DEFAULT_OPS, Task, as_target, extract_tasks, select

#: A batch's build workers each start a Python with TVM: seconds on a busy machine.
BUILD_TIMEOUT_S = 120
_EXTRA = "tune"
logger = logging.getLogger(__name__)


class MissingTuningDependency(ModuleNotFoundError):
    """A package of the ``tune`` extra is not installed."""


def require_dependencies(packages: Iterable[str] = ("xgboost", "psutil", "cloudpickle")) -> None:
    """Raise :class:`MissingTuningDependency` naming the first missing package and the extra."""
    for name in packages:
        try:
            importlib.import_module(name)
        except ImportError:
            raise MissingTuningDependency(
                f'tuning needs the Python package {name!r}: pip install "tvm-roialign[{_EXTRA}]"',
                name=name,
            ) from None


def rpc_runner(tracker: str, key: str, timeout_s: int = 30, number: int = 3, repeat: int = 1):
    """MetaSchedule's ``RPCRunner`` measuring on the devices registered at ``tracker``
    (``HOST:PORT``) under ``key``, one measurement worker per device.

    Raises
    ------
    ValueError
        A malformed address, or no tracker or no device of that key answering.
    """
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RPCConfig, RPCRunner

    host, sep, port = str(tracker).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"RPC tracker must be HOST:PORT, got {tracker!r}")
    if not key:
        raise ValueError("an RPC tracker needs the key its devices registered with")
    config = RPCConfig(
        tracker_host=host, tracker_port=int(port), tracker_key=key, session_timeout_sec=timeout_s
    )
    try:
        devices = config.count_num_servers(allow_missing=False)
    except (ValueError, OSError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0].rstrip(":")
        raise ValueError(f"RPC tracker {tracker}, key {key!r}: {first}") from None
    return RPCRunner(
        rpc_config=config,
        evaluator_config=EvaluatorConfig(number=number, repeat=repeat, min_repeat_ms=100),
        max_workers=devices,
    )


def build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params=None):
    """The build workers' build: MetaSchedule's default one without its import of
    ``tvm.s_tir.tensor_intrin`` (hundreds of TVMScript functions: 20-80 s in every worker of every
    batch on a busy 2-core machine). A candidate reaches the builder scheduled, tensorized blocks
    included, so its build looks no intrinsic up."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target)


def check_target(target) -> tvm.target.Target:
    """``target`` as a Target if it can be tuned for: llvm, with ``num-cores`` (else ValueError)."""
    from ..target import describe

    target = as_target(target)
    if target.kind.name != "llvm":
        raise ValueError(f"tuning is for llvm (CPU) targets, got {describe(target)}")
    if "num-cores" not in target.attrs:
        raise ValueError(
            f"target {describe(target)} has no num-cores, which tuning needs "
            f"(e.g. '{describe(target)} -num-cores=4')"
        )
    return target


@dataclass
class TuneResult:
    """What :func:`tune` did: per task, its ``name``, ``weight``, ``trials_before`` this run,
    ``trials`` after it, ``best_s`` (mean seconds of its best record, None without a valid one)
    and ``default_s`` (the default rules' schedule on the same runner: the bar ``best_s`` must
    beat for the record to be applied; None if it could not be measured)."""

    work_dir: Path
    tasks: list[dict]
    symbolic: list[str]
    trials_run: int
    search_s: float = 0.0  # seconds in MetaSchedule's task scheduler (setup, search, build, measure)

    def __str__(self) -> str:
        done = sum(t["trials"] for t in self.tasks)
        return f"{len(self.tasks)} tasks, {self.trials_run} trials run, {done} in {self.work_dir}"


def _trials_so_far(database, tasks: list[Task]) -> list[int]:
    per_workload: dict[int, int] = {}
    for record in database.get_all_tuning_records():
        key = tvm_ffi.structural_hash(record.workload.mod)
        per_workload[key] = per_workload.get(key, 0) + 1
    return [per_workload.get(tvm_ffi.structural_hash(t.mod), 0) for t in tasks]


def _best_seconds(database, task: Task) -> float | None:
    if not database.has_workload(task.mod):
        return None
    top = database.get_top_k(database.commit_workload(task.mod), 1)
    if not top:
        return None
    secs = [float(s) for s in top[0].run_secs]
    return sum(secs) / len(secs)


def tune(
    mods,
    target,
    work_dir,
    *,
    trials_per_task: int = 64,
    max_trials_global: int | None = None,
    ops=DEFAULT_OPS,
    tasks=None,
    runner="local",
    num_trials_per_iter: int = 16,
    seed: int | None = None,
    progress: Callable[[str], None] | None = None,
    verbose: bool = False,
    **pipeline_options,
) -> TuneResult:
    """Tune the tasks of ``mods`` (:func:`~.tasks.extract_tasks`) for the llvm ``target`` (with
    ``num-cores``) into the database directory ``work_dir``.

    ``trials_per_task`` counts the records already in ``work_dir``: a rerun resumes, a larger
    count goes on. ``max_trials_global`` caps this run (default: what the tasks still need; the
    gradient task scheduler spends it where it gains most). ``tasks``: the indices of the tasks to
    tune, in :func:`~.tasks.extract_tasks`' order (default: all of them). ``runner``: ``"local"`` or a
    MetaSchedule ``Runner`` (:func:`rpc_runner`; one passed in is the caller's to end with
    :func:`close_runner`, the local one ends here). ``progress(str)`` gets a line per measured batch
    (trials done of this run's, the task's best time, an ETA), or where it has a ``search_status``
    method the :class:`~.search_loop.SearchStatus` itself. MetaSchedule's own log goes to
    ``work_dir/logs`` (and with ``verbose`` to stdout).
    ``pipeline_options`` are those the model will be built with (``fold_batch_norm``,
    ``pad_channels``, ``winograd``): they shape the tasks.

    Raises
    ------
    MissingTuningDependency
        xgboost or psutil is not installed.
    TuningRecordsMismatch
        ``work_dir`` holds records of another TVM version or CPU.
    ValueError
        Not an llvm target, no ``num-cores``, fewer than one trial, nothing to tune, or a task index
        out of range.
    """
    require_dependencies()
    from tvm.s_tir import meta_schedule as ms

    target = check_target(target)
    if int(trials_per_task) < 1:
        raise ValueError(f"trials per task must be at least 1, got {trials_per_task}")
    ops = tuple(ops or ())
    work_dir = Path(work_dir)
    found = _prepare_work_dir(mods, target, work_dir, ops, pipeline_options, tasks)
    database = open_database(work_dir)
    before = _trials_so_far(database, found.tasks)
    todo = [(t, int(trials_per_task) - b) for t, b in zip(found.tasks, before) if b < trials_per_task]
    own_runner = runner == "local"
    runner = ms.runner.LocalRunner() if own_runner else runner
    try:
        trials_run, search_s, baselines = _search(
            ms, found.tasks, todo, target, work_dir, database, runner, progress,
            max_trials_global=max_trials_global, per_iter=num_trials_per_iter, seed=seed, verbose=verbose,
        )
    finally:
        if own_runner:
            close_runner(runner)
    tasks = _task_summaries(database, found.tasks, before, baselines)
    return TuneResult(work_dir, tasks, found.symbolic, trials_run, search_s)


def _search(ms, tasks, todo, target, work_dir, database, runner, progress, **how):
    """Baselines, search, check: (trials run, seconds searching, the checked baselines)."""
    trials_run, search_s = 0, 0.0
    builder = _builder(ms, target)
    # the bar each record must beat at build time, on the runner the candidates are measured on
    measure_baselines(tasks, target, builder, runner, work_dir, progress)
    if todo:
        budget = sum(n for _, n in todo)
        if how["max_trials_global"] is not None:
            budget = min(budget, int(how["max_trials_global"]))
        search = SearchRun(ms, todo, target, work_dir, progress)
        t0 = time.perf_counter()
        with meta_schedule_console(logging.INFO if how["verbose"] else logging.WARNING):
            trials_run = search.run(database, budget, builder, runner, how["per_iter"], how["seed"])
        search_s = time.perf_counter() - t0
    # the records that beat their baseline, measured again against it in interleaved pairs
    baselines = check_records(tasks, database, target, builder, runner, work_dir, progress)
    return trials_run, search_s, baselines


def close_runner(runner) -> None:
    """End the measurement workers of a MetaSchedule runner (``LocalRunner`` and ``RPCRunner``
    keep a process pool for their lifetime; the builder's pool ends with each batch)."""
    pool = getattr(runner, "pool", None)
    if pool is not None:
        pool.shutdown(wait=True)


def _prepare_work_dir(mods, target, work_dir: Path, ops: tuple, pipeline_options: dict, tasks=None):
    """The tasks to tune (:func:`~.tasks.extract_tasks`; ``tasks``: the indices chosen), after
    checking the records already in ``work_dir`` against ``target`` and writing its metadata
    (ValueError: no task, or an index out of range)."""
    previous = None
    if (work_dir / RECORD_FILE).is_file():
        previous = read_metadata(work_dir)
        for note in check_metadata(previous, target, f"tuning database {str(work_dir)!r}", adding=True):
            warnings.warn(note, UserWarning, stacklevel=3)
    found = extract_tasks(mods, target, ops, **pipeline_options)
    if not found.tasks:
        why = f" ({len(found.symbolic)} have symbolic shapes)" if found.symbolic else ""
        raise ValueError(f"no static-shape {'/'.join(ops) or 'any'} tasks to tune{why}")
    if tasks is not None:
        found.tasks = select(found.tasks, tasks)
    work_dir.mkdir(parents=True, exist_ok=True)
    write_metadata(work_dir, target, _all_ops(previous, ops), pipeline_options)
    return found


def _task_summaries(database, tasks, before, baselines) -> list[dict]:
    """Per task, what :class:`TuneResult` reports: trials before and after, best and default
    seconds, the interleaved check."""
    after = _trials_so_far(database, tasks)
    return [
        {
            "name": t.name,
            "weight": t.weight,
            "trials_before": b,
            "trials": a,
            "best_s": _best_seconds(database, t),
            "default_s": baselines.get(workload_key(t.mod), {}).get("default_s"),
            "check": baselines.get(workload_key(t.mod), {}).get("check"),
        }
        for t, b, a in zip(tasks, before, after)
    ]


def export_candidate(mod, linker: str) -> str:
    """The build workers' export for a cross target: a ``.so`` linked here with the target's
    cross ``linker``, which a board loads as it is (MetaSchedule's default ``.tar`` must be
    linked on the board, which then needs a compiler: a minimal board has none)."""
    import tempfile

    from tvm.support import cc

    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod.so")
    mod.export_library(path, fcompile=cc.cross_compiler(linker))
    return path


def _builder(ms, target):
    import functools

    from ..linking import cross_linker, cross_triple

    triple = cross_triple(target)
    linker = cross_linker(triple) if triple else None
    export = functools.partial(export_candidate, linker=linker) if linker else None
    cores = int(target.attrs["num-cores"])
    return ms.builder.LocalBuilder(
        max_workers=cores, timeout_sec=BUILD_TIMEOUT_S, f_build=build_candidate, f_export=export
    )


def _all_ops(previous: dict | None, ops: tuple) -> tuple:
    """The ops a database holds tasks of, over its runs (empty: all)."""
    if not ops or (previous is not None and not previous.get("ops", True)):
        return ()
    return tuple(dict.fromkeys([*(previous or {}).get("ops", []), *ops]))


__all__ = [
    "BUILD_TIMEOUT_S",
    "COST_MODEL_FILE",
    "MissingTuningDependency",
    "SearchStatus",
    "TuneResult",
    "build_candidate",
    "check_target",
    "close_runner",
    "export_candidate",
    "require_dependencies",
    "rpc_runner",
    "tune",
]
