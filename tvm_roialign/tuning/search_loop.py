"""One run of MetaSchedule's task scheduler (:class:`SearchRun`) and what it reports after each
measured batch (:class:`SearchStatus`: trials done of the budget, best time per task, an ETA)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

COST_MODEL_FILE = "cost_model.tar"
logger = logging.getLogger(__name__)


@dataclass
class SearchStatus:
    """Where a search stands after a measured batch: ``task`` (the full name of the task just
    measured), ``measured`` (its candidates in the batch), ``done`` of ``total`` trials of this run,
    ``best_s`` (per task name, the mean seconds of its best valid candidate so far) and
    ``elapsed_s`` since the search began."""

    task: str
    measured: int
    done: int
    total: int
    best_s: dict[str, float] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the pace so far (None before the first trial)."""
        if self.done <= 0:
            return None
        return self.elapsed_s / self.done * max(self.total - self.done, 0)

    def line(self) -> str:
        """One plain line: ``TASK: best 0.123 ms; 12/64 trials of the run, ETA 1m05s``."""
        best = self.best_s.get(self.task)
        shown = f"best {best * 1e3:.3f} ms" if best is not None else "no valid candidate yet"
        progress = f"{self.done}/{self.total} trials of the run, ETA {format_eta(self.eta_s)}"
        return f"{self.task}: {shown}; {progress}"


def format_eta(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``42s``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    whole = round(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole}s"


_MS_LOGGER = "tvm.s_tir.meta_schedule"


@contextlib.contextmanager
def meta_schedule_console(level: int):
    """MetaSchedule's console level (its files in ``work_dir/logs`` get everything) for one search;
    the caller's level is restored afterwards."""
    root = logging.getLogger(_MS_LOGGER)
    before = root.level
    root.setLevel(level)
    try:
        yield
    finally:
        root.setLevel(before)


def _task_loggers(ms, work_dir, names):
    """MetaSchedule's per-task loggers under ``work_dir/logs``.

    MetaSchedule's ``dictConfig`` re-lists the handlers already on its logger by name, and a handler
    without a name (pytest's log capture since 9.2, or a user's own) makes it fail
    (``'NoneType' object has no attribute 'format'``) on the second search of a process. Those
    handlers are set aside while it configures, then put back.
    """
    root = logging.getLogger(_MS_LOGGER)
    unnamed = [h for h in root.handlers if h.get_name() is None]
    for handler in unnamed:
        root.removeHandler(handler)
    try:
        return ms.logging.get_loggers_from_work_dir(str(work_dir), names)
    finally:
        for handler in unnamed:
            root.addHandler(handler)


def _import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (``TuneContext`` does, once per process) fast.

    Each of its ~500 ``@T.prim_func`` calls ``inspect.stack()``, which looks up the module of every
    frame; the frames of importlib's frozen modules are not in ``inspect``'s file-to-module cache,
    so each of their lookups walks all of ``sys.modules`` (thousands of modules with torch
    loaded): 52 s instead of 9 s on a busy 2-core machine. Their entries (the values the walk
    would find) go into the cache first."""
    import inspect
    import sys

    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    for name in ("importlib._bootstrap", "importlib._bootstrap_external"):
        inspect.modulesbyfile.setdefault(os.path.normcase(os.path.abspath(f"<frozen {name}>")), name)
    importlib.import_module("tvm.s_tir.tensor_intrin")


class SearchRun:
    """One run of MetaSchedule's task scheduler over ``todo`` ([(task, trials still to do)]).

    ``progress`` gets a :class:`SearchStatus` after each measured batch through its
    ``search_status`` method where it has one, else the status's plain line."""

    def __init__(self, ms, todo, target, work_dir: Path, progress):
        self.ms, self.todo, self.target, self.work_dir = ms, todo, target, work_dir
        self.progress = progress
        self.names = [t.name for t, _ in todo]
        self.best: dict[int, float] = {}
        self.trials = 0
        self.budget = 0
        self.t0 = time.perf_counter()

    def run(self, database, budget: int, builder, runner, per_iter: int, seed) -> int:
        ms = self.ms
        most = max(n for _, n in self.todo)
        self.budget, self.t0 = budget, time.perf_counter()
        cost_model = self._cost_model(int(self.target.attrs["num-cores"]))
        try:
            ms.tune_tasks(
                tasks=self._contexts(most, seed),
                task_weights=[float(t.weight) for t, _ in self.todo],
                work_dir=str(self.work_dir),
                max_trials_global=budget,
                max_trials_per_task=most,
                num_trials_per_iter=min(per_iter, most),
                builder=builder,
                runner=runner,
                database=database,
                cost_model=cost_model,
                measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), self._callback()],
            )
        finally:
            if cost_model.data:
                with warnings.catch_warnings():  # xgboost: "Saving model in the UBJSON format..."
                    warnings.simplefilter("ignore", UserWarning)
                    cost_model.save(str(self.work_dir / COST_MODEL_FILE))
        return self.trials

    def _contexts(self, most: int, seed) -> list:
        ms = self.ms
        _import_tensor_intrinsics()
        # MetaSchedule's population of 512 for a handful of trials is search time wasted
        population = min(512, max(32, 8 * most))
        loggers = _task_loggers(ms, self.work_dir, self.names)
        contexts = []
        for (task, _), task_logger, rand in zip(
            self.todo, loggers, ms.utils.fork_seed(seed, n=len(self.todo))
        ):
            strategy = ms.search_strategy.EvolutionarySearch(
                population_size=population, init_min_unmeasured=min(50, population // 2)
            )
            contexts.append(
                ms.TuneContext(
                    mod=task.mod,
                    target=self.target,
                    space_generator="post-order-apply",
                    search_strategy=strategy,
                    task_name=task.name,
                    logger=task_logger,
                    rand_state=rand,
                    num_threads="physical",
                ).clone()
            )
        return contexts

    def _cost_model(self, cores: int):
        model = self.ms.cost_model.XGBModel(num_tuning_cores=cores, tree_method="auto")
        path = self.work_dir / COST_MODEL_FILE
        if path.is_file():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    model.load(str(path))
            except Exception as err:  # noqa: BLE001 - stale or broken: a new model learns again
                logger.warning("cannot load %s (%s); starting a new cost model", path, err)
        return model

    def _callback(self):
        from tvm.ir.utils import derived_object
        from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

        search = self

        @derived_object
        class _Report(PyMeasureCallback):
            def apply(self, _scheduler, task_id, candidates, _builds, results):
                search.batch(int(task_id), len(candidates), results)

        return _Report()

    def batch(self, task_id: int, count: int, results) -> None:
        self.trials += count
        for res in results:
            if res.run_secs is not None and res.error_msg is None:
                secs = [float(s) for s in res.run_secs]
                mean = sum(secs) / len(secs)
                self.best[task_id] = min(self.best.get(task_id, mean), mean)
        if self.progress is None:
            return
        status = SearchStatus(
            task=self.names[task_id],
            measured=count,
            done=self.trials,
            total=max(self.budget, self.trials),
            best_s={self.names[i]: secs for i, secs in self.best.items()},
            elapsed_s=time.perf_counter() - self.t0,
        )
        report = getattr(self.progress, "search_status", None)
        if report is not None:
            report(status)
        else:
            self.progress(status.line())


__all__ = ["COST_MODEL_FILE", "SearchRun", "SearchStatus", "format_eta", "meta_schedule_console"]
