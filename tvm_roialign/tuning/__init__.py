"""MetaSchedule tuning of the CPU pipeline's kernels: tune, keep the records, apply them at build.

* :func:`extract_tasks` (:mod:`.tasks`) finds the tasks in the module exactly as phase 4 of
  :func:`tvm_roialign.pipeline.cpu_pipeline` sees it (after the graph rewrites, legalize + fuse
  and ``AttachAttrLayoutFreeBuffers``): MetaSchedule keys a record on the structural hash of the
  normalized fused PrimFunc (shapes, dtypes, layouts, what was fused, the layout-free attribute;
  weights are parameters, their values do not count), so tasks must come from that very module;
* :func:`tune` (:mod:`.search`) searches schedules for them (``tvm.s_tir.meta_schedule``,
  XGBoost cost model, evolutionary search) into a JSON database in a directory, measuring here or
  on the boards of a TVM RPC tracker (:func:`rpc_runner`). It is resumable: ``trials_per_task``
  counts the records already in the database, so running it again finishes an interrupted run,
  and a larger count goes on from the best schedules found (the cost model is kept beside the
  database);
* :func:`measure_baselines` (:mod:`.baseline`): before searching, the default rules' schedule of
  every task is measured on the same runner; it is the bar a record must beat to be applied;
* :func:`apply_database_pass` (:mod:`.records`) is the pipeline's phase 4:
  ``MetaScheduleApplyDatabase`` over the records that beat their baseline, which marks what it schedules
  ``tirx.is_scheduled`` so that the default rules (phase 5) take only the rest. How many tasks
  had records is reported (:class:`Coverage`: "tuning records for 3 of 4 conv2d/matmul tasks"),
  never a silent fall-back.

A database directory holds MetaSchedule's ``database_workload.json`` and
``database_tuning_record.json``, ``cost_model.tar`` and :data:`METADATA_FILE` (TVM version, target,
ops, pipeline options). :class:`TuningRecords` checks it against the running TVM and the build
target: another TVM version or CPU architecture (``mtriple``) is refused (hashes and schedules do
not carry over), another ``mcpu`` is a warning (the schedules are correct anywhere, fast where they
were measured). Tuning needs the ``tune`` extra (xgboost, psutil; tornado to host a tracker).
"""

from __future__ import annotations

from .baseline import BASELINE_FILE, MARGIN, default_schedule, measure_baselines, read_baselines
from .records import (
    METADATA_FILE,
    Coverage,
    CoverageWarning,
    TuningRecords,
    TuningRecordsMismatch,
    apply_database_pass,
    check_metadata,
    isa,
    load_records,
    open_database,
    read_metadata,
)
from .search import (
    COST_MODEL_FILE,
    MissingTuningDependency,
    SearchStatus,
    TuneResult,
    build_candidate,
    check_target,
    close_runner,
    require_dependencies,
    rpc_runner,
    tune,
)
from .tasks import DEFAULT_OPS, Task, TaskSet, extract_tasks, slot_module

__all__ = [
    "BASELINE_FILE",
    "COST_MODEL_FILE",
    "DEFAULT_OPS",
    "MARGIN",
    "METADATA_FILE",
    "Coverage",
    "CoverageWarning",
    "MissingTuningDependency",
    "SearchStatus",
    "Task",
    "TaskSet",
    "TuneResult",
    "TuningRecords",
    "TuningRecordsMismatch",
    "apply_database_pass",
    "build_candidate",
    "check_metadata",
    "check_target",
    "close_runner",
    "default_schedule",
    "extract_tasks",
    "isa",
    "load_records",
    "measure_baselines",
    "open_database",
    "read_baselines",
    "read_metadata",
    "require_dependencies",
    "rpc_runner",
    "slot_module",
    "tune",
]
