"""TVM's own importers on a model with ``torchvision.ops.roi_align``, after ``import tvm_roialign``.

``tvm.relax.frontend.torch.from_exported_program`` given ``tvm_roialign.frontend.convert_map()`` as
``custom_convert_map``, and ``tvm_roialign.frontend.from_onnx`` (TVM's ``from_onnx`` takes no
converter table), equal torchvision. Without them, TVM's converters shift the box by 0.5 *before*
``spatial_scale``: the result differs from torchvision, and equals torchvision on boxes moved by
``0.5 / spatial_scale - 0.5`` pixels, which is why the map is needed.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
import torchvision
from tvm.relax.frontend.onnx import from_onnx as upstream_from_onnx
from tvm.relax.frontend.torch import from_exported_program as upstream_from_exported_program

import tvm_roialign  # noqa: F401  (registers on import)
from tvm_roialign.frontend import convert_map, from_onnx
from tvm_roialign.testing import compile_and_run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

SPATIAL_SCALE = 0.25  # any scale but 1 shows the stock converters' shift
# (batch, x1, y1, x2, y2) in input-image pixels (the image is 4x the 16x16 map)
ROIS = np.array(
    [
        [0, 4.0, 6.0, 40.0, 50.0],
        [0, 10.0, 3.0, 30.0, 60.0],
        [0, 0.0, 0.0, 63.0, 63.0],
        [0, 20.5, 12.25, 44.0, 33.0],
    ],
    dtype=np.float32,
)


class Pool(torch.nn.Module):
    def forward(self, x, rois):
        return torchvision.ops.roi_align(
            x, rois, (3, 3), spatial_scale=SPATIAL_SCALE, sampling_ratio=2, aligned=True
        )


@pytest.fixture(scope="module")
def inputs():
    x = np.random.default_rng(0).random((1, 4, 16, 16), dtype=np.float32)
    return torch.from_numpy(x), torch.from_numpy(ROIS)


@pytest.fixture(scope="module")
def torchvision_out(inputs):
    return Pool()(*inputs).numpy()


@pytest.fixture(scope="module")
def stock_reading(inputs):
    """torchvision on boxes moved as TVM's converters move them: ``(x - 0.5) * s`` is
    ``(x + 0.5 / s - 0.5) * s - 0.5``."""
    x, rois = inputs
    moved = rois.clone()
    moved[:, 1:] += 0.5 / SPATIAL_SCALE - 0.5
    return Pool()(x, moved).numpy()


@pytest.fixture(scope="module")
def exported(inputs):
    return torch.export.export(Pool(), inputs)


@pytest.fixture(scope="module")
def onnx_model(inputs):
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Pool(), inputs, buffer, input_names=["x", "rois"], opset_version=16, dynamo=False)
    return onnx.load_from_string(buffer.getvalue())


def _run(mod, inputs):
    out = compile_and_run(mod, [t.numpy() for t in inputs])
    return out[0] if isinstance(out, list) else out


def test_torch_export_with_the_map_equals_torchvision(exported, inputs, torchvision_out, tol):
    mod = upstream_from_exported_program(exported, custom_convert_map=convert_map())
    np.testing.assert_allclose(_run(mod, inputs), torchvision_out, rtol=tol["float32"], atol=tol["float32"])


def test_torch_export_without_the_map_is_shifted(exported, inputs, torchvision_out, stock_reading, tol):
    out = _run(upstream_from_exported_program(exported), inputs)
    assert np.abs(out - torchvision_out).max() > 1e-2
    np.testing.assert_allclose(out, stock_reading, rtol=tol["float32"], atol=tol["float32"])


def test_onnx_package_importer_equals_torchvision(onnx_model, inputs, torchvision_out, tol):
    np.testing.assert_allclose(
        _run(from_onnx(onnx_model), inputs), torchvision_out, rtol=tol["float32"], atol=tol["float32"]
    )


def test_onnx_upstream_importer_is_shifted(onnx_model, inputs, torchvision_out, stock_reading, tol):
    out = _run(upstream_from_onnx(onnx_model), inputs)
    assert np.abs(out - torchvision_out).max() > 1e-2
    np.testing.assert_allclose(out, stock_reading, rtol=tol["float32"], atol=tol["float32"])
