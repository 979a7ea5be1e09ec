"""Transposes (``permute_dims``) against NumPy: static shapes (tiled by schedules/transpose.py,
including extents that no vector divides) and symbolic ones (left to the elementwise schedule)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from _targets import NATIVE as HOST
from tvm import relax

from tvm_roialign.pipeline import build, cpu_schedule_pass, prepare_pipeline
from tvm_roialign.testing import run_first


def _module(shape, axes, dtype="float32"):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.permute_dims(x, axes))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, data):
    return run_first(build(mod, HOST).executable, data)


STATIC = [
    ((1, 3, 224, 224), (0, 2, 3, 1)),  # NCHW -> NHWC of an image
    ((1, 56, 56, 64), (0, 3, 1, 2)),  # NHWC -> NCHW
    ((2, 5, 7, 9), (0, 3, 1, 2)),  # no vector divides any axis
    ((64, 48), (1, 0)),
    ((3, 16, 24), (2, 0, 1)),
    ((4, 8, 6, 10), (3, 2, 1, 0)),
    ((2, 3, 16, 8), (1, 0, 2, 3)),  # innermost axis kept
]


@pytest.mark.parametrize(("shape", "axes"), STATIC)
def test_static_transpose_matches_numpy(shape, axes, rng):
    data = rng.standard_normal(shape).astype("float32")
    np.testing.assert_array_equal(_run(_module(shape, axes), data), data.transpose(axes))


def test_image_transpose_has_no_index_division():
    """NCHW -> NHWC of a 3-channel image keeps static loops: no division or modulo per element."""
    with HOST:
        scheduled = cpu_schedule_pass()(prepare_pipeline(HOST)(_module((1, 3, 224, 224), (0, 2, 3, 1))))
    texts = [f.script() for _gv, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert texts
    for text in texts:
        body = text.split("T.sblock", 1)[-1]
        assert "//" not in body and "%" not in body, text


@pytest.mark.parametrize(
    ("axes", "concrete"),
    [((0, 2, 3, 1), (1, 3, 37, 50)), ((0, 3, 1, 2), (2, 33, 20, 8)), ((2, 3, 0, 1), (1, 3, 9, 16))],
)
def test_symbolic_transpose_matches_numpy(axes, concrete, rng):
    h, w = tvm.tirx.Var("h", "int64"), tvm.tirx.Var("w", "int64")
    shape = list(concrete)
    shape[1 if axes == (0, 3, 1, 2) else 2] = h
    shape[2 if axes == (0, 3, 1, 2) else 3] = w
    data = rng.standard_normal(concrete).astype("float32")
    np.testing.assert_array_equal(_run(_module(shape, axes), data), data.transpose(axes))
