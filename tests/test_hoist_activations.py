"""HoistActivations: a transformer MLP's ``linear -> GELU -> linear`` on a ``[batch, tokens,
features]`` input as torch.export writes it leaves the GELU right behind the first matmul's bias
add (so that FuseOps puts it in the matmul's epilogue) and one reshape before the second matmul;
the built module equals float64 PyTorch."""

from __future__ import annotations

import numpy as np
import torch
import tvm
from _targets import NATIVE as HOST
from tvm import relax

from tvm_roialign.frontend import from_exported_program
from tvm_roialign.passes import HoistActivations
from tvm_roialign.pipeline import build
from tvm_roialign.profiling import profile_vm
from tvm_roialign.testing import op_calls, run_first


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 48)
        self.fc2 = torch.nn.Linear(48, 16)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))) + x


def _module():
    torch.manual_seed(0)
    model = _MLP().eval()
    x = torch.randn(2, 7, 16) * 2
    mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=False)
    return model, x, mod


def _producer(mod, arg):
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            for block in func.body.blocks:
                for binding in block.bindings:
                    if binding.var.same_as(arg):
                        return binding.value
    return None


def test_gelu_reads_the_bias_add_and_reshapes_merge():
    _, _, mod = _module()
    hoisted = HoistActivations()(mod)
    (gelu,) = op_calls(hoisted, "relax.nn.gelu")
    producer = _producer(hoisted, gelu.args[0])
    assert producer is not None and producer.op.name != "relax.reshape", producer
    # no reshape reads a reshape
    for reshape in op_calls(hoisted, "relax.reshape"):
        source = _producer(hoisted, reshape.args[0])
        assert not (isinstance(source, relax.Call) and source.op.name == "relax.reshape")
    # nothing to move: the same module
    assert HoistActivations()(hoisted).same_as(hoisted)


def test_gelu_fuses_into_the_matmul_and_equals_float64_torch():
    model, x, mod = _module()
    built = build(mod, HOST)
    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    got = run_first(vm, x.numpy())
    with torch.no_grad():
        expected = model.double()(x.double()).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    kernels, _ = profile_vm(vm, tvm.cpu(), [tvm.runtime.tensor(x.numpy())], runs=1)
    names = [k.name for k in kernels]
    assert any("matmul" in name and "gelu" in name for name in names), names
