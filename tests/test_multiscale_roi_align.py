"""The fused op ``relax.vision.multiscale_roi_align`` (issue 4): the level range as torchvision's,
the RoIAlign schedule rules apply to it (x86; the GPU rule lowers to two kernels), struct info,
attributes, clear errors. Its numerics (against torchvision's ``MultiScaleRoIAlign`` and a
per-level float64 reference: four levels, boxes on every level and past the level range, negative
area, degenerate boxes, NCHW and NHWC, fixed and adaptive grids, aligned, one level, a fuzz) are
tests/test_roi_family.py's ``TestMultiscaleRoIAlign``.
"""

from __future__ import annotations

import pytest
import tvm
from tvm import relax, te

import tvm_roialign
from tvm_roialign.ops.multiscale_roi_align import OP_NAME, MultiscaleRoiAlignAttrs
from tvm_roialign.strategies import STRATEGIES
from tvm_roialign.testing import single_op_module
from tvm_roialign.topi import multiscale_roi_align as topi_multiscale
from tvm_roialign.topi.multiscale_roi_align import level_range

SCALES = [1 / 4, 1 / 8, 1 / 16, 1 / 32]
CHANNELS = 8


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
    from tvm_roialign.schedules.roi_align.gpu import RoIAlignCUDA
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
def test_gpu_schedule_lowers_to_two_kernels(layout):
    """The GPU rule (one thread per output) schedules the fused op (its numerics, the loop nest
    run on the host without thread binding: tests/test_roi_family.py); bound to threads, it
    lowers for CUDA to two kernels (levels, then RoIAlign)."""
    from tvm.tirx.build import split_host_device_mods

    shapes = [(2, CHANNELS, 50, 58), (2, CHANNELS, 25, 29), (2, CHANNELS, 13, 15)]
    sampling_ratio = 0 if layout == "NCHW" else 2  # adaptive and fixed grids, one each
    mod, target = _gpu_prim_func(layout, sampling_ratio, True, shapes, 6)
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
