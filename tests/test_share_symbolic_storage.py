"""``ShareSymbolicStorage``: after ``StaticPlanBlockMemory``, storages of symbolic size whose lives
do not overlap share one allocation (the largest size), where the planner shares only equal sizes.

A chain of convolutions of varying widths over an image of symbolic batch, height and width: its
build (which runs the pass) allocates fewer storages a run than ``StaticPlanBlockMemory`` alone,
and equals a float64 NumPy reference at three sizes in turn from one VM, largest last and first
(a shared storage sized for one call is not too small for the next); a storage that the result is
made from, or one read other than through ``alloc_tensor``, is left alone.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

from tvm_roialign.passes import ShareSymbolicStorage
from tvm_roialign.pipeline import build, cpu_schedule_pass, prepare_pipeline
from tvm_roialign.target import parse_target

TARGET = parse_target("llvm -mcpu=x86-64-v3 -num-cores=2")
#: output channels of each 1x1 conv of the chain (each followed by a ReLU): growing, so that a
#: storage is shared with later, larger tensors
WIDTHS = (8, 16, 24, 64, 96, 4)


def _weights():
    rng = np.random.default_rng(0)
    channels = (3, *WIDTHS)
    return [(rng.standard_normal((o, 1, 1, i)) / np.sqrt(i)).astype("float32")
            for i, o in itertools.pairwise(channels)]


def _chain() -> tvm.IRModule:
    n, h, w = (tirx.Var(v, "int64") for v in "nhw")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, h, w, 3], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for weight in _weights():
                y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(
                    y, relax.const(weight), data_layout="NHWC", kernel_layout="OHWI")))
            out = bb.emit_output(relax.op.sum(y, axis=[3]))
        bb.emit_func_output(out)
    return bb.get()


def _reference(x: np.ndarray) -> np.ndarray:
    y = x.astype(np.float64)
    for weight in _weights():
        y = np.maximum(np.einsum("nhwi,oi->nhwo", y, weight[:, 0, 0].astype(np.float64)), 0)
    return y.sum(axis=3)


def _planned(share: bool) -> str:
    """``main`` after the memory plan (and the pass where ``share``), as text."""
    with TARGET:
        mod = prepare_pipeline(TARGET, layout=None, winograd=0)(_chain())
        mod = cpu_schedule_pass(None)(mod)
        passes = [*cpu_generic.dataflow_lower_passes(TARGET), relax.transform.StaticPlanBlockMemory()]
        passes += [ShareSymbolicStorage()] if share else []
        mod = tvm.transform.Sequential(passes)(mod)
    return mod["main"].script()


def test_fewer_storages_than_the_plan_alone():
    alone, shared = (len(re.findall(r"memory\.alloc_storage", _planned(s))) for s in (False, True))
    assert shared < alone, (alone, shared)
    assert shared <= 3, shared  # two live at a time (a conv's input and output), and the result


@pytest.fixture(scope="module")
def executable():
    return build(_chain(), TARGET, layout=None, winograd=0).executable


@pytest.mark.parametrize("order", [(1, 2, 3), (3, 1, 2)])
def test_results_at_several_sizes_from_one_vm(executable, order):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    sizes = {1: (1, 9, 13), 2: (2, 17, 8), 3: (3, 31, 29)}
    for key in order:
        x = np.random.default_rng(key).standard_normal((*sizes[key], 3)).astype("float32")
        actual = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(actual, _reference(x), rtol=1e-4, atol=1e-4)


def _function(body_fn):
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, 4], "float32"))
    with bb.function("main", [x]):
        body_fn(bb, x, n)
    return bb.get()


def test_a_storage_the_result_is_made_from_is_not_shared():
    from tvm_roialign.passes.share_symbolic_storage import _groups, _param_sizes, _storages

    def body(bb, x, n):
        s1 = bb.emit(relax.op.memory.alloc_storage(relax.ShapeExpr([n * 16]), 0, "global", "float32"))
        t1 = bb.emit(relax.op.memory.alloc_tensor(s1, 0, relax.ShapeExpr([n, 4]), "float32"))
        s2 = bb.emit(relax.op.memory.alloc_storage(relax.ShapeExpr([n * 32]), 0, "global", "float32"))
        t2 = bb.emit(relax.op.memory.alloc_tensor(s2, 0, relax.ShapeExpr([n, 8]), "float32"))
        s3 = bb.emit(relax.op.memory.alloc_storage(relax.ShapeExpr([n * 16]), 0, "global", "float32"))
        s4 = bb.emit(relax.op.memory.alloc_storage(relax.ShapeExpr([n * 16]), 0, "global", "float32"))
        bb.emit(relax.Tuple([s4]))  # read as a value, not through alloc_tensor
        t3 = bb.emit(relax.op.memory.alloc_tensor(s3, 0, relax.ShapeExpr([n, 4]), "float32"))
        s5 = bb.emit(relax.op.memory.alloc_storage(relax.ShapeExpr([n * 16]), 0, "global", "float32"))
        t5 = bb.emit(relax.op.memory.alloc_tensor(s5, 0, relax.ShapeExpr([n, 4]), "float32"))
        bb.emit(relax.call_pure_packed("test.read", t5, ty_args=relax.TensorType([n, 4], "float32")))
        bb.emit_func_output(relax.Tuple([t2, t3, x, t1]))

    func = _function(body)["main"]
    storages = _storages(list(func.body.blocks[0].bindings), _param_sizes(func), func.body.body)
    # s1, s2, s3: the result holds their tensors; s4: read as a value; s5: free after its reader
    assert [s.shared for s in storages] == [False, False, False, False, True]
    assert _groups(storages) == []  # nothing to share s5 with
