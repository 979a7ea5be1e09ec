"""MetaSchedule tuning of the kernels a model compiles to, and the records' use at build time.

:func:`tune` tunes the conv2d / matmul functions of a Relax module exactly as
:func:`tvm_roialign.pipeline.cpu_pipeline` produces them before scheduling (phases 1-3: graph
rewrites, legalization and fusion, layout-free weights), so that the records match the functions
phase 4 looks up; the JSON database (``database_workload.json``, ``database_tuning_record.json``)
goes to ``work_dir`` and grows across runs (tuning again resumes from it). Measurement runs here,
or through TVM's RPC tracker on the boards of another target (``rpc=("host:port", key)``).

:func:`apply_database_pass` is phase 4: ``MetaScheduleApplyDatabase`` over the records, which marks
what it schedules ``tirx.is_scheduled`` so that the default rules leave it; functions without a
record fall back to the default rules. It reports how many functions the records covered.

A record is keyed by the structural hash of the fused PrimFunc (shapes, dtypes, layouts, fusion),
not by the target: records tuned on one CPU are correct on any, fast on the same ISA class. They
are tied to the TVM version and to the graph (image size, padding, static roi counts).
MetaSchedule needs ``xgboost`` and ``psutil`` (the ``tune`` extra).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

import tvm
from tvm import relax

#: Task-name substrings tuned by default: the convolutions and matrix products (what the time goes
#: to); elementwise, pooling and RoIAlign functions keep the default rules.
DEFAULT_OPS = ("conv2d", "matmul", "dense")

_LOG = logging.getLogger(__name__)


def tuning_module(
    mod: tvm.IRModule, target: tvm.target.Target, **options
) -> tvm.IRModule:
    """``mod`` after phases 1-3 of the CPU pipeline (what tuning records are matched against).

    ``options`` are :func:`~tvm_roialign.pipeline.cpu_pipeline`'s graph options (``layout``,
    ``fold_batch_norm``, ``pad_channels``, ``winograd``); they must be those of the build.
    """
    from .pipeline import prepare_pipeline

    with target:
        return prepare_pipeline(target, **options)(mod)


def extract_tasks(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    op_names: Sequence[str] = DEFAULT_OPS,
    **options,
) -> list:
    """The MetaSchedule tasks (one per distinct fused function) of ``mod`` whose name contains one
    of ``op_names``."""
    from tvm.s_tir import meta_schedule as ms

    tasks = ms.relax_integration.extract_tasks(
        tuning_module(mod, target, **options), target
    )
    return [t for t in tasks if any(op in t.task_name for op in op_names)]


def rpc_runner(tracker: str, key: str, timeout_s: int = 60):
    """A MetaSchedule runner measuring on devices registered as ``key`` with the RPC tracker at
    ``tracker`` (``"host:port"``, from ``python -m tvm.exec.rpc_tracker``)."""
    from tvm.s_tir import meta_schedule as ms

    host, sep, port = tracker.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"rpc tracker must be HOST:PORT, got {tracker!r}")
    config = ms.runner.RPCConfig(
        tracker_host=host,
        tracker_port=int(port),
        tracker_key=key,
        session_timeout_sec=timeout_s,
    )
    return ms.runner.RPCRunner(rpc_config=config)


def tune(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    work_dir: str | os.PathLike,
    trials_per_task: int = 64,
    op_names: Sequence[str] = DEFAULT_OPS,
    *,
    trials_per_round: int = 16,
    runner=None,
    build_timeout_s: int = 300,
    population: int = 512,
    seed: int | None = None,
    **options,
):
    """Tune the ``op_names`` functions of ``mod`` for ``target``; records go to ``work_dir``.

    Returns the MetaSchedule database. ``runner`` is ``"local"`` (default) or
    :func:`rpc_runner`'s. The target should carry ``num-cores``. ``build_timeout_s`` bounds the
    build of one candidate (a builder worker starts by importing TVM, which alone can take half a
    minute on a busy 2-core machine; MetaSchedule's default of 30 s then fails every build).
    ``population`` is the evolutionary search's population (MetaSchedule's default: 512).

    Raises
    ------
    ValueError
        ``trials_per_task`` below 1, or no function of ``mod`` matches ``op_names``.
    """
    from tvm.s_tir import meta_schedule as ms

    if trials_per_task < 1:
        raise ValueError(f"trials_per_task must be at least 1, got {trials_per_task}")
    prepared = tuning_module(mod, target, **options)
    tasks = [
        t
        for t in ms.relax_integration.extract_tasks(prepared, target)
        if any(op in t.task_name for op in op_names)
    ]
    if not tasks:
        raise ValueError(
            f"no function of the model matches {list(op_names)}: nothing to tune"
        )
    os.makedirs(work_dir, exist_ok=True)
    return ms.relax_integration.tune_relax(
        prepared,
        {},
        target,
        str(work_dir),
        max_trials_global=trials_per_task * len(tasks),
        max_trials_per_task=trials_per_task,
        op_names=list(op_names),
        num_trials_per_iter=min(trials_per_round, trials_per_task),
        builder=ms.builder.LocalBuilder(
            timeout_sec=build_timeout_s, max_workers=_num_cores(target)
        ),
        runner=runner or "local",
        strategy=ms.search_strategy.EvolutionarySearch(
            population_size=population, init_min_unmeasured=min(50, population)
        ),
        seed=seed,
    )


def _num_cores(target: tvm.target.Target) -> int:
    from .schedules import cpu_info

    return cpu_info(target).num_cores


def has_records(work_dir: str | os.PathLike) -> bool:
    """Whether ``work_dir`` holds a MetaSchedule JSON database."""
    return os.path.isfile(os.path.join(work_dir, "database_tuning_record.json"))


def apply_database_pass(
    work_dir: str | os.PathLike, report: Callable[[int, int], None] | None = None
) -> tvm.transform.Pass:
    """Phase 4: schedule the functions the records in ``work_dir`` cover.

    ``report(found, candidates)`` is called with the number of functions the records scheduled
    and the number of unscheduled functions there were.

    Raises
    ------
    FileNotFoundError
        ``work_dir`` holds no database.
    """
    if not has_records(work_dir):
        raise FileNotFoundError(
            f"no tuning records (database_tuning_record.json) in {str(work_dir)!r}"
        )
    inner = relax.transform.MetaScheduleApplyDatabase(
        str(work_dir), enable_warning=False
    )

    @tvm.transform.module_pass(opt_level=0, name="ApplyTuningRecords")
    def apply(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        before = _scheduled(mod)
        out = inner(mod)
        found = len(_scheduled(out) - before)
        candidates = sum(
            1 for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
        ) - len(before)
        _LOG.info(
            "tuning records: %d of %d functions scheduled from %s",
            found,
            candidates,
            work_dir,
        )
        if report is not None:
            report(found, candidates)
        return out

    return apply


def _scheduled(mod: tvm.IRModule) -> set[str]:
    return {
        gv.name_hint
        for gv, f in mod.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
        and f.attrs is not None
        and f.attrs.get("tirx.is_scheduled")
    }


__all__ = [
    "DEFAULT_OPS",
    "apply_database_pass",
    "extract_tasks",
    "has_records",
    "rpc_runner",
    "tune",
    "tuning_module",
]
