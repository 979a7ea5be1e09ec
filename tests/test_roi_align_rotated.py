"""``relax.vision.roi_align_rotated`` against OpenVINO's ``ROIAlignRotated`` (opset 15, radians, both
``clockwise_mode`` values, within 1e-5) and the float64 reference
(``tvm_roialign.testing.roi_align_rotated_ref``, within 1e-6 on a smooth map, 1e-9 in float64) in
detectron2's (degrees, aligned) and mmcv's (radians, clockwise, aligned=False) conventions, both
layouts, static and adaptive grids, the generic llvm and the native (x86) strategies: random rotated
boxes (angles 0, 90, 180, negative, boxes partly outside the map), degenerate, NaN and
out-of-range-batch boxes, a bounded fuzz, argument errors and registration.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import tvm
from _targets import GENERIC as HOST
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import tvm_roialign
from tvm_roialign import _registry
from tvm_roialign.ops.roi_align_rotated import OP_NAME
from tvm_roialign.testing import roi_align_rotated_ref, single_op_module, smooth_data

NATIVE = tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
N, C, H, W = 2, 8, 14, 18
POOLED = (3, 4)
K = 16
SCALE = 0.25
REF_TOL = 1e-6
RADIANS = {"angle_unit": "radians"}
DETECTRON2 = {"angle_unit": "degrees", "clockwise": False, "aligned": True}


@functools.cache
def _vm(layout, sampling_ratio, aligned=True, clockwise=False, angle_unit="radians",
        target_key="native", dtype="float32", num_rois=K):
    shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
    mod = single_op_module(
        lambda d, r: tvm_roialign.roi_align_rotated(
            d, r, POOLED, spatial_scale=SCALE, sampling_ratio=sampling_ratio, aligned=aligned,
            layout=layout, clockwise=clockwise, angle_unit=angle_unit,
        ),
        data=(shape, dtype),
        rois=((num_rois, 6), dtype),
    )
    target = NATIVE if target_key == "native" else HOST
    return relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())


def _run(vm, data_nchw, rois, layout):
    data = data_nchw if layout == "NCHW" else data_nchw.transpose(0, 2, 3, 1)
    out = vm["main"](tvm.runtime.tensor(np.ascontiguousarray(data)), tvm.runtime.tensor(rois))
    out = out.numpy()
    return out if layout == "NCHW" else out.transpose(0, 3, 1, 2)


def _random_rois(rng, degrees=False, count=K, dtype="float32"):
    """Rotated boxes in image pixels (the map covers 56 x 72 at scale 0.25), some partly outside;
    the first angles are 0, 90, 180, -90 and -45 degrees."""
    batch = rng.integers(0, N, count)
    centre = rng.uniform(-10, 80, (count, 2))
    size = rng.uniform(2, 60, (count, 2))
    angle = rng.uniform(-math.pi, math.pi, count)
    angle[:5] = np.array([0, 90, 180, -90, -45]) * math.pi / 180
    if degrees:
        angle = angle * 180 / math.pi
    return np.concatenate([batch[:, None], centre, size, angle[:, None]], 1).astype(dtype)


def _openvino(data, rois, sampling_ratio, clockwise):
    ov = pytest.importorskip("openvino")
    opset = pytest.importorskip("openvino.opset15")
    count = rois.shape[0]
    feats = opset.parameter(list(data.shape), ov.Type.f32)
    boxes = opset.parameter([count, 5], ov.Type.f32)
    batch = opset.parameter([count], ov.Type.i32)
    node = opset.roi_align_rotated(feats, boxes, batch, POOLED[0], POOLED[1], sampling_ratio,
                                   SCALE, clockwise)
    model = ov.Core().compile_model(ov.Model([node], [feats, boxes, batch]), "CPU",
                                    {"INFERENCE_PRECISION_HINT": "f32"})
    return model([data, np.ascontiguousarray(rois[:, 1:]), rois[:, 0].astype("int32")])[0]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("sampling_ratio", [2, 0])
@pytest.mark.parametrize("clockwise", [False, True])
def test_matches_openvino(rng, layout, sampling_ratio, clockwise):
    data = rng.standard_normal((N, C, H, W)).astype("float32")
    rois = _random_rois(rng)
    expected = _openvino(data, rois, sampling_ratio, clockwise)
    out = _run(_vm(layout, sampling_ratio, clockwise=clockwise), data, rois, layout)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("sampling_ratio", [2, 0])
def test_generic_llvm_matches_openvino(rng, layout, sampling_ratio):
    """The TE path (the native target's adaptive grids take the hand-scheduled kernel)."""
    data = rng.standard_normal((N, C, H, W)).astype("float32")
    rois = _random_rois(rng)
    out = _run(_vm(layout, sampling_ratio, target_key="llvm"), data, rois, layout)
    np.testing.assert_allclose(out, _openvino(data, rois, sampling_ratio, False), rtol=0,
                               atol=1e-5)


CONVENTION_CASES = [
    ("detectron2", DETECTRON2, True),
    ("mmcv_aligned_clockwise", {"angle_unit": "radians", "clockwise": True, "aligned": True}, False),
    ("mmcv_unaligned", {"angle_unit": "radians", "clockwise": False, "aligned": False}, False),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("sampling_ratio", [2, -1])
@pytest.mark.parametrize(("name", "convention", "degrees"), CONVENTION_CASES,
                         ids=[c[0] for c in CONVENTION_CASES])
def test_conventions_match_float64_reference(rng, layout, sampling_ratio, name, convention,
                                             degrees):
    data = smooth_data((N, C, H, W))
    rois = _random_rois(rng, degrees=degrees)
    rois[5, 3:5] = [0.5, 2.0]  # below 1 after scaling: clamped unless aligned
    out = _run(_vm(layout, sampling_ratio, **convention), data, rois, layout)
    expected = roi_align_rotated_ref(data, rois, POOLED, SCALE, sampling_ratio, **convention)
    np.testing.assert_allclose(out, expected, rtol=0, atol=REF_TOL)


def test_degrees_equal_radians():
    rng = np.random.default_rng(1)
    data = smooth_data((N, C, H, W))
    rois = _random_rois(rng, degrees=True)
    radians = rois.copy()
    radians[:, 5] = (rois[:, 5].astype("float64") * math.pi / 180).astype("float32")
    out_deg = _run(_vm("NHWC", 2, angle_unit="degrees"), data, rois, "NHWC")
    out_rad = _run(_vm("NHWC", 2), data, radians, "NHWC")
    np.testing.assert_allclose(out_deg, out_rad, rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float64_matches_reference(rng, layout, tol):
    data = rng.standard_normal((N, C, H, W))
    rois = _random_rois(rng, degrees=True, dtype="float64")
    out = _run(_vm(layout, -1, angle_unit="degrees", dtype="float64"), data, rois, layout)
    expected = roi_align_rotated_ref(data, rois, POOLED, SCALE, -1, **DETECTRON2)
    np.testing.assert_allclose(out, expected, rtol=0, atol=tol["float64"])


def test_float16_keeps_dtype(rng, tol):
    data = smooth_data((N, C, H, W)).astype("float16")
    rois = _random_rois(rng).astype("float16")
    out = _run(_vm("NHWC", 2, dtype="float16"), data, rois, "NHWC")
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, roi_align_rotated_ref(data, rois, POOLED, SCALE, 2, **RADIANS),
                               rtol=0, atol=tol["float16"])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("sampling_ratio", [2, 0])
def test_degenerate_nan_and_bad_batch_boxes(rng, layout, sampling_ratio):
    data = smooth_data((N, C, H, W))
    rois = _random_rois(rng)
    rois[0, 3:5] = 0  # zero size
    rois[1, 3:5] = [-8, -4]  # negative size
    rois[2, 1] = np.nan
    rois[3, 5] = np.inf  # angle
    rois[4, 4] = -np.inf
    rois[5, 0] = N  # batch index past the end
    rois[6, 0] = -1
    rois[7, 0] = np.nan
    out = _run(_vm(layout, sampling_ratio), data, rois, layout)
    assert np.isfinite(out).all()
    assert not out[2:8].any()
    if sampling_ratio == 0:
        assert not out[:2].any()  # an empty adaptive grid gives 0
    expected = roi_align_rotated_ref(data, rois, POOLED, SCALE, sampling_ratio, **RADIANS)
    np.testing.assert_allclose(out, expected, rtol=0, atol=REF_TOL)
    np.testing.assert_allclose(out[8:], _openvino(data, rois[8:], sampling_ratio, False),
                               rtol=0, atol=1e-5)


coordinate = st.floats(-20, 90, allow_nan=False, width=32)
size = st.floats(-5, 70, allow_nan=False, width=32)
angle = st.one_of(st.sampled_from([0.0, math.pi / 2, math.pi, -math.pi / 2]),
                  st.floats(-7, 7, allow_nan=False, width=32))
box = st.tuples(st.integers(0, N - 1), coordinate, coordinate, size, size, angle)
FUZZ_ROIS = 4


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    layout=st.sampled_from(["NCHW", "NHWC"]),
    sampling_ratio=st.sampled_from([0, 1, 2]),
    clockwise=st.booleans(),
    boxes=st.lists(box, min_size=FUZZ_ROIS, max_size=FUZZ_ROIS),
    special=st.none() | st.tuples(st.integers(0, FUZZ_ROIS - 1), st.integers(0, 5),
                                  st.sampled_from([np.nan, np.inf, -np.inf, 7.0])),
)
def test_fuzz(layout, sampling_ratio, clockwise, boxes, special):
    rois = np.array(boxes, "float32")
    if special is not None:
        rois[special[0], special[1]] = special[2]
    data = smooth_data((N, C, H, W))
    out = _run(_vm(layout, sampling_ratio, clockwise=clockwise, num_rois=FUZZ_ROIS), data, rois,
               layout)
    assert np.isfinite(out).all()
    expected = roi_align_rotated_ref(data, rois, POOLED, SCALE, sampling_ratio,
                                     clockwise=clockwise, **RADIANS)
    np.testing.assert_allclose(out, expected, rtol=0, atol=REF_TOL)
    # OpenVINO where its result is defined: finite rois, a batch index in [0, N), sizes >= 0
    defined = [k for k, roi in enumerate(rois)
               if 0 <= roi[0] < N and np.isfinite(roi).all() and (roi[3:5] >= 0).all()]
    if defined:
        np.testing.assert_allclose(out[defined], _openvino(data, rois[defined], sampling_ratio,
                                                           clockwise), rtol=0, atol=1e-5)


def _normalize(data_shape, rois_shape, layout="NCHW", angle_unit="degrees", dtype="float32"):
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType(list(data_shape), dtype))
    rois = relax.Var("rois", relax.TensorType(list(rois_shape), dtype))
    with bb.function("main", [data, rois]):
        out = bb.emit(tvm_roialign.roi_align_rotated(data, rois, POOLED, spatial_scale=1.0,
                                                     sampling_ratio=2, angle_unit=angle_unit,
                                                     layout=layout))
        bb.emit_func_output(out)
    return bb.get()["main"].ret_ty


def test_struct_info():
    assert [int(d) for d in _normalize((1, 8, 9, 9), (7, 6)).shape] == [7, 8, 3, 4]
    assert [int(d) for d in _normalize((1, 9, 9, 8), (7, 6), layout="NHWC").shape] == [7, 3, 4, 8]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"data_shape": (1, 8, 9, 9), "rois_shape": (7, 5)}, "rois must be \\[K, 6\\]"),
        ({"data_shape": (8, 9, 9), "rois_shape": (7, 6)}, "data must be 4-D"),
        ({"data_shape": (1, 8, 9, 9), "rois_shape": (7, 6), "angle_unit": "turns"},
         "angle_unit must be one of"),
        ({"data_shape": (1, 8, 9, 9), "rois_shape": (7, 6), "layout": "HWCN"}, "layout must be"),
        ({"data_shape": (1, 8, 9, 9), "rois_shape": (7, 6), "dtype": "int32"}, "data dtype"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        _normalize(**kwargs)


def test_registration_is_reversible():
    assert _registry.get_op_attr(OP_NAME, "FLegalize") is not None
    tvm_roialign.unregister()
    try:
        for attr in ("FLegalize", "FInferType", "FRelaxInferLayout"):
            assert _registry.get_op_attr(OP_NAME, attr) is None, attr
    finally:
        tvm_roialign.register()
    assert _registry.get_op_attr(OP_NAME, "FRelaxInferLayout") is not None
