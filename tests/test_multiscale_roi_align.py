"""The fused op ``relax.vision.multiscale_roi_align`` (issue 4) against torchvision's
``MultiScaleRoIAlign``: four levels, boxes on every level (and past the level range, with negative
area, degenerate), NCHW and NHWC, fixed and adaptive sampling grids, aligned, one level; the
RoIAlign schedule rules apply to it; clear errors.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
import torchvision
import tvm
from _targets import GENERIC
from tvm import relax, te

import tvm_roialign
from tvm_roialign.ops.multiscale_roi_align import OP_NAME, MultiscaleRoiAlignAttrs
from tvm_roialign.strategies import STRATEGIES
from tvm_roialign.testing import compile_and_run, single_op_module
from tvm_roialign.topi import multiscale_roi_align as topi_multiscale
from tvm_roialign.topi.multiscale_roi_align import level_range

IMAGE = (200, 232)  # (height, width)
SCALES = [1 / 4, 1 / 8, 1 / 16, 1 / 32]
CHANNELS = 8


def _features(rng, channels=CHANNELS, batch=2, levels=4):
    # sizes as a backbone gives them: ceil-divided by two per level (odd sizes on the way)
    shapes, height, width = [], IMAGE[0], IMAGE[1]
    for _ in range(2):
        height, width = -(-height // 2), -(-width // 2)
    for _ in range(levels):
        shapes.append((batch, channels, height, width))
        height, width = -(-height // 2), -(-width // 2)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _rois(rng):
    """(batch, x1, y1, x2, y2): sizes from 6 to 700 pixels (below and above the level range),
    plus a zero-size box, a negative-area box (x2 < x1: NaN level, zeros in torchvision), and a
    box with both sides reversed (positive area)."""
    count = 24
    size = rng.permutation(np.geomspace(6, 700, count))
    aspect = rng.uniform(0.5, 2.0, count)
    x1 = rng.uniform(-20, IMAGE[1], count)
    y1 = rng.uniform(-20, IMAGE[0], count)
    boxes = np.stack([x1, y1, x1 + size * aspect, y1 + size / aspect], axis=1)
    extra = np.array(
        [[30, 40, 30, 40], [50, 20, 40, 90], [120, 150, 20, 30]], np.float64
    )
    boxes = np.concatenate([boxes, extra]).astype(np.float32)
    batch = rng.integers(0, 2, len(boxes))
    order = np.argsort(
        batch, kind="stable"
    )  # torchvision concatenates the images' boxes
    return np.concatenate([batch[order, None], boxes[order]], axis=1).astype(np.float32)


def _torchvision(features, rois, output_size, sampling_ratio, num_levels=4):
    names = [str(i) for i in range(num_levels)]
    pooler = torchvision.ops.MultiScaleRoIAlign(names, output_size, sampling_ratio)
    x = OrderedDict((n, torch.from_numpy(f)) for n, f in zip(names, features))
    num_images = features[0].shape[0]
    boxes = [torch.from_numpy(rois[rois[:, 0] == b, 1:]) for b in range(num_images)]
    out = pooler(x, boxes, [IMAGE] * num_images).numpy()
    assert [float(s) for s in pooler.scales] == SCALES[:num_levels]
    return out, pooler, boxes


def _module(
    feature_shapes,
    num_rois,
    output_size,
    sampling_ratio,
    layout="NCHW",
    aligned=False,
    scales=None,
):
    inputs = {f"f{i}": (s, "float32") for i, s in enumerate(feature_shapes)}
    return single_op_module(
        lambda *args: tvm_roialign.multiscale_roi_align(
            list(args[:-1]), args[-1], output_size, scales or SCALES[: len(feature_shapes)],
            sampling_ratio=sampling_ratio, aligned=aligned, layout=layout),
        **inputs, rois=([num_rois, 5], "float32"))


def _nhwc(x):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(11)
    features = _features(rng)
    rois = _rois(rng)
    return features, rois


def test_rois_cover_every_level(case):
    features, rois = case
    _, pooler, boxes = _torchvision(features, rois, 2, 2)
    levels = pooler.map_levels(boxes).tolist()
    assert {0, 1, 2, 3} <= set(levels)  # (and the NaN level of the negative-area box)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_vs_torchvision(case, layout, tol):
    features, rois = case
    want, _, _ = _torchvision(features, rois, (7, 6), 2)
    shapes = [f.shape if layout == "NCHW" else _nhwc(f).shape for f in features]
    mod = _module(shapes, len(rois), (7, 6), 2, layout)
    inputs = [f if layout == "NCHW" else _nhwc(f) for f in features]
    got = compile_and_run(mod, [*inputs, rois])
    if layout == "NHWC":
        got = got.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, want, rtol=0, atol=tol["float32"])
    negative_area = np.nonzero(
        (rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2]) < 0
    )[0]
    assert len(negative_area) == 1 and np.all(got[negative_area] == 0)


def test_adaptive_grid_vs_torchvision(case, tol):
    features, rois = case
    want, _, _ = _torchvision(features, rois, 3, 0)
    mod = _module([f.shape for f in features], len(rois), 3, 0)
    np.testing.assert_allclose(
        compile_and_run(mod, [*features, rois]), want, rtol=0, atol=tol["float32"]
    )


def test_aligned_vs_torchvision_per_level(case, tol):
    """aligned=True: each roi is torchvision.ops.roi_align(aligned=True) on its own level."""
    features, rois = case
    _, pooler, boxes = _torchvision(features, rois, 2, 2)
    levels = pooler.map_levels(boxes).numpy()
    want = np.zeros((len(rois), CHANNELS, 4, 4), np.float32)
    for level, scale in enumerate(SCALES):
        index = np.nonzero(levels == level)[0]
        want[index] = torchvision.ops.roi_align(
            torch.from_numpy(features[level]),
            torch.from_numpy(rois[index]),
            4,
            scale,
            2,
            True,
        ).numpy()
    mod = _module([f.shape for f in features], len(rois), 4, 2, aligned=True)
    np.testing.assert_allclose(
        compile_and_run(mod, [*features, rois]), want, rtol=0, atol=tol["float32"]
    )


def test_single_level_is_roi_align(case, tol):
    features, rois = case
    want, _, _ = _torchvision(features[:1], rois, 5, 2, num_levels=1)
    mod = _module([features[0].shape], len(rois), 5, 2)
    np.testing.assert_allclose(
        compile_and_run(mod, [features[0], rois]), want, rtol=0, atol=tol["float32"]
    )


def test_level_range_as_torchvision():
    assert level_range(SCALES) == (2, 5)
    assert level_range([1.0]) == (0, 0)
    assert level_range([1 / 3, 1 / 6]) == (1, 2)  # float32 log2, truncated toward zero


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_roi_align_schedule_rules_apply(layout):
    """The compute has RoIAlign's blocks and loop order: the x86 rule schedules it."""
    shapes = [(1, 16, 32, 40), (1, 16, 16, 20), (1, 16, 8, 10)]
    if layout == "NHWC":
        shapes = [(n, h, w, c) for n, c, h, w in shapes]
    features = [te.placeholder(s, "float32", f"f{i}") for i, s in enumerate(shapes)]
    rois = te.placeholder((6, 5), "float32", "rois")
    out = topi_multiscale(features, rois, 7, SCALES[:3], 2, layout=layout)
    func = te.create_prim_func([*features, rois, out]).with_attr(
        "roi_align.layout", layout
    )
    target = tvm.target.Target(
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}
    )
    sch = STRATEGIES["x86"].schedule.apply(func, target, False)
    assert sch is not None
    kinds = [
        int(sch.get(loop).kind) for loop in sch.get_loops(sch.get_sblock("roi_align"))
    ]
    assert int(tvm.tirx.ForKind.PARALLEL) in kinds


def test_struct_info_and_attrs():
    mod = _module([(2, 8, 50, 58), (2, 8, 25, 29)], 9, (7, 3), 2, scales=SCALES[:2])
    binding = mod["main"].body.blocks[0].bindings[0]
    assert binding.value.op.name == OP_NAME
    assert [int(v) for v in binding.var.ty.shape.values] == [9, 8, 7, 3]
    attrs = MultiscaleRoiAlignAttrs.from_call(binding.value)
    assert attrs.spatial_scales == (0.25, 0.125) and attrs.canonical_scale == 224
    # attributes made with make_node("ir.DictAttrs", __dict__={...}) are read too
    nested = tvm.ir.make_node(
        "ir.DictAttrs", __dict__={"pooled_size": [2, 2], "spatial_scales": [0.5]}
    )
    assert MultiscaleRoiAlignAttrs.from_attrs(nested).pooled_size == (2, 2)
    op = tvm.ir.Op.get(OP_NAME)
    assert bool(op.get_attr("FPurity"))
    assert op.get_attr("FRelaxInferLayout") is not None


def _normalize(
    shapes,
    rois_shape=(4, 5),
    scales=(0.25, 0.125),
    dtype="float32",
    rois_dtype="float32",
    layout="NCHW",
):
    inputs = {f"f{i}": (s, dtype) for i, s in enumerate(shapes)}
    single_op_module(
        lambda *args: tvm_roialign.multiscale_roi_align(
            list(args[:-1]), args[-1], 2, list(scales), layout=layout),
        **inputs, rois=(rois_shape, rois_dtype))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"shapes": [(1, 8, 8, 8), (1, 4, 4, 4)]}, ValueError, "channel count C"),
        (
            {"shapes": [(1, 8, 8, 8), (1, 8, 4, 4)], "scales": (0.25,)},
            ValueError,
            "one scale per feature map",
        ),
        (
            {"shapes": [(1, 8, 8, 8)], "scales": (-1.0,)},
            ValueError,
            "spatial_scales must be positive",
        ),
        (
            {"shapes": [(1, 8, 8, 8)], "scales": (1.0,), "rois_shape": (4, 4)},
            ValueError,
            r"rois must be \[K, 5\]",
        ),
        (
            {"shapes": [(1, 8, 8, 8)], "scales": (1.0,), "rois_dtype": "float16"},
            TypeError,
            "rois dtype",
        ),
        (
            {"shapes": [(1, 8, 8)], "scales": (1.0,)},
            ValueError,
            r"features\[0\] must be 4-D",
        ),
        (
            {"shapes": [(1, 8, 8, 8)], "scales": (1.0,), "layout": "NCWH"},
            ValueError,
            "layout",
        ),
    ],
)
def test_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        _normalize(**kwargs)


def test_empty_features_rejected():
    rois = relax.Var("rois", relax.TensorType([3, 5], "float32"))
    with pytest.raises(ValueError, match="non-empty list"):
        tvm_roialign.multiscale_roi_align([], rois, 2, [])


def _gpu_prim_func(layout, sampling_ratio, bind_threads, shapes, num_rois):
    from tvm_roialign.schedules.roi_align_gpu import RoIAlignCUDA
    from tvm_roialign.strategies.base import mark_scheduled

    if layout == "NHWC":
        shapes = [(n, h, w, c) for n, c, h, w in shapes]
    features = [te.placeholder(s, "float32", f"f{i}") for i, s in enumerate(shapes)]
    rois = te.placeholder((num_rois, 5), "float32", "rois")
    out = topi_multiscale(
        features, rois, 3, SCALES[: len(shapes)], sampling_ratio, layout=layout
    )
    func = te.create_prim_func([*features, rois, out]).with_attr(
        "roi_align.layout", layout
    )
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host={"kind": "llvm"})
    sch = RoIAlignCUDA(bind_threads=bind_threads).apply(func, target)
    assert sch is not None
    return tvm.IRModule({"main": mark_scheduled(sch.mod["main"])}), target


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gpu_schedule_rule_applies(case, layout, tol):
    """The GPU rule (one thread per output) schedules the fused op: its loop nest, run on the
    host without thread binding, matches torchvision; bound to threads, it lowers for CUDA to
    two kernels (levels, then RoIAlign)."""
    features, rois = case
    want, _, _ = _torchvision(features, rois, 3, 2)
    shapes = [f.shape for f in features]
    mod, _ = _gpu_prim_func(layout, 2, False, shapes, len(rois))
    lib = tvm.tirx.build(mod, target=GENERIC)
    inputs = [f if layout == "NCHW" else _nhwc(f) for f in features] + [rois]
    args = [tvm.runtime.tensor(np.ascontiguousarray(x)) for x in inputs]
    out_shape = (
        (len(rois), CHANNELS, 3, 3) if layout == "NCHW" else (len(rois), 3, 3, CHANNELS)
    )
    args.append(tvm.runtime.tensor(np.zeros(out_shape, np.float32)))
    lib["main"](*args)
    got = args[-1].numpy()
    if layout == "NHWC":
        got = got.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, want, rtol=0, atol=tol["float32"])

    from tvm.tirx.build import split_host_device_mods

    sampling_ratio = 0 if layout == "NCHW" else 2  # adaptive and fixed grids, one each
    mod, target = _gpu_prim_func(layout, sampling_ratio, True, shapes[:3], 6)
    mod = tvm.tirx.transform.BindTarget(target)(mod)
    pipeline, _, finalize_device = tvm.tirx.get_default_tir_pipeline(target)
    _, device = split_host_device_mods(pipeline(mod))
    kernels = [finalize_device()(m) for m in device.values()]
    # two launches: the per-roi FPN level (one thread per roi), then RoIAlign (one per output)
    assert len(kernels) == 1 and len(kernels[0].functions) == 2


def test_options_are_keyword_only():
    """``sampling_ratio, aligned, layout, mode`` go by keyword, as for the family's other ops."""
    rois = relax.Var("rois", relax.TensorType([3, 5], "float32"))
    feats = [relax.Var("f0", relax.TensorType([1, 4, 8, 8], "float32"))]
    call = tvm_roialign.multiscale_roi_align(feats, rois, 2, [0.5], sampling_ratio=2, layout="NCHW")
    assert MultiscaleRoiAlignAttrs.from_call(call).sampling_ratio == 2
    with pytest.raises(TypeError):
        tvm_roialign.multiscale_roi_align(feats, rois, 2, [0.5], 2, False, "NCHW")
