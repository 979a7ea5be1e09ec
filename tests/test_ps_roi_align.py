"""``relax.vision.ps_roi_align`` against torchvision's ``ps_roi_align`` (within 1e-5) and the float64
reference (``tvm_roialign.testing.ps_roi_align_ref``, within 1e-6 on a smooth map, 1e-9 in float64),
both layouts, static and adaptive grids, the generic llvm and the native (x86) strategies; degenerate,
NaN and out-of-range-batch boxes; a bounded fuzz; argument errors; registration.

torchvision divides by the grid size without ``max(., 1)``: an empty adaptive grid (a zero-size or
inverted box) gives NaN there and 0 here (RoIAlign's contract), so such boxes are compared with the
reference only.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torchvision
import tvm
from _targets import GENERIC as HOST
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import tvm_roialign
from tvm_roialign import _registry
from tvm_roialign.ops.ps_roi_align import OP_NAME
from tvm_roialign.testing import ps_roi_align_ref, single_op_module, smooth_data

NATIVE = tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
N, C_OUT, H, W = 2, 4, 14, 18
POOLED = (3, 2)
C_IN = C_OUT * POOLED[0] * POOLED[1]
K = 12
SCALE = 0.25
REF_TOL = 1e-6


@functools.cache
def _vm(layout, sampling_ratio, target_key="native", dtype="float32", num_rois=K, scale=SCALE):
    shape = (N, C_IN, H, W) if layout == "NCHW" else (N, H, W, C_IN)
    mod = single_op_module(
        lambda d, r: tvm_roialign.ps_roi_align(
            d, r, POOLED, spatial_scale=scale, sampling_ratio=sampling_ratio, layout=layout),
        data=(shape, dtype),
        rois=((num_rois, 5), dtype),
    )
    target = NATIVE if target_key == "native" else HOST
    return relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())


def _run(vm, data_nchw, rois, layout):
    data = data_nchw if layout == "NCHW" else data_nchw.transpose(0, 2, 3, 1)
    out = vm["main"](tvm.runtime.tensor(np.ascontiguousarray(data)), tvm.runtime.tensor(rois))
    out = out.numpy()
    return out if layout == "NCHW" else out.transpose(0, 3, 1, 2)


def _random_rois(rng, count=K, dtype="float32"):
    """Boxes in image pixels (the map covers 56 x 72 at scale 0.25), some partly outside."""
    batch = rng.integers(0, N, count)
    corner = rng.uniform(-20, 70, (count, 2))
    size = rng.uniform(0.5, 40, (count, 2))
    return np.concatenate([batch[:, None], corner, corner + size], 1).astype(dtype)


def _torchvision(data, rois, sampling_ratio, scale=SCALE):
    return torchvision.ops.ps_roi_align(
        torch.from_numpy(data), torch.from_numpy(rois), POOLED, scale, sampling_ratio
    ).numpy()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("sampling_ratio", [2, -1])
@pytest.mark.parametrize("target_key", ["native", "llvm"])
def test_matches_torchvision(rng, layout, sampling_ratio, target_key):
    """Every CPU path: the TE schedule (static grid; adaptive on generic llvm) and the native
    target's hand-scheduled adaptive-grid kernel."""
    data = rng.standard_normal((N, C_IN, H, W)).astype("float32")
    rois = _random_rois(rng)
    out = _run(_vm(layout, sampling_ratio, target_key), data, rois, layout)
    expected = _torchvision(data, rois, sampling_ratio)
    assert out.shape == (K, C_OUT, *POOLED)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("sampling_ratio", [2, 0])
def test_matches_float64_reference(rng, layout, sampling_ratio):
    data = smooth_data((N, C_IN, H, W))
    rois = _random_rois(rng)
    out = _run(_vm(layout, sampling_ratio), data, rois, layout)
    expected = ps_roi_align_ref(data, rois, POOLED, SCALE, sampling_ratio)
    np.testing.assert_allclose(out, expected, rtol=0, atol=REF_TOL)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float64_matches_reference(rng, layout, tol):
    data = rng.standard_normal((N, C_IN, H, W))
    rois = _random_rois(rng, dtype="float64")
    out = _run(_vm(layout, -1, dtype="float64"), data, rois, layout)
    np.testing.assert_allclose(out, ps_roi_align_ref(data, rois, POOLED, SCALE, -1),
                               rtol=0, atol=tol["float64"])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float16_keeps_dtype(rng, layout, tol):
    data = smooth_data((N, C_IN, H, W))
    rois = _random_rois(rng)
    out = _run(_vm(layout, 2, dtype="float16"), data.astype("float16"), rois.astype("float16"),
               layout)
    assert out.dtype == np.float16
    expected = ps_roi_align_ref(data.astype("float16"), rois.astype("float16"), POOLED, SCALE, 2)
    np.testing.assert_allclose(out, expected, rtol=0, atol=tol["float16"])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("sampling_ratio", [2, -1])
def test_degenerate_nan_and_bad_batch_boxes(rng, layout, sampling_ratio):
    data = smooth_data((N, C_IN, H, W))
    rois = _random_rois(rng)
    rois[0, 1:] = [40, 40, 40, 40]  # zero size
    rois[1, 1:] = [50, 50, 30, 20]  # inverted
    rois[2, 3] = np.nan
    rois[3, 1] = np.inf
    rois[4, 0] = N  # batch index past the end
    rois[5, 0] = -1
    rois[6, 0] = np.nan
    out = _run(_vm(layout, sampling_ratio), data, rois, layout)
    assert np.isfinite(out).all()
    assert not out[2:7].any()
    np.testing.assert_allclose(out, ps_roi_align_ref(data, rois, POOLED, SCALE, sampling_ratio),
                               rtol=0, atol=REF_TOL)
    if sampling_ratio > 0:  # torchvision is defined on the degenerate boxes with a static grid
        np.testing.assert_allclose(out[:2], _torchvision(data, rois[:2], sampling_ratio),
                                   rtol=0, atol=1e-5)


coordinate = st.floats(-30, 90, allow_nan=False, width=32)
box = st.tuples(st.integers(0, N - 1), coordinate, coordinate, coordinate, coordinate)
FUZZ_ROIS = 4


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    layout=st.sampled_from(["NCHW", "NHWC"]),
    sampling_ratio=st.sampled_from([-1, 1, 2]),
    boxes=st.lists(box, min_size=FUZZ_ROIS, max_size=FUZZ_ROIS),
    special=st.none() | st.tuples(st.integers(0, FUZZ_ROIS - 1), st.integers(0, 4),
                                  st.sampled_from([np.nan, np.inf, -np.inf, 5.0])),
)
def test_fuzz(layout, sampling_ratio, boxes, special):
    rois = np.array(boxes, "float32")
    if special is not None:
        rois[special[0], special[1]] = special[2]
    data = smooth_data((N, C_IN, H, W))
    out = _run(_vm(layout, sampling_ratio, num_rois=FUZZ_ROIS), data, rois, layout)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ps_roi_align_ref(data, rois, POOLED, SCALE, sampling_ratio),
                               rtol=0, atol=REF_TOL)
    for k, roi in enumerate(rois):  # torchvision where its result is defined
        defined = 0 <= roi[0] < N and np.isfinite(roi).all()
        nonempty = sampling_ratio > 0 or (roi[3] > roi[1] and roi[4] > roi[2])
        if defined and nonempty:
            np.testing.assert_allclose(out[k], _torchvision(data, rois[k:k + 1], sampling_ratio)[0],
                                       rtol=0, atol=1e-5)


def _normalize(data_shape, rois_shape, pooled=POOLED, layout="NCHW", dtype="float32",
               rois_dtype="float32"):
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType(list(data_shape), dtype))
    rois = relax.Var("rois", relax.TensorType(list(rois_shape), rois_dtype))
    with bb.function("main", [data, rois]):
        out = bb.emit(tvm_roialign.ps_roi_align(
            data, rois, pooled, spatial_scale=1.0, sampling_ratio=2, layout=layout))
        bb.emit_func_output(out)
    return bb.get()["main"].ret_ty


def test_struct_info():
    assert [int(d) for d in _normalize((1, 24, 8, 8), (7, 5)).shape] == [7, 4, 3, 2]
    assert [int(d) for d in _normalize((1, 8, 8, 24), (7, 5), layout="NHWC").shape] == [7, 3, 2, 4]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"data_shape": (1, 25, 8, 8), "rois_shape": (7, 5)}, "multiple of PH \\* PW = 6"),
        ({"data_shape": (1, 24, 8, 8), "rois_shape": (7, 4)}, "rois must be \\[K, 5\\]"),
        ({"data_shape": (24, 8, 8), "rois_shape": (7, 5)}, "data must be 4-D"),
        ({"data_shape": (1, 24, 8, 8), "rois_shape": (7, 5), "layout": "NCWH"}, "layout must be"),
        ({"data_shape": (1, 24, 8, 8), "rois_shape": (7, 5), "rois_dtype": "float16"},
         "rois dtype"),
    ],
)
def test_bad_arguments_raise_one_line(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        _normalize(**kwargs)


def test_bad_pooled_size():
    with pytest.raises(ValueError, match="pooled_size must be"):
        tvm_roialign.ps_roi_align(relax.Var("d"), relax.Var("r"), (0, 2))


def test_registration_is_reversible():
    assert _registry.get_op_attr(OP_NAME, "FLegalize") is not None
    tvm_roialign.unregister()
    try:
        for attr in ("FLegalize", "FInferType", "FRelaxInferLayout"):
            assert _registry.get_op_attr(OP_NAME, attr) is None, attr
    finally:
        tvm_roialign.register()
    assert _registry.get_op_attr(OP_NAME, "FRelaxInferLayout") is not None
