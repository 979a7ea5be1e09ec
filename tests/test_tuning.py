"""MetaSchedule tuning (``tvm_roialign.tuning``, ``tvm-roialign tune``) on a tiny model.

One conv (3 -> 16, 3x3) and one dense layer: two tasks, tuned with 1 trial each by the command
line once per module (a fixture); the tests then build with the records (same outputs as PyTorch
and as the untuned build, the records' schedules in place, the count reported), resume the
database, tune through an RPC tracker and one server on loopback, and check the version / ISA
checks and the missing-extra message. MetaSchedule trials take seconds each here; nothing is
timed.
"""

from __future__ import annotations

import json
import re
import shutil
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xgboost")
pytest.importorskip("psutil")

import tvm
import tvm_ffi
from _cli import one_line_error, run_cli
from _targets import CLI_NATIVE

from tvm_roialign import cli, tuning
from tvm_roialign.passes import ConvertLayout, desired_layouts
from tvm_roialign.pipeline import Built, build, cpu_schedule_pass
from tvm_roialign.testing import run_first

TRIALS = 1
TARGET = CLI_NATIVE
#: one xdist worker runs this module (`--dist loadgroup`), so the module's tuning run is made once
pytestmark = pytest.mark.xdist_group("tuning")


class _Tiny(torch.nn.Module):
    """conv 3x3 (3 -> 16) + ReLU, then a dense layer to 10 outputs."""

    def __init__(self, size: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * size * size, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _relax(size: int):
    """(Relax module as ``compile`` makes it, input, expected output) at ``size`` x ``size``."""
    from tvm_roialign.frontend import from_exported_program

    model = _Tiny(size).eval()
    x = torch.from_numpy(np.random.default_rng(size).standard_normal((1, 3, size, size)).astype("float32"))
    exported = torch.export.export(model, (x,))
    mod = ConvertLayout(desired_layouts("NHWC"))(from_exported_program(exported, keep_params_as_input=False))
    with torch.no_grad():
        return mod, x.numpy(), model(x).numpy(), exported


def _records(db) -> int:
    return len(tuning.open_database(db).get_all_tuning_records())


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("tuning")


@pytest.fixture(scope="session")
def tiny(workdir):
    """(model.pt2, inputs.npz, Relax module, x, expected)."""
    mod, x, expected, exported = _relax(8)
    path = workdir / "tiny.pt2"
    torch.export.save(exported, str(path))
    np.savez(workdir / "tiny_in.npz", x=x)
    return path, workdir / "tiny_in.npz", mod, x, expected


@pytest.fixture(scope="session")
def tuned(tiny, workdir):
    """``tvm-roialign tune tiny.pt2 -o db --trials 2``: (database directory, what it printed)."""
    db = workdir / "db"
    code = cli.main(
        ["-q", "tune", str(tiny[0]), "-o", str(db), "--trials", str(TRIALS), "--search-seed", "0"]
    )
    assert code == 0
    return db


def _copy(db, workdir, name):
    dest = workdir / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(db, dest)
    return dest


# ---------------------------------------------------------------------------------------------
# tune -> compile --tuning-records -> run


def test_tune_writes_a_database_with_its_metadata(tuned):
    for name in ("database_workload.json", "database_tuning_record.json", tuning.COST_MODEL_FILE):
        assert (tuned / name).is_file(), name
    meta = tuning.read_metadata(tuned)
    assert meta["tvm"] == tvm.__version__
    assert meta["isa"] == tuning.isa(TARGET) and meta["isa"]["mcpu"] == TARGET.attrs["mcpu"]
    assert meta["ops"] == ["conv2d", "matmul"]
    assert _records(tuned) == 2 * TRIALS  # two tasks


def test_cli_round_trip_applies_the_records(tuned, tiny, workdir, capsys, tol):
    model, inputs, _mod, _x, expected = tiny
    lib = workdir / "tiny_tuned.so"
    code, out, err = run_cli(["compile", str(model), "-o", str(lib), "--tuning-records", str(tuned)], capsys)
    assert code == 0, err
    assert "tuning records for 2 of 2 conv2d/matmul tasks: " in out
    assert "the default rule stayed faster for" in out  # 1 trial: records applied only if faster
    meta = json.loads(lib.with_name(lib.name + ".json").read_text())["tuning"]
    assert len(meta["tuned"]) + len(meta["default_faster"]) == 2 and meta["untuned"] == []
    assert meta["expected_gain_ms"] >= 0
    outputs = workdir / "tiny_tuned_out.npz"
    code, _out, err = run_cli(["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)], capsys)
    assert code == 0, err
    np.testing.assert_allclose(
        np.load(outputs)["output_0"], expected, rtol=tol["float32"], atol=tol["float32"]
    )


def test_records_schedule_the_tasks_and_give_the_same_results(tuned, tiny, tol):
    _model, _inputs, mod, x, expected = tiny
    coverages = []
    # every record, whether or not it beat the default rules: the schedules replayed are correct
    records = tuning.load_records(tuned, TARGET, report=coverages.append, apply="all")
    slot = tuning.slot_module(mod, TARGET)
    with TARGET:
        applied = tuning.apply_database_pass(records)(slot)
        default = cpu_schedule_pass()(slot)
    (coverage,) = coverages
    assert len(coverage.tuned) == 2 and not coverage.untuned
    for name in coverage.tuned:
        func = applied[name]
        assert func.attrs["tirx.is_scheduled"]
        assert not tvm_ffi.structural_equal(func, default[name]), name  # not the default rules' schedule
    tuned_out = run_first(build(mod, TARGET, tuning_records=records).executable, x)
    untuned_out = run_first(build(mod, TARGET).executable, x)
    np.testing.assert_allclose(tuned_out, expected, rtol=tol["float32"], atol=tol["float32"])
    np.testing.assert_allclose(tuned_out, untuned_out, rtol=tol["float32"], atol=tol["float32"])


def test_build_returns_the_coverage_of_its_records(tuned, tiny, tol):
    """``build`` returns the coverage of its records in ``Built.coverage`` (the records' report
    receives the same); without records it is None."""
    _model, _inputs, mod, x, expected = tiny
    reported = []
    records = tuning.load_records(tuned, TARGET, report=reported.append)
    built = build(mod, TARGET, tuning_records=records)
    assert isinstance(built, Built) and reported == [built.coverage]
    assert built.coverage.total == 2 and not built.coverage.untuned
    assert str(built.coverage).startswith("tuning records for 2 of 2 conv2d/matmul tasks: ")
    np.testing.assert_allclose(
        run_first(built.executable, x), expected, rtol=tol["float32"], atol=tol["float32"]
    )
    assert build(mod, TARGET).coverage is None
    # the phase-4 pass itself: its coverage goes where the pass says
    sink = []
    built = build(mod, TARGET, tuning_records=tuning.apply_database_pass(records, sink.append))
    assert built.coverage is None and [c.total for c in sink] == [2] and len(reported) == 1


def _copy_mod(mod):
    return tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)


def _with_baselines(db, default_s: float):
    """``db`` with every task's measured baseline replaced by ``default_s`` seconds (and its
    interleaved check, which would decide otherwise, dropped)."""
    path = db / tuning.BASELINE_FILE
    data = json.loads(path.read_text())
    for entry in data["tasks"].values():
        entry["default_s"] = default_s
        entry.pop("check", None)
    path.write_text(json.dumps(data))
    return db


def test_tune_measures_the_default_rules_as_baseline(tuned, tiny):
    baselines = tuning.read_baselines(tuned)
    keys = {str(tvm_ffi.structural_hash(t.mod)) for t in tuning.extract_tasks(tiny[2], TARGET)}
    assert set(baselines) == keys  # one per task, keyed as the database keys workloads
    assert all(b["default_s"] > 0 and b["weight"] == 1 for b in baselines.values())


def test_records_slower_than_the_default_rules_are_not_applied(tuned, tiny, workdir):
    """The no-regression rule, on doctored baselines: default rules faster than any record ->
    the build is the untuned one; default rules slower -> every record applied, gain reported."""
    _model, _inputs, mod, _x, _expected = tiny
    slot = tuning.slot_module(mod, TARGET)
    with TARGET:
        default = cpu_schedule_pass()(_copy_mod(slot))  # (the pass updates its module in place)
    for default_s, applied in ((1e-12, False), (1e3, True)):
        db = _with_baselines(_copy(tuned, workdir, f"db_baseline_{applied}"), default_s)
        coverages = []
        records = tuning.load_records(db, TARGET, report=coverages.append)
        with TARGET:
            built = cpu_schedule_pass()(tuning.apply_database_pass(records)(_copy_mod(slot)))
        (coverage,) = coverages
        assert len(coverage.tuned) == (2 if applied else 0), coverage
        assert len(coverage.default_faster) == (0 if applied else 2), coverage
        text = str(coverage)
        assert text.startswith("tuning records for 2 of 2 conv2d/matmul tasks: ")
        assert f"the default rule stayed faster for {0 if applied else 2}" in text
        for name in coverage.default_faster:
            assert tvm_ffi.structural_equal(built[name], default[name]), name
        if applied:
            assert coverage.gain_s > 0 and "expected gain" in text
            for name in coverage.tuned:
                assert not tvm_ffi.structural_equal(built[name], default[name]), name


def test_tasks_without_records_fall_back_and_are_reported(tuned, tol):
    mod, x, expected, _ = _relax(6)  # other shapes: other workloads, none in the database
    with pytest.warns(tuning.CoverageWarning, match="tuning records for 0 of 2 conv2d/matmul tasks"):
        executable = build(mod, TARGET, tuning_records=str(tuned)).executable
    np.testing.assert_allclose(run_first(executable, x), expected, rtol=tol["float32"], atol=tol["float32"])


def test_extract_tasks_sees_the_pipeline_tasks(tiny):
    tasks = tuning.extract_tasks(tiny[2], TARGET)
    assert sorted(t.name.split("_")[1] for t in tasks) == ["conv2d", "matmul"]
    assert not tasks.symbolic
    assert [t.name for t in tuning.extract_tasks(tiny[2], TARGET, ops=("conv2d",))] == [
        t.name for t in tasks if "conv2d" in t.name
    ]


def test_a_check_is_found_again_from_the_database_file(tiny, tmp_path):
    """The key of a record's check is the same for the record fresh from the search (``IntImm``
    in its trace) and read back from the database file (``int``), so that ``compile`` finds the
    check ``tune`` made (it never did: every checked record fell back to the search's time)."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_roialign.tuning.baseline import trace_key

    task = tuning.extract_tasks(tiny[2], TARGET).tasks[0]
    context = ms.TuneContext(
        mod=task.mod, target=TARGET, space_generator="post-order-apply", task_name=task.name
    )
    trace = context.space_generator.generate_design_space(task.mod)[0].trace
    files = (str(tmp_path / "workload.json"), str(tmp_path / "record.json"))
    database = ms.database.JSONDatabase(*files)
    workload = database.commit_workload(task.mod)
    database.commit_tuning_record(ms.database.TuningRecord(trace, workload, [1e-3], TARGET, []))
    fresh = database.get_top_k(workload, 1)[0]
    again = ms.database.JSONDatabase(*files)
    read_back = again.get_top_k(again.commit_workload(task.mod), 1)[0]
    assert trace_key(fresh) == trace_key(read_back)


# ---------------------------------------------------------------------------------------------
# resuming


def test_a_task_selection_then_resume(tuned, tiny, workdir, capsys):
    """``--tasks list`` shows the tasks by index (no database needed), ``--tasks 1`` tunes only
    that one (tvmc tune's option); a rerun of every task resumes, adding only what each still
    lacks (task 0's trial; task 1 is complete), appended to the database, not redone; the same
    count once more has nothing left to run. (One database through the three runs: each
    ``tune`` starts MetaSchedule's build and measurement workers, seconds each.)"""
    code, out, err = run_cli(["tune", str(tiny[0]), "--tasks", "list"], capsys)
    assert code == 0, err
    names = [t.name for t in tuning.extract_tasks(tiny[2], TARGET)]
    rows = [line.split() for line in out.splitlines() if line.split()[-1] in names]
    assert [(r[0], r[-1]) for r in rows] == [(str(i), n) for i, n in enumerate(names)], out
    assert "MFLOP" in out and float(rows[names.index(next(n for n in names if "conv2d" in n))][2]) > 0
    db = _copy(tuned, workdir, "db_select")
    records_file = db / "database_tuning_record.json"
    first = records_file.read_text()
    code, out, err = run_cli(
        ["tune", str(tiny[0]), "-o", str(db), "--trials", str(TRIALS + 1), "--tasks", "1"],
        capsys,
        quiet=False,
    )
    assert code == 0, err
    # the search's progress, one plain line per measured batch off a terminal: the task's full
    # name, trials done of the run's budget (one), its best time so far, an ETA
    best = r"(best \d+\.\d+ ms|no valid candidate yet)"
    progress = re.compile(rf"{re.escape(names[1])}: {best}; 1/1 trials of the run, ETA \d+s")
    assert progress.search(err), err
    assert _records(db) == 2 * TRIALS + 1
    per_task = {}
    for record in tuning.open_database(db).get_all_tuning_records():
        key = tvm_ffi.structural_hash(record.workload.mod)
        per_task[key] = per_task.get(key, 0) + 1
    tasks = tuning.extract_tasks(tiny[2], TARGET)
    assert [per_task.get(tvm_ffi.structural_hash(t.mod)) for t in tasks] == [TRIALS, TRIALS + 1]
    assert "1 trials run" in out and "of 1 tasks beat" in out  # the selected task only
    assert records_file.read_text().startswith(first)
    # every task, through the API: task 0 resumes from TRIALS, task 1 has its count already
    selected = records_file.read_text()
    result = tuning.tune(tiny[2], TARGET, db, trials_per_task=TRIALS + 1, seed=1)
    assert result.trials_run == 1
    assert [(t["trials_before"], t["trials"]) for t in result.tasks] == [
        (TRIALS, TRIALS + 1), (TRIALS + 1, TRIALS + 1)
    ]
    assert _records(db) == 2 * (TRIALS + 1)
    assert records_file.read_text().startswith(selected)  # appended, not redone
    # the same count again, through the command line: nothing left to run (no trial, the records
    # as they were), and the warning that so few trials are too few to expect a gain
    argv = ["tune", str(tiny[0]), "-o", str(db), "--trials", str(TRIALS + 1)]
    code, out, err = run_cli(argv, capsys, quiet=False)
    assert code == 0, err
    assert "too few to expect a gain" in err
    assert "beat the default rules' schedule" in out
    assert re.search(r"^0 trials run in ", out, re.MULTILINE), out
    assert _records(db) == 2 * (TRIALS + 1)


# ---------------------------------------------------------------------------------------------
# measuring through an RPC tracker (loopback)


def test_tune_through_an_rpc_tracker(tiny, workdir, capsys, rpc_server, tmp_path, monkeypatch):
    """Candidates measured on an RPC device; their local builds (the build workers') are gone from
    the temporary directory afterwards."""
    import tempfile

    key = "tvm-roialign-test"
    tracker = rpc_server(key=key)  # a tracker and one server of the key, on loopback
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    db = workdir / "db_rpc"
    argv = ["tune", str(tiny[0]), "-o", str(db), "--trials", "1", "--ops", "matmul"]
    code, _out, err = run_cli([*argv, "--rpc-tracker", tracker, "--rpc-key", key], capsys)
    served = rpc_server.log.read_text()
    assert code == 0, err
    assert not list(scratch.iterdir()), list(scratch.iterdir())
    assert _records(db) == 1
    assert "load_module" in served, served  # the candidate ran in the RPC server


# ---------------------------------------------------------------------------------------------
# checks and errors


def _edit_metadata(db, **isa_or_tvm):
    meta = tuning.read_metadata(db)
    for key, value in isa_or_tvm.items():
        if key == "tvm":
            meta["tvm"] = value
        else:
            meta["isa"][key] = value
    (db / tuning.METADATA_FILE).write_text(json.dumps(meta))


def test_version_and_isa_mismatch(tuned, tiny, workdir, capsys):
    db = _copy(tuned, workdir, "db_other_tvm")
    _edit_metadata(db, tvm="0.0.1")
    with pytest.raises(tuning.TuningRecordsMismatch, match=r"TVM 0\.0\.1"):
        tuning.load_records(db, TARGET)
    with pytest.warns(UserWarning, match=r"TVM 0\.0\.1"):
        tuning.load_records(db, TARGET, on_mismatch="warn")
    code, _out, err = run_cli(
        ["compile", str(tiny[0]), "-o", str(workdir / "x.so"), "--tuning-records", str(db)], capsys
    )
    assert code == 1
    one_line_error(err, "--tuning-records", "TVM 0.0.1")

    db = _copy(tuned, workdir, "db_other_arch")
    _edit_metadata(db, mtriple="aarch64-unknown-linux-gnu")
    with pytest.raises(tuning.TuningRecordsMismatch, match="aarch64"):
        tuning.load_records(db, TARGET)

    db = _copy(tuned, workdir, "db_other_cpu")
    _edit_metadata(db, mcpu="some-other-cpu")
    with pytest.warns(UserWarning, match="mcpu some-other-cpu"):
        tuning.load_records(db, TARGET)
    with pytest.raises(tuning.TuningRecordsMismatch, match="another directory"):
        tuning.tune(tiny[2], TARGET, db, trials_per_task=TRIALS)  # no mixing of CPUs in one database


def test_missing_extra_is_one_line(tiny, workdir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgboost", None)  # `import xgboost` now raises ImportError
    with pytest.raises(tuning.MissingTuningDependency, match=r"'xgboost'.*tvm-roialign\[tune\]"):
        tuning.require_dependencies()
    code, _out, err = run_cli(["tune", str(tiny[0]), "-o", str(workdir / "never")], capsys)
    assert code == 1
    one_line_error(err, "'xgboost'", "tvm-roialign[tune]")
    assert not (workdir / "never").exists()


def test_tune_and_records_errors(tuned, tiny, workdir, capsys):
    model = str(tiny[0])
    cases = [
        (["tune", model, "-o", str(workdir / "e1"), "--target", "cuda"], ["--target", "llvm"]),
        (["tune", model, "-o", str(workdir / "e2"), "--trials", "0"], ["--trials"]),
        (["tune", model, "-o", str(workdir / "e3"), "--rpc-tracker", "127.0.0.1:9"], ["--rpc-key"]),
        (
            ["tune", model, "-o", str(workdir / "e4"), "--rpc-tracker", "nohost", "--rpc-key", "k"],
            ["HOST:PORT"],
        ),
        (["tune", model, "-o", str(workdir / "e5"), "--ops", " , "], ["--ops"]),
        (["tune", model, "-o", str(workdir / "e7"), "--tasks", "0,x"], ["--tasks"]),
        (["tune", model, "-o", str(workdir / "e8"), "--tasks", "3-1"], ["--tasks", "empty"]),
        (["tune", model, "-o", str(workdir / "e9"), "--tasks", "0,7"], ["task index 7", "0-1"]),
        (["tune", model], ["-o"]),
        (["tune", model, "-o", str(workdir / "e6"), "--target", "llvm-generic"], ["num-cores"]),
        (
            ["compile", model, "-o", str(workdir / "e.so"), "--tuning-records", str(workdir)],
            ["not a tuning database"],
        ),
        (
            [
                "compile",
                model,
                "-o",
                str(workdir / "e.tar"),
                "--target",
                "cuda",
                "--tuning-records",
                str(tuned),
            ],
            ["llvm"],
        ),
    ]
    for argv, words in cases:
        code, _out, err = run_cli(argv, capsys)
        assert code == 1, (argv, err)
        one_line_error(err, *words)
