"""MetaSchedule tuning (tvm_roialign.tuning): a tiny conv tuned with two trials, its record applied at
build time in place of the default rule (and counted), results unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_roialign import tuning
from tvm_roialign.pipeline import build

TARGET = tvm.target.Target(
    {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(), "num-cores": 2}
)


def _tiny_conv(rng):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 8, 8, 16], "float32"))
    weight = rng.standard_normal((1, 1, 16, 32)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x, relax.const(weight), data_layout="NHWC", kernel_layout="HWIO"
                )
            )
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def test_tune_then_build_with_the_records(tmp_path, rng):
    pytest.importorskip("xgboost")
    pytest.importorskip("psutil")
    mod = _tiny_conv(rng)
    (task,) = tuning.extract_tasks(mod, TARGET)
    assert "conv2d" in task.task_name
    tuning.tune(
        mod,
        TARGET,
        tmp_path,
        trials_per_task=2,
        trials_per_round=2,
        population=8,
        seed=0,
    )
    assert tuning.has_records(tmp_path)
    found = []
    executable = build(
        mod, TARGET, tuning_records=tmp_path, tuning_report=lambda *c: found.append(c)
    )
    assert found == [(1, 1)]  # the conv came from the records, not the default rule
    data = rng.standard_normal((1, 8, 8, 16)).astype("float32")
    tuned = relax.VirtualMachine(executable, tvm.cpu())["main"](
        tvm.runtime.tensor(data)
    ).numpy()
    default = relax.VirtualMachine(build(mod, TARGET), tvm.cpu())["main"](
        tvm.runtime.tensor(data)
    )
    np.testing.assert_allclose(tuned, default.numpy(), rtol=1e-5, atol=1e-5)


def test_errors(tmp_path, rng):
    with pytest.raises(FileNotFoundError, match="no tuning records"):
        tuning.apply_database_pass(tmp_path)
    with pytest.raises(ValueError, match="HOST:PORT"):
        tuning.rpc_runner("localhost", "key")
    with pytest.raises(ValueError, match="trials_per_task"):
        tuning.tune(_tiny_conv(rng), TARGET, tmp_path, trials_per_task=0)
    with pytest.raises(ValueError, match="nothing to tune"):
        tuning.tune(
            _tiny_conv(rng), TARGET, tmp_path, trials_per_task=1, op_names=["softmax"]
        )
