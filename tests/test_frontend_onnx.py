"""ONNX RoiAlign import (issue 4): opsets 10, 16 and 22 vs onnxruntime (avg) and onnx.reference
(avg and max), the issue's examples, int32 batch indices, clear errors, and the converter table
restored after every call.

Each opset is one ONNX model holding every attribute combination as its own RoiAlign node, so
that it is imported and compiled once.
"""

from __future__ import annotations

import functools
import itertools
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from tvm.relax.frontend.onnx import onnx_frontend

from tvm_roialign.frontend import from_onnx
from tvm_roialign.frontend.onnx import RoiAlignConverter
from tvm_roialign.testing import compile_and_run, compiled, roi_align_ref

# the graphs leave output shapes to inference; onnx's checker (run by TVM's importer) warns
pytestmark = pytest.mark.filterwarnings("ignore:Field 'shape' of 'type':UserWarning")
DATA_SHAPE = (2, 3, 10, 12)
# (x1, y1, x2, y2) in input-image pixels and the batch index of each; the image is 4x the map.
ROIS = np.array(
    [
        [0.0, 0.0, 47.0, 39.0],
        [5.3, 7.9, 21.1, 30.6],
        [10.0, 10.0, 11.0, 10.5],  # smaller than a feature pixel
        [-12.0, 30.0, 60.0, 55.0],  # past the borders
        [44.2, 36.7, 47.9, 39.9],
        [3.0, 1.0, 3.0, 9.0],  # zero width
    ],
    dtype=np.float32,
)
BATCH = np.array([0, 1, 1, 0, 1, 0], dtype=np.int64)


def _combos(opset):
    """Attribute sets of the RoiAlign nodes of the model at ``opset``."""
    transforms = [None] if opset < 16 else [None, "half_pixel", "output_half_pixel"]
    combos = []
    for transform, mode, sampling, scale, size in itertools.product(
        transforms, ("avg", "max"), (0, 2), (0.25, 1.0), ((2, 3),)
    ):
        attrs = {
            "mode": mode,
            "output_height": size[0],
            "output_width": size[1],
            "sampling_ratio": sampling,
            "spatial_scale": scale,
        }
        if transform is not None:
            attrs["coordinate_transformation_mode"] = transform
        combos.append(attrs)
    return combos


def _model(
    opset, combos, index_type=TensorProto.INT64, data_shape=DATA_SHAPE, num_rois=None
):
    num_rois = len(ROIS) if num_rois is None else num_rois
    nodes = [
        helper.make_node(
            "RoiAlign", ["X", "rois", "batch_indices"], [f"Y{i}"], name=f"ra{i}", **a
        )
        for i, a in enumerate(combos)
    ]
    graph = helper.make_graph(
        nodes,
        "roialign",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, list(data_shape)),
            helper.make_tensor_value_info("rois", TensorProto.FLOAT, [num_rois, 4]),
            helper.make_tensor_value_info("batch_indices", index_type, [num_rois]),
        ],
        [
            helper.make_tensor_value_info(f"Y{i}", TensorProto.FLOAT, None)
            for i in range(len(nodes))
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset)],
        producer_name="tvm-roialign-tests",
    )
    model.ir_version = 8
    return model


def _opsets(*opsets):
    """``opsets`` as parameters, the tests of each opset on one xdist worker (``--dist
    loadgroup``), so that :func:`_case` compiles it once per session, not once per worker."""
    return [pytest.param(o, marks=pytest.mark.xdist_group(f"onnx_opset{o}")) for o in opsets]


@functools.cache
def _case(opset):
    """(model, combos, inputs, TVM outputs) for ``opset``, compiled once."""
    rng = np.random.default_rng(opset)
    data = rng.standard_normal(DATA_SHAPE).astype(np.float32)
    combos = _combos(opset)
    model = _model(opset, combos)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = from_onnx(model)
    inputs = [data, ROIS, BATCH]
    outputs = compile_and_run(mod, inputs)
    return model, combos, inputs, outputs


def _reference_model(opset, combos):
    """The model for onnx.reference: its RoiAlign applies the opset-16 default (half_pixel) at
    every opset, so the opset-10 meaning (output_half_pixel) is spelled out in an opset-16 twin."""
    if opset >= 16:
        return _model(opset, combos)
    return _model(
        16,
        [{**a, "coordinate_transformation_mode": "output_half_pixel"} for a in combos],
    )


@pytest.mark.parametrize("opset", _opsets(10, 16, 22))
def test_against_onnx_reference(opset, tol):
    _, combos, inputs, outputs = _case(opset)
    expected = ReferenceEvaluator(_reference_model(opset, combos)).run(
        None, dict(zip(["X", "rois", "batch_indices"], inputs))
    )
    assert len(outputs) == len(expected) == len(combos)
    for attrs, got, want in zip(combos, outputs, expected):
        np.testing.assert_allclose(got, want, rtol=0, atol=tol["float32"], err_msg=str(attrs))


@pytest.mark.parametrize("opset", _opsets(10, 16, 22))
def test_avg_against_onnxruntime(opset, tol):
    ort = pytest.importorskip("onnxruntime")
    model, combos, inputs, outputs = _case(opset)
    if opset >= 22:  # onnxruntime has no RoiAlign-22 kernel; 22 only adds types to 16
        model = _model(16, combos)
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    expected = session.run(None, dict(zip(["X", "rois", "batch_indices"], inputs)))
    checked = 0
    for attrs, got, want in zip(combos, outputs, expected):
        if attrs["mode"] == "avg":
            np.testing.assert_allclose(got, want, rtol=0, atol=tol["float32"], err_msg=str(attrs))
            checked += 1
    assert checked == len(combos) // 2


@pytest.mark.parametrize("opset", _opsets(16, 22))
def test_half_pixel_is_default_and_shifts_after_scaling(opset, tol):
    """Absent attribute == half_pixel at opset 16+, and half_pixel is torchvision's aligned=True
    (shift by 0.5 after scaling), checked against the float64 reference too."""
    _, combos, inputs, outputs = _case(opset)
    by_key = {}
    for attrs, out in zip(combos, outputs):
        key = (attrs["mode"], attrs["sampling_ratio"], attrs["spatial_scale"])
        by_key.setdefault(key, {})[attrs.get("coordinate_transformation_mode")] = out
    for (mode, sampling, scale), outs in by_key.items():
        np.testing.assert_array_equal(outs[None], outs["half_pixel"])
        rois5 = np.concatenate([BATCH[:, None].astype(np.float32), ROIS], axis=1)
        for transform, half in (("half_pixel", True), ("output_half_pixel", False)):
            want = roi_align_ref(
                inputs[0],
                rois5,
                (2, 3),
                scale,
                sampling,
                aligned=half,
                mode="onnx_max" if mode == "max" else "avg",
                half_pixel=half,
            )
            np.testing.assert_allclose(outs[transform], want, rtol=0, atol=tol["float32"])


def _single(opset, attrs, data, rois, batch, index_type=TensorProto.INT64):
    model = _model(opset, [attrs], index_type, data.shape, len(rois))
    out = compile_and_run(from_onnx(model), [data, rois, batch])
    return out[0] if isinstance(out, list) else out


def test_issue_examples(tol):
    """data arange(16) 4x4, roi (0,0,8,8), scale 0.5, 1x1, sampling 1: 7.5 with half_pixel
    (torchvision aligned=True; stock TVM gives 8.75), 10 at opset 10. ONNX max of [[1,2],[3,4]]
    over (0,0,1,1) is 1.0 (stock TVM: 2.5)."""
    data = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    rois = np.array([[0, 0, 8, 8]], np.float32)
    batch = np.array([0], np.int64)
    attrs = {
        "output_height": 1,
        "output_width": 1,
        "sampling_ratio": 1,
        "spatial_scale": 0.5,
    }
    assert _single(16, attrs, data, rois, batch).item() == pytest.approx(7.5, abs=tol["float32"])
    assert _single(10, attrs, data, rois, batch).item() == pytest.approx(10.0, abs=tol["float32"])
    small = np.array([[1, 2], [3, 4]], np.float32).reshape(1, 1, 2, 2)
    attrs = {"output_height": 1, "output_width": 1, "sampling_ratio": 1, "mode": "max"}
    box = np.array([[0, 0, 1, 1]], np.float32)
    got = _single(16, attrs, small, box, batch)
    want = ReferenceEvaluator(
        _model(16, [attrs], data_shape=(1, 1, 2, 2), num_rois=1)
    ).run(None, {"X": small, "rois": box, "batch_indices": batch})[0]
    assert got.item() == pytest.approx(1.0, abs=tol["float32"])
    np.testing.assert_allclose(got, want, atol=tol["float32"])


def test_int32_batch_indices(tol):
    rng = np.random.default_rng(3)
    data = rng.standard_normal(DATA_SHAPE).astype(np.float32)
    attrs = {
        "output_height": 3,
        "output_width": 2,
        "sampling_ratio": 0,
        "spatial_scale": 0.25,
    }
    got = _single(16, attrs, data, ROIS, BATCH.astype(np.int32), TensorProto.INT32)
    want = ReferenceEvaluator(_model(16, [attrs])).run(
        None, {"X": data, "rois": ROIS, "batch_indices": BATCH}
    )[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=tol["float32"])


def test_mode_override_for_unlabelled_models():
    """roi_align_coordinate_transformation_mode applies to nodes without the attribute only."""
    data = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    rois = np.array([[0, 0, 8, 8]], np.float32)
    attrs = {
        "output_height": 1,
        "output_width": 1,
        "sampling_ratio": 1,
        "spatial_scale": 0.5,
    }
    model = _model(
        18,
        [attrs, {**attrs, "coordinate_transformation_mode": "half_pixel"}],
        data_shape=(1, 1, 4, 4),
        num_rois=1,
    )
    mod = from_onnx(model, roi_align_coordinate_transformation_mode="output_half_pixel")
    plain, explicit = compile_and_run(mod, [data, rois, np.array([0], np.int64)])
    assert plain.item() == pytest.approx(10.0) and explicit.item() == pytest.approx(7.5)


def _assert_stock_table():
    assert onnx_frontend._get_convert_map()["RoiAlign"] is onnx_frontend.RoiAlign


@pytest.mark.xdist_group("onnx_opset10")  # _case(10): the same worker as the opset-10 tests
def test_converter_table_restored():
    _case(10)
    _assert_stock_table()
    bad = _model(16, [{"sampling_ratio": -1}])
    with pytest.raises(ValueError, match="sampling_ratio"):
        from_onnx(bad)
    _assert_stock_table()
    assert RoiAlignConverter.get_converter(22).__name__ == "_impl_v16"
    assert RoiAlignConverter.get_converter(10).__name__ == "_impl_v10"


@pytest.mark.parametrize(
    "attrs, error, match",
    [
        ({"sampling_ratio": -1}, ValueError, "sampling_ratio must be >= 0"),
        ({"mode": "median"}, ValueError, "mode must be 'avg' or 'max'"),
        ({"output_height": 0}, ValueError, "output_height and output_width"),
        ({"spatial_scale": -0.5}, ValueError, "spatial_scale"),
        (
            {"coordinate_transformation_mode": "asymmetric"},
            ValueError,
            "coordinate_transformation_mode must be one of",
        ),
        ({"position_sensitive": 1}, NotImplementedError, "position-sensitive RoIAlign"),
        ({"pooled_size": 3}, NotImplementedError, "unknown attribute"),
    ],
)
def test_bad_attributes(attrs, error, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error, match=match):
            from_onnx(_model(16, [attrs]))


def test_position_sensitive_variant_refused():
    node = helper.make_node(
        "PSRoIAlign", ["X", "rois"], ["Y"], domain="mxnet", name="psroi", output_dim=2
    )
    graph = helper.make_graph(
        [node],
        "ps",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 8, 4, 4]),
            helper.make_tensor_value_info("rois", TensorProto.FLOAT, [1, 5]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 16), helper.make_opsetid("mxnet", 1)],
    )
    with pytest.raises(NotImplementedError, match="position-sensitive"):
        from_onnx(model)


def test_bad_inputs():
    attrs = {"output_height": 2, "output_width": 2}
    bad_index = _model(16, [attrs], TensorProto.FLOAT)
    with pytest.raises(TypeError, match="batch_indices must be int64"):
        from_onnx(bad_index)
    with pytest.raises(ValueError, match="roi_align_coordinate_transformation_mode"):
        from_onnx(_model(16, [attrs]), roi_align_coordinate_transformation_mode="half")


def test_unlabelled_model_warns():
    model = _model(16, [{"output_height": 1, "output_width": 1}])
    model.producer_name = ""
    with pytest.warns(UserWarning, match="no coordinate_transformation_mode"):
        from_onnx(model)
    assert isinstance(model, onnx.ModelProto)


def test_symbolic_number_of_rois(tol):
    attrs = {"output_height": 2, "output_width": 2, "spatial_scale": 0.25}
    model = _model(16, [attrs])
    for value_info in model.graph.input[1:]:  # rois [K, 4] and batch_indices [K]
        value_info.type.tensor_type.shape.dim[0].dim_param = "K"
    mod = from_onnx(model)
    rng = np.random.default_rng(5)
    data = rng.standard_normal(DATA_SHAPE).astype(np.float32)
    run = compiled(mod)  # one build for both counts
    for count in (6, 2):
        feeds = {"X": data, "rois": ROIS[:count], "batch_indices": BATCH[:count]}
        got = run(list(feeds.values()))
        want = ReferenceEvaluator(model).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=tol["float32"])
