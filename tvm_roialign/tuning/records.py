"""A tuning database directory: its metadata and checks, and applying its records at build time."""

from __future__ import annotations

import copy
import json
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tvm
import tvm_ffi
from tvm import relax, tirx

from .baseline import beats, evidence, read_baselines, workload_key
from .tasks import DEFAULT_OPS, as_target, is_scheduled, is_static, matches, normalize

#: Beside MetaSchedule's two JSON files: TVM version, target, ops and pipeline options of a tuning.
METADATA_FILE = "tvm_roialign_tuning.json"
RECORD_FILE = "database_tuning_record.json"
_FORMAT = 1
logger = logging.getLogger(__name__)


class TuningRecordsMismatch(ValueError):
    """A database was tuned with another TVM version or for another CPU."""


class CoverageWarning(UserWarning):
    """Some tunable tasks of a build had no tuning record (the default rules schedule them)."""


def isa(target: tvm.target.Target) -> dict:
    """What records are specific to: the CPU architecture (``mtriple``) and ``mcpu``, resolved."""
    from tvm.target import codegen

    triple = str(target.attrs.get("mtriple", "") or codegen.llvm_get_system_triple())
    return {"mtriple": triple, "mcpu": str(target.attrs.get("mcpu", "") or "generic")}


def write_metadata(work_dir: Path, target, ops, pipeline_options: dict) -> None:
    from .._version import __version__
    from ..target import target_config

    meta = {
        "format": _FORMAT,
        "tvm": str(tvm.__version__),
        "tvm_roialign": __version__,
        "target": target_config(target),
        "isa": isa(target),
        "ops": list(ops),
        "pipeline": dict(pipeline_options),
    }
    (Path(work_dir) / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def read_metadata(work_dir) -> dict | None:
    """The metadata of a database directory (None if it has none)."""
    path = Path(work_dir) / METADATA_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"tuning metadata {str(path)!r} is not valid JSON ({err.msg})") from None


def check_metadata(meta: dict | None, target, where: str, adding: bool = False) -> list[str]:
    """Notes on ``meta`` (:func:`read_metadata`) against the running TVM and ``target``.

    Another TVM version or CPU architecture raises :class:`TuningRecordsMismatch`; another
    ``mcpu`` is a note, or raises too when ``adding`` records (one database, one CPU).
    """
    if meta is None:
        return [f"{where} has no {METADATA_FILE}: its TVM version and target cannot be checked"]
    running, theirs = isa(target), meta.get("isa", {})
    hint = "; tune into another directory" if adding else "; tune again for this one"
    if meta.get("tvm") != str(tvm.__version__):
        raise TuningRecordsMismatch(
            f"{where} was tuned with TVM {meta.get('tvm')}, this is TVM {tvm.__version__}: "
            f"records do not carry over between versions{hint}"
        )
    if str(theirs.get("mtriple", "")).split("-")[0] != running["mtriple"].split("-")[0]:
        raise TuningRecordsMismatch(
            f"{where} was tuned for {theirs.get('mtriple')}, the target is {running['mtriple']}{hint}"
        )
    if theirs.get("mcpu") != running["mcpu"]:
        message = f"{where} was tuned for mcpu {theirs.get('mcpu')}, the target's is {running['mcpu']}"
        if adding:
            raise TuningRecordsMismatch(message + hint)
        return [message + ": its schedules are correct, but were measured on another CPU"]
    return []


def open_database(work_dir):
    """MetaSchedule's JSON database in ``work_dir`` (its files created if missing)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=True)


@dataclass
class Coverage:
    """Which tunable tasks of a module get their record (``tuned``: it beat the default rules'
    schedule on the tuning's runner), which have a record the default rules beat
    (``default_faster``: not applied), and which have none (``untuned``: static-shape functions
    of the database's ``ops``). ``gain_s``: the expected gain per run (calls x (default - record),
    over ``tuned``) of ``default_s`` (the default rules' time of those calls); ``unchecked``: the
    tuned tasks without a baseline (databases of older versions: applied unchecked)."""

    tuned: list[str]
    untuned: list[str]
    ops: tuple
    label: str = ""
    symbolic: list[str] = field(default_factory=list)  # of the ops, symbolic shapes: not tunable
    default_faster: list[str] = field(default_factory=list)
    gain_s: float = 0.0
    default_s: float = 0.0
    unchecked: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.tuned) + len(self.default_faster) + len(self.untuned)

    def __str__(self) -> str:
        kinds = "/".join(self.ops) + " " if self.ops else ""
        where = f"{self.label}: " if self.label else ""
        recorded = len(self.tuned) + len(self.default_faster)
        text = f"{where}tuning records for {recorded} of {self.total} {kinds}tasks"
        if recorded:
            text += f": {len(self.tuned)} tuned"
            if self.tuned and self.default_s > 0:
                share = 100 * self.gain_s / self.default_s
                text += f" (expected gain {self.gain_s * 1e3:.3f} ms per run, {share:.0f}% of their time)"
            text += f", the default rule stayed faster for {len(self.default_faster)}"
        if self.unchecked:
            text += (
                f" ({len(self.unchecked)} applied without a baseline: tuned by an older version, "
                "run tune again to measure it)"
            )
        if self.untuned:
            shown = ", ".join(self.untuned[:3]) + (", ..." if len(self.untuned) > 3 else "")
            text += f"; the default rules schedule the other {len(self.untuned)} ({shown})"
        if self.symbolic:
            text += f"; {len(self.symbolic)} more have symbolic shapes, which MetaSchedule cannot tune"
        return text


def _default_report(coverage: Coverage) -> None:
    if coverage.untuned:
        warnings.warn(str(coverage), CoverageWarning, stacklevel=2)
    else:
        logger.info("%s", coverage)


class TuningRecords:
    """A database directory opened for building: ``pipeline.build(mod, target,
    tuning_records=records)``; its database is loaded once, for any number of builds.

    Parameters
    ----------
    work_dir : str or os.PathLike
        What ``tvm-roialign tune -o`` (:func:`~tvm_roialign.tuning.tune`) wrote.
    target : optional
        Checked at once (:func:`check_metadata`); otherwise each build's target when it runs.
    report : callable(Coverage) or None
        Called for each module built; default: a :class:`CoverageWarning` when some tasks had no
        record.
    on_mismatch : "error" or "warn"
        What a database of another TVM version or CPU architecture does.
    apply : "faster" or "all"
        Which records schedule their task: ``"faster"`` (default) only those whose time beat the
        default rules' schedule measured on the same runner when tuning (:mod:`.baseline`), so a
        tuned build is never slower than the untuned one; ``"all"`` every record (to inspect
        what the search found).
    """

    def __init__(
        self, work_dir, target=None, report: Callable | None = None, on_mismatch="error", apply="faster"
    ):
        work_dir = Path(work_dir)
        if not (work_dir / RECORD_FILE).is_file():
            raise FileNotFoundError(f"{str(work_dir)!r} is not a tuning database (it has no {RECORD_FILE})")
        if on_mismatch not in ("error", "warn"):
            raise ValueError(f"on_mismatch must be 'error' or 'warn', got {on_mismatch!r}")
        if apply not in ("faster", "all"):
            raise ValueError(f"apply must be 'faster' or 'all', got {apply!r}")
        self.apply = apply
        self.work_dir = work_dir
        self.metadata = read_metadata(work_dir)
        self.ops = tuple(self.metadata.get("ops", DEFAULT_OPS)) if self.metadata else DEFAULT_OPS
        self.report = report or _default_report
        self.on_mismatch = on_mismatch
        self.label = ""
        self.database = open_database(work_dir)
        self.baselines = read_baselines(work_dir)
        self._checked: set[str] = set()
        if target is not None:
            self.check(as_target(target))

    def labelled(self, label: str) -> TuningRecords:
        """The same records (and loaded database) with ``label`` on their coverage reports."""
        other = copy.copy(self)
        other.label = label
        return other

    def check(self, target: tvm.target.Target) -> None:
        """:func:`check_metadata` once per ISA: notes become warnings; a mismatch raises, or
        warns with ``on_mismatch="warn"``."""
        if target.kind.name != "llvm":
            raise ValueError(f"tuning records are for llvm (CPU) targets, the target is {target.kind.name}")
        key = json.dumps(isa(target), sort_keys=True)
        if key in self._checked:
            return
        where = f"tuning database {str(self.work_dir)!r}"
        try:
            notes = check_metadata(self.metadata, target, where)
        except TuningRecordsMismatch as err:
            if self.on_mismatch == "error":
                raise
            notes = [str(err)]
        for note in notes:
            warnings.warn(note, UserWarning, stacklevel=3)
        self._checked.add(key)

    def coverage(self, mod: tvm.IRModule, target: tvm.target.Target) -> Coverage:
        """Which distinct unscheduled PrimFuncs of ``mod`` (the pipeline's phase-4 module) have a
        record here, and which of those beat the default rules (:meth:`select`)."""
        return self.select(mod, target)[0]

    def select(self, mod: tvm.IRModule, target: tvm.target.Target):
        """``(Coverage, {normalized module: record})``: the records to apply, those that beat
        the default rules' schedule measured when tuning (:mod:`.baseline`)."""
        cov = Coverage([], [], self.ops, self.label)
        chosen, seen = {}, set()
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
                continue
            norm = normalize(func)
            key = tvm_ffi.structural_hash(norm)
            if key in seen:
                continue
            seen.add(key)
            name = gv.name_hint
            record = self.database.query_tuning_record(norm, target, name)
            if record is None:
                if matches(name, self.ops):
                    (cov.untuned if is_static(func) else cov.symbolic).append(name)
                continue
            baseline = self.baselines.get(workload_key(norm))
            secs = [float(x) for x in record.run_secs or []]
            record_s = sum(secs) / len(secs) if secs else None
            if self.apply == "faster" and not beats(record_s, baseline, record):
                cov.default_faster.append(name)
                continue
            cov.tuned.append(name)
            chosen[key] = (norm, record)
            if baseline is None:
                cov.unchecked.append(name)
                continue
            # the gain from the same evidence the decision above was made on
            times = evidence(record_s, baseline, record)
            if times is not None:
                weight = int(baseline.get("weight", 1))
                cov.gain_s += weight * (times[0] - times[1])
                cov.default_s += weight * times[0]
        for names in (cov.tuned, cov.untuned, cov.symbolic, cov.default_faster, cov.unchecked):
            names.sort()
        return cov, list(chosen.values())


def load_records(work_dir, target=None, report=None, on_mismatch="error", apply="faster") -> TuningRecords:
    """:class:`TuningRecords` of a database directory (see there)."""
    return TuningRecords(work_dir, target, report, on_mismatch, apply)


def apply_database_pass(
    records, report: Callable | None = None, target: tvm.target.Target | None = None
) -> tvm.transform.Pass:
    """Phase 4 of the build pipeline: the functions that ``records`` (a directory or
    :class:`TuningRecords`) cover get their best record's schedule and ``tirx.is_scheduled``;
    the :class:`Coverage` goes to ``report`` (default: ``records.report``;
    :func:`tvm_roialign.pipeline.build` gives its own and returns the coverage). ``target``: the
    build's target (default: the current target when the pass runs)."""
    if not isinstance(records, TuningRecords):
        records = TuningRecords(records)
    report = report or records.report

    @tvm.transform.module_pass(opt_level=0, name="tvm_roialign.ApplyTuningRecords")
    def apply(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        build_target = target if target is not None else tvm.target.Target.current(allow_none=False)
        records.check(build_target)
        coverage, chosen = records.select(mod, build_target)
        if chosen:
            # only the records that beat the default rules: MetaScheduleApplyDatabase applies
            # whatever the current database holds
            with _database_of(chosen):
                mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
        report(coverage)
        return mod

    return apply


def _database_of(chosen):
    """An in-memory MetaSchedule database holding ``chosen`` ([(normalized module, record)])."""
    from tvm.s_tir import meta_schedule as ms

    database = ms.database.MemoryDatabase()
    for norm, record in chosen:
        workload = database.commit_workload(norm)
        database.commit_tuning_record(
            ms.database.TuningRecord(
                record.trace, workload, record.run_secs, record.target, record.args_info
            )
        )
    return database


__all__ = [
    "METADATA_FILE",
    "RECORD_FILE",
    "Coverage",
    "CoverageWarning",
    "TuningRecords",
    "TuningRecordsMismatch",
    "apply_database_pass",
    "check_metadata",
    "isa",
    "load_records",
    "open_database",
    "read_metadata",
    "write_metadata",
]
