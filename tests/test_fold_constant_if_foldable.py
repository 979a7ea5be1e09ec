"""FoldConstantIfFoldable (tvm_roialign/passes/fold_constant_if_foldable.py): the module
``relax.transform.FoldConstant`` makes, every time, and FoldConstant not run at all where it would
change nothing."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_roialign.passes import FoldConstantIfFoldable, FoldConstantNumPy


def _const(shape):
    return relax.const(np.arange(np.prod(shape), dtype="float32").reshape(shape))


def _module(body, params=((2, 3),)):
    """``main(x...)`` whose dataflow block ``body(bb, *x)`` builds; its output is returned."""
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(list(shape), "float32")) for i, shape in enumerate(params)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *xs))
        bb.emit_func_output(out)
    return bb.get()


n = tirx.Var("n", "int64")

#: name -> (body, parameter shapes); "nothing_*" ones have nothing FoldConstant changes
CASES = {
    "op_on_constants": (lambda bb, x: relax.op.add(x, bb.emit(relax.op.exp(_const((2, 3))))), [(2, 3)]),
    "var_bound_to_constant": (lambda bb, x: relax.op.add(x, bb.emit(_const((2, 3)))), [(2, 3)]),
    "zeros_of_static_shape": (
        lambda bb, x: relax.op.add(x, bb.emit(relax.op.zeros(relax.ShapeExpr([2, 3]), "float32"))),
        [(2, 3)],
    ),
    "reshape_to_bound_shape": (
        lambda bb, x: relax.op.reshape(x, bb.emit(relax.ShapeExpr([3, 2]))), [(2, 3)]
    ),
    "nothing_computed_from_inputs": (
        lambda bb, x: relax.op.nn.relu(bb.emit(relax.op.add(x, _const((2, 3))))), [(2, 3)]
    ),
    "nothing_arange_of_symbolic_size": (
        lambda bb, x: relax.op.add(x, bb.emit(relax.op.astype(relax.op.arange(0, n + 1), "float32"))),
        [(n + 1,)],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_result_is_fold_constants(name):
    body, params = CASES[name]
    mod = _module(body, params)
    expected = relax.transform.FoldConstant()(mod)
    got = FoldConstantIfFoldable()(mod)
    tvm.ir.assert_structural_equal(got, expected)
    if name.startswith("nothing"):
        assert got.same_as(mod)  # FoldConstant not run: the module itself
    else:
        assert not got.same_as(mod)


def test_after_numpy_folding_nothing_is_left_to_fold():
    """FoldConstantNumPy leaves no variable bound to a constant it computed (its uses take the
    constant, as FoldConstant would make them), so FoldConstant has nothing left: a detector's
    layout-changed weights need no second second-long pass."""
    w = _const((3, 4))

    def body(bb, x):
        weight = bb.emit(relax.op.permute_dims(w))
        zero = bb.emit(relax.op.zeros(relax.ShapeExpr([4]), "float32"))
        return relax.op.add(relax.op.matmul(x, relax.op.permute_dims(weight)), zero)

    mod = FoldConstantNumPy()(_module(body, [(2, 3)]))
    assert FoldConstantIfFoldable()(mod).same_as(mod)
    tvm.ir.assert_structural_equal(relax.transform.FoldConstant()(mod), mod)
