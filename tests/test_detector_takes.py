"""The detectors' import puts its gathers (``relax.take``) in mode ``"wrap"``: torch's indexing
(negative indices from the end) computed exactly, and no "Fast mode segfaults" warning from TVM at
each take of each compile, while a take built otherwise keeps TVM's warning (nothing is filtered)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

import tvm
from tvm import relax

from tvm_roialign.frontend.detection import from_exported_program

WARNING = "Fast mode segfaults"


class _Gather(torch.nn.Module):
    def forward(self, x, keep):
        return x[keep] * 2.0


def _build(mod):
    return relax.build(mod, "llvm")


def _run(executable, *arrays):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays])


def test_a_detector_import_gathers_as_torch_without_tvm_s_warning(capfd):
    x = torch.arange(20, dtype=torch.float32).reshape(5, 4)
    keep = torch.tensor([3, 0, -1, 4, -1])  # NMS's keep, padded with -1
    program = torch.export.export(_Gather(), (x, keep))
    mod = from_exported_program(program, keep_params_as_input=False)
    capfd.readouterr()
    executable = _build(mod)
    out = _run(executable, x.numpy(), keep.numpy())
    out = (out[0] if not hasattr(out, "numpy") else out).numpy()
    assert WARNING not in capfd.readouterr().err
    np.testing.assert_array_equal(out, _Gather()(x, keep).numpy())


def test_a_take_built_otherwise_keeps_tvm_s_warning(capfd):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([5, 4], "float32"))
    keep = relax.Var("keep", relax.TensorType([3], "int64"))
    with bb.function("main", [x, keep]):
        bb.emit_func_output(bb.emit(relax.op.take(x, keep, axis=0)))
    capfd.readouterr()
    _build(bb.get())
    assert WARNING in capfd.readouterr().err
