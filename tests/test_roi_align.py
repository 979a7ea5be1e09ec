"""relax.vision.roi_align through tvm-roialign's legalization, against torchvision and the float64
reference (tvm_roialign.testing.roi_align_ref).

Each parameter set is compiled once (``_compiled`` caches executables); the data and rois of a case
are built in feature-map units and divided by spatial_scale, so every scale samples the same region.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch
import torchvision
import tvm
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tvm import relax

import tvm_roialign
from tvm_roialign import testing
from tvm_roialign.testing import build_roi_align_module, roi_align_ref, run_roi_align_vm

HOST = tvm.target.Target({"kind": "llvm"})
N, C, H, W = 2, 3, 11, 13
TOL = {"float16": 4e-3, "float32": 1e-5, "float64": 1e-7}

LAYOUTS = ["NCHW", "NHWC"]
MODES = ["avg", "max"]
ALIGNED = [False, True]
SAMPLING_RATIOS = [-1, 0, 1, 2]
SCALES = [1.0, 0.25, 0.0625]
POOLED = [(7, 7), (14, 14), (2, 3)]


@functools.cache
def _compiled(num_rois, pooled, scale, sampling_ratio, aligned, layout, mode, dtype, tv_aligned):
    shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
    mod = build_roi_align_module(
        shape, num_rois, pooled, scale, sampling_ratio, aligned, layout, mode, dtype, tv_aligned
    )
    return relax.VirtualMachine(tvm.compile(mod, target=HOST), tvm.cpu())


_run = run_roi_align_vm


def smooth_data(dtype):
    return testing.smooth_data((N, C, H, W), dtype)


def case_rois(scale, dtype, seed=0):
    """Boxes in feature-map units (inside, straddling the border, tiny, large), in image pixels."""
    rng = np.random.default_rng(seed)
    starts = rng.uniform(-2.0, 10.0, (6, 2))
    sizes = rng.uniform(0.2, 9.0, (6, 2))
    boxes = np.concatenate([starts, starts + sizes], axis=1)
    boxes = np.concatenate([boxes, [[-3.0, -2.0, 14.5, 12.5], [4.25, 3.5, 4.75, 4.0]]])
    batch = np.array([0, 1, 0, 1, 1, 0, 1, 0], dtype=np.float64)[:, None]
    return np.concatenate([batch, boxes / scale], axis=1).astype(dtype)


def _torchvision(data, rois, pooled, scale, sampling_ratio, aligned):
    return torchvision.ops.roi_align(
        torch.from_numpy(data.astype(np.float32) if data.dtype == np.float16 else data),
        torch.from_numpy(rois.astype(np.float32) if rois.dtype == np.float16 else rois),
        pooled,
        scale,
        sampling_ratio,
        aligned,
    ).numpy()


def _grid_params():
    full = itertools.product(
        LAYOUTS, MODES, ALIGNED, SAMPLING_RATIOS, SCALES, POOLED, ["float32"]
    )
    yield from full
    # float16 and float64: every layout x mode x aligned x sampling_ratio, scale and pooled size
    # rotating through their values
    for i, (layout, mode, aligned, sr) in enumerate(
        itertools.product(LAYOUTS, MODES, ALIGNED, SAMPLING_RATIOS)
    ):
        for dtype in ("float16", "float64"):
            yield layout, mode, aligned, sr, SCALES[i % 3], POOLED[(i // 3) % 3], dtype


@pytest.mark.parametrize(
    "layout, mode, aligned, sampling_ratio, scale, pooled, dtype", list(_grid_params())
)
def test_grid(layout, mode, aligned, sampling_ratio, scale, pooled, dtype):
    """torchvision's aligned meaning (tvm_roialign.roi_align) vs torchvision and the reference."""
    data = smooth_data(dtype)
    rois = case_rois(scale, dtype)
    vm = _compiled(len(rois), pooled, scale, sampling_ratio, aligned, layout, mode, dtype, True)
    out = _run(vm, data, rois, layout)
    assert out.dtype == np.dtype(dtype)
    assert out.shape == (len(rois), C, *pooled)
    tol = TOL[dtype]
    expected = roi_align_ref(
        data, rois, pooled, scale, sampling_ratio, aligned, "NCHW", mode, half_pixel=aligned
    )
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=tol, atol=tol)
    if mode == "avg":
        tv = _torchvision(data, rois, pooled, scale, sampling_ratio, aligned)
        np.testing.assert_allclose(out.astype(np.float64), tv, rtol=tol, atol=tol)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_random_data_matches_torchvision_bitwise_order(layout, sampling_ratio):
    """On rough random data the arithmetic order matters: ours follows torchvision's (fp32)."""
    rng = np.random.default_rng(1)
    data = rng.standard_normal((N, C, H, W)).astype("float32")
    rois = case_rois(0.25, "float32", seed=3)
    vm = _compiled(len(rois), (7, 7), 0.25, sampling_ratio, True, layout, "avg", "float32", True)
    out = _run(vm, data, rois, layout)
    tv = _torchvision(data, rois, (7, 7), 0.25, sampling_ratio, True)
    np.testing.assert_allclose(out, tv, rtol=1e-5, atol=1e-5)


def test_op_aligned_means_no_clamp_without_shift():
    """The op keeps stock TVM's attribute meaning: aligned only drops the >= 1 clamp."""
    data = smooth_data("float32")
    rois = case_rois(0.5, "float32")
    vm = _compiled(len(rois), (2, 3), 0.5, 2, True, "NCHW", "avg", "float32", False)
    out = _run(vm, data, rois, "NCHW")
    expected = roi_align_ref(data, rois, (2, 3), 0.5, 2, True, "NCHW", "avg", half_pixel=False)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_shift_after_scaling_smallest_case():
    """The issue's smallest case: torchvision gives 7.5 (stock importers: 8.75)."""
    data = np.arange(16, dtype="float32").reshape(1, 1, 4, 4)
    rois = np.array([[0, 0, 0, 8, 8]], dtype="float32")
    mod = build_roi_align_module((1, 1, 4, 4), 1, (1, 1), 0.5, 1, True, torchvision_aligned=True)
    vm = relax.VirtualMachine(tvm.compile(mod, target=HOST), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(data), tvm.runtime.tensor(rois)).numpy()
    assert out.item() == pytest.approx(7.5)


NAN = float("nan")
INF = float("inf")
DEGENERATE = np.array(
    [
        [0, 2, 2, 2, 2],  # zero-size
        [0, 6, 6, 2, 2],  # inverted
        [0, -50, -50, -40, -40],  # outside the image
        [0, 100, 100, 120, 130],  # outside the image
        [5, 1, 1, 5, 5],  # batch index >= N
        [-3, 1, 1, 5, 5],  # negative batch index
        [NAN, 1, 1, 5, 5],  # NaN batch index
        [0, NAN, 1, 5, 5],  # NaN coordinates
        [0, NAN, NAN, NAN, NAN],
        [0, -INF, -INF, INF, INF],  # infinite box
        [1, 1, 1, 6, 6],  # an ordinary box
    ],
    dtype="float32",
)
# rows whose output is 0 whatever the mode: no valid sample, or an empty grid (flagged below)
ZERO_ALWAYS = [2, 3, 4, 5, 6, 8]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
@pytest.mark.parametrize("aligned", ALIGNED)
def test_degenerate_boxes(layout, mode, sampling_ratio, aligned):
    """Degenerate, inverted, out-of-image, NaN, infinite and out-of-range-batch boxes: finite,
    deterministic (two runs equal, no stale memory), equal to the reference, 0 where no sample is
    valid."""
    data = np.random.default_rng(2).standard_normal((N, C, H, W)).astype("float32")
    vm = _compiled(
        len(DEGENERATE), (2, 2), 1.0, sampling_ratio, aligned, layout, mode, "float32", False
    )
    first = _run(vm, data, DEGENERATE, layout)
    # a call in between that leaves non-zero values in freed buffers
    _run(vm, data * 100.0, DEGENERATE, layout)
    second = _run(vm, data, DEGENERATE, layout)
    assert np.isfinite(first).all()
    np.testing.assert_array_equal(first, second)
    assert not first[ZERO_ALWAYS].any()
    if aligned and sampling_ratio <= 0:  # empty adaptive grids: zero-size, inverted, infinite
        assert not first[[0, 1, 9]].any()
    with np.errstate(invalid="ignore"):
        expected = roi_align_ref(data, DEGENERATE, (2, 2), 1.0, sampling_ratio, aligned, "NCHW", mode)
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-5)
    assert first[10].any()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    layout=st.sampled_from(LAYOUTS),
    sampling_ratio=st.sampled_from([-1, 2]),
    boxes=st.lists(
        st.tuples(
            st.integers(0, 2),  # batch index, 2 is out of range
            st.floats(-8, 24, allow_nan=False, width=32),
            st.floats(-8, 24, allow_nan=False, width=32),
            st.floats(-8, 24, allow_nan=False, width=32),
            st.floats(-8, 24, allow_nan=False, width=32),
        ),
        min_size=4,
        max_size=4,
    ),
)
@example(layout="NCHW", sampling_ratio=-1, boxes=[(0, 0.0, -4.0, 0.0, 0.0)] * 4)  # y == -1 edge
def test_fuzz_against_reference(layout, sampling_ratio, boxes):
    """Random boxes, any orientation or size, against the reference (smooth data).

    Hypothesis finds samples exactly on the ``y == -1`` boundary, where float32 and float64
    geometry fall on different sides: the reference rounds its geometry in float32 here."""
    data = smooth_data("float32")
    rois = np.array(boxes, dtype="float32")
    vm = _compiled(4, (3, 3), 0.5, sampling_ratio, False, layout, "avg", "float32", False)
    out = _run(vm, data, rois, layout)
    expected = roi_align_ref(
        data, rois, (3, 3), 0.5, sampling_ratio, False, "NCHW", "avg", coord_dtype="float32"
    )
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_fp16_feeds_fp16_add():
    """fp16 in, fp16 out: roi_align(fp16) -> add(fp16) compiles (stock TVM infers float32)."""
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType([1, 4, 8, 8], "float16"))
    rois = relax.Var("rois", relax.TensorType([3, 5], "float16"))
    with bb.function("main", [data, rois]):
        with bb.dataflow():
            pooled = bb.emit(relax.op.vision.roi_align(data, rois, (2, 2), 1.0, 2))
            assert str(pooled.ty.dtype) == "float16"
            out = bb.emit_output(bb.emit(relax.op.add(pooled, relax.const(1.0, "float16"))))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target=HOST), tvm.cpu())
    x = np.resize(smooth_data("float32"), (1, 4, 8, 8)).astype("float16")
    r = np.array([[0, 0, 0, 4, 4], [0, 1, 2, 7, 6], [0, 3, 3, 5, 5]], dtype="float16")
    out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(r)).numpy()
    assert out.dtype == np.float16
    expected = roi_align_ref(x, r, (2, 2), 1.0, 2) + 1.0
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=4e-3, atol=4e-3)


def test_unregister_restores_stock_and_register_is_idempotent():
    op = tvm.ir.Op.get("relax.vision.roi_align")
    ours = {key: op.get_attr(key) for key in ("FLegalize", "FInferType")}
    tvm_roialign.register()  # idempotent: nothing re-registered
    assert all(op.get_attr(key).same_as(value) for key, value in ours.items())
    tvm_roialign.unregister()
    try:
        assert not tvm_roialign.is_registered()
        stock = {key: op.get_attr(key) for key in ours}
        for key, value in ours.items():
            assert stock[key] is not None and not stock[key].same_as(value)
    finally:
        tvm_roialign.register()
    assert tvm_roialign.is_registered()
    for key in ours:
        assert not op.get_attr(key).same_as(stock[key])


def _call(data_shape, rois_shape, dtype="float32", rois_dtype=None, **kwargs):
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType(list(data_shape), dtype))
    rois = relax.Var("rois", relax.TensorType(list(rois_shape), rois_dtype or dtype))
    args = {"pooled_size": (2, 2), "spatial_scale": 1.0, "sample_ratio": -1, "layout": "NCHW", "mode": "avg"}
    args.update(kwargs)
    with bb.function("main", [data, rois]):
        out = bb.emit(relax.op.vision.roi_align(data, rois, **args))
        bb.emit_func_output(out)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"data_shape": (1, 4, 8), "rois_shape": (3, 5)}, r"data must be 4-D \[N, C, H, W\]"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 4)}, r"rois must be \[K, 5\]"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5, 1)}, r"rois must be \[K, 5\]"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5), "layout": "HWCN"}, "layout must be one of"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5), "mode": "min"}, "mode must be one of"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5), "pooled_size": (0, 2)}, "pooled_size"),
        (
            {"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5), "rois_dtype": "float16"},
            r"rois dtype \(float16\) must equal data dtype \(float32\)",
        ),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5), "dtype": "int32"}, "data dtype must be"),
    ],
)
def test_bad_input_raises_clear_error(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _call(**kwargs)


def test_topi_dispatcher_rejects_unknown_layout():
    from tvm import te

    data = te.placeholder((1, 4, 8, 8), "float32", "data")
    rois = te.placeholder((3, 5), "float32", "rois")
    with pytest.raises(ValueError, match="layout must be one of"):
        tvm_roialign.topi.roi_align(data, rois, (2, 2), layout="CHWN")
    with pytest.raises(ValueError, match="spatial_scale must be a positive"):
        tvm_roialign.topi.roi_align(data, rois, (2, 2), spatial_scale=0.0)


def test_generic_llvm_schedule_matches():
    """The plain schedule for non-x86 llvm targets, built for the host, agrees with x86's."""
    from tvm import te

    from tvm_roialign.strategies import STRATEGIES

    data_np = smooth_data("float32")
    rois_np = case_rois(0.5, "float32")
    results = []
    for name in ("llvm", "x86"):
        data = te.placeholder((N, C, H, W), "float32", "data")
        rois = te.placeholder(rois_np.shape, "float32", "rois")
        func = STRATEGIES[name].build(
            lambda d, r: tvm_roialign.topi.roi_align(d, r, (3, 2), 0.5, "avg", -1, False),
            [data, rois],
            HOST,
            "NCHW",
        )
        lib = tvm.compile(tvm.IRModule({"main": func}), target=HOST)
        out = tvm.runtime.tensor(np.zeros((len(rois_np), C, 3, 2), "float32"))
        lib["main"](tvm.runtime.tensor(data_np), tvm.runtime.tensor(rois_np), out)
        results.append(out.numpy())
    np.testing.assert_array_equal(results[0], results[1])
    expected = roi_align_ref(data_np, rois_np, (3, 2), 0.5, -1, False)
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-5)


def test_index_dtype_int64_only_past_int32():
    from tvm_roialign.topi.roi_align import index_dtype_for

    assert index_dtype_for((1, 256, 200, 272), (1000, 256, 7, 7)) == "int32"
    assert index_dtype_for((172, 256, 200, 272)) == "int64"
    assert index_dtype_for((172000, 256, 7, 7)) == "int64"
    assert index_dtype_for((tvm.tirx.Var("k", "int64"), 5)) == "int64"
