"""ONNX graphs that TVM's importer cannot read as exported (tvm_roialign/frontend/_onnx_static.py):
imported, compiled and compared with onnxruntime."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from _functions import FunctionModule

from tvm_roialign.frontend import from_onnx
from tvm_roialign.testing import compile_and_run

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

#: name -> function of x [2, 4, 6, 6]
CASES = {
    "reduce_max_every_axis": lambda x: torch.amax(x),  # ReduceMax with an empty axes list
    "sort": lambda x: torch.sort(x, dim=1, descending=True).values,  # TopK's k = Gather(Shape(x))
    "topk_of_a_dimension": lambda x: torch.topk(x, x.shape[2] // 2, dim=2).indices,
}



@pytest.mark.parametrize("name", sorted(CASES))
def test_graph_equals_onnxruntime(name):
    x = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(0))
    buffer = io.BytesIO()
    torch.onnx.export(FunctionModule(CASES[name]), (x,), buffer, dynamo=False, opset_version=17,
                      input_names=["x"])
    model = onnx.load_from_string(buffer.getvalue())
    before = model.SerializeToString()
    expected = ort.InferenceSession(buffer.getvalue()).run(None, {"x": x.numpy()})[0]
    got = compile_and_run(from_onnx(model, {"x": [2, 4, 6, 6]}), [x.numpy()])
    assert model.SerializeToString() == before  # the caller's model is not changed
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
