"""torch.export import (issue 4): torchvision roi_align over aligned x spatial_scale x
sampling_ratio vs eager (the issue's smallest case included), MultiScaleRoIAlign as the fused op
(boxes on all four levels, symbolic number of rois, no nonzero / scatter, NCHW and NHWC) vs eager,
and torchvision's Mask R-CNN poolers; a plain ``torch.export.export`` of the pooler (issue 9),
and the one-line error for a per-level form that is not torchvision's.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torchvision
import tvm
from tvm import relax

from tvm_roialign.frontend import (
    export,
    from_exported_program,
    fuse_multiscale_roi_align,
)
from tvm_roialign.passes import ConvertLayout
from tvm_roialign.testing import compile_and_run, compiled

SCALES = (1.0, 0.25, 1.0 / 16)
SAMPLING = (1, 2, 0)
FORBIDDEN = ("nonzero", "scatter", "index_put", "where")


def _op_names(mod):
    names = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            names.append(expr.op.name)

    relax.analysis.post_order_visit(mod["main"], visit)
    return names


def _as_list(out):
    return out if isinstance(out, list) else [out]


class RoiAlignGrid(torch.nn.Module):
    """Every (aligned, spatial_scale, sampling_ratio) of the issue in one graph: ``rois`` are in
    feature-map pixels and scaled to image pixels per scale (a power of two: exact)."""

    combos = tuple(itertools.product((False, True), SCALES, SAMPLING))

    def forward(self, x, rois):
        outs = []
        for aligned, scale, sampling in self.combos:
            image_rois = torch.cat([rois[:, :1], rois[:, 1:] / scale], dim=1)
            outs.append(
                torchvision.ops.roi_align(
                    x, image_rois, (3, 2), scale, sampling, aligned
                )
            )
        return tuple(outs)


def test_roi_align_grid_vs_eager(tol):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 12, 10, generator=g)
    rois = torch.tensor(
        [
            [0, 0.0, 0.0, 9.0, 11.0],
            [1, 1.3, 2.7, 7.1, 5.2],
            [1, 4.0, 4.0, 4.6, 4.3],  # smaller than a pixel
            [0, -2.0, 6.0, 12.5, 14.0],  # past the borders
            [1, 8.9, 10.7, 9.9, 11.9],
        ]
    )
    model = RoiAlignGrid()
    ep = torch.export.export(
        model, (x, rois), dynamic_shapes=({}, {0: torch.export.Dim("K")})
    )
    mod = from_exported_program(ep)
    assert _op_names(mod).count("relax.vision.roi_align") == len(RoiAlignGrid.combos)
    # a symbolic number of rois: one build, run with fewer rois than exported with
    run = compiled(mod)
    for count in (5, 3):
        got = _as_list(run([x.numpy(), rois[:count].numpy()]))
        want = model(x, rois[:count])
        for combo, out, ref in zip(RoiAlignGrid.combos, got, want):
            np.testing.assert_allclose(
                out, ref.numpy(), rtol=0, atol=tol["float32"], err_msg=str(combo)
            )


def test_issue_smallest_case(tol):
    """spatial_scale 0.5, aligned: torchvision 7.5 (stock TVM importer: 8.75)."""

    class Model(torch.nn.Module):
        def forward(self, x, rois):
            return torchvision.ops.roi_align(x, rois, (1, 1), 0.5, 1, True)

    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    rois = torch.tensor([[0.0, 0.0, 0.0, 8.0, 8.0], [0.0, 0.0, 0.0, 8.0, 8.0]])
    ep = torch.export.export(Model(), (x, rois))
    out = _as_list(
        compile_and_run(from_exported_program(ep), [x.numpy(), rois.numpy()])
    )[0]
    np.testing.assert_allclose(out.ravel(), [7.5, 7.5], atol=tol["float32"])


# ------------------------------------------------------------------------------------------------
# MultiScaleRoIAlign

IMAGE = (256, 224)  # (height, width) of both images


class Pooler(torch.nn.Module):
    def __init__(self, output_size=7, sampling_ratio=2):
        super().__init__()
        self.pool = torchvision.ops.MultiScaleRoIAlign(
            ["0", "1", "2", "3"], output_size, sampling_ratio
        )

    def forward(self, f0, f1, f2, f3, boxes0, boxes1):
        features = OrderedDict([("0", f0), ("1", f1), ("2", f2), ("3", f3)])
        return self.pool(features, [boxes0, boxes1], [IMAGE, IMAGE])


def _boxes(rng, count):
    """Boxes with sizes from 8 to 560 pixels (all four FPN levels), some past the image."""
    size = rng.permutation(np.geomspace(8, 560, count))
    aspect = rng.uniform(0.5, 2.0, count)
    x1 = rng.uniform(-10, IMAGE[1] - 8, count)
    y1 = rng.uniform(-10, IMAGE[0] - 8, count)
    boxes = np.stack([x1, y1, x1 + size * aspect, y1 + size / aspect], axis=1)
    return torch.tensor(boxes, dtype=torch.float32)


@pytest.fixture(scope="module")
def pooler_case():
    rng = np.random.default_rng(4)
    g = torch.Generator().manual_seed(4)
    features = [
        torch.randn(2, 8, IMAGE[0] // 2**k, IMAGE[1] // 2**k, generator=g)
        for k in (2, 3, 4, 5)
    ]
    boxes = [_boxes(rng, 13), _boxes(rng, 9)]
    model = Pooler().eval()
    ref = model(*features, *boxes)
    levels = model.pool.map_levels(boxes)
    assert sorted(set(levels.tolist())) == [0, 1, 2, 3], (
        "boxes must cover the four levels"
    )
    dims = {0: torch.export.Dim("K0")}, {0: torch.export.Dim("K1")}
    ep = export(model, (*features, *boxes), dynamic_shapes=({}, {}, {}, {}, *dims))
    mod = from_exported_program(ep)
    return model, ep, mod, features, boxes, ref


def test_multiscale_graph_is_fused(pooler_case):
    model, ep, mod, *_ = pooler_case
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "tvm_roialign.multiscale_roi_align.default" in targets
    assert not [t for t in targets if any(f in t for f in FORBIDDEN)], targets
    names = _op_names(mod)
    assert names.count("relax.vision.multiscale_roi_align") == 1
    assert "relax.vision.roi_align" not in names
    assert not [n for n in names if any(f in n for f in FORBIDDEN)], names
    # the number of rois stays symbolic
    (out,) = mod["main"].ret_ty.fields
    assert not isinstance(out.shape.values[0], tvm.tirx.IntImm)
    # the model itself is untouched after the export
    assert "forward" not in model.pool.__dict__


def test_multiscale_nchw_vs_eager(pooler_case, tol):
    _, ep, mod, features, boxes, ref = pooler_case
    inputs = [f.numpy() for f in features] + [b.numpy() for b in boxes]
    run = compiled(mod)
    out = _as_list(run(inputs))[0]
    np.testing.assert_allclose(out, ref.numpy(), rtol=0, atol=tol["float32"])
    # the exported program runs eagerly through the custom op's kernel
    np.testing.assert_allclose(
        ep.module()(*features, *boxes).numpy(), ref.numpy(), atol=tol["float32"]
    )
    # fewer rois than exported with
    fewer = [b[:4] for b in boxes]
    want = Pooler().eval()(*features, *fewer)
    got = _as_list(run(inputs[:4] + [b.numpy() for b in fewer]))[0]  # the same build
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=tol["float32"])


def test_multiscale_nhwc_vs_eager(pooler_case, tol):
    _, _, mod, features, boxes, ref = pooler_case
    mod = ConvertLayout({"vision.multiscale_roi_align": ["NHWC", "default"]})(
        mod
    )
    calls = []
    relax.analysis.post_order_visit(
        mod["main"],
        lambda e: (
            calls.append(e)
            if isinstance(e, relax.Call)
            and getattr(e.op, "name", "") == "relax.vision.multiscale_roi_align"
            else None
        ),
    )
    assert [str(c.attrs["layout"]) for c in calls] == ["NHWC"]
    inputs = [f.numpy() for f in features] + [b.numpy() for b in boxes]
    out = _as_list(compile_and_run(mod, inputs))[0]
    np.testing.assert_allclose(out, ref.numpy(), rtol=0, atol=tol["float32"])


def test_plain_export_multiscale_vs_eager(pooler_case, tol):
    """A plain ``torch.export.export`` (torchvision's per-level nonzero / index / roi_align /
    index_put) imports as one fused op and matches eager; the caller's program is unchanged."""
    model, _, _, features, boxes, ref = pooler_case
    ep = torch.export.export(model, (*features, *boxes))
    before = [str(n.target) for n in ep.graph.nodes]
    mod = from_exported_program(ep)
    assert [str(n.target) for n in ep.graph.nodes] == before
    names = _op_names(mod)
    assert names.count("relax.vision.multiscale_roi_align") == 1
    assert "relax.vision.roi_align" not in names
    assert not [n for n in names if any(f in n for f in FORBIDDEN)], names
    inputs = [f.numpy() for f in features] + [b.numpy() for b in boxes]
    out = _as_list(compile_and_run(mod, inputs))[0]
    np.testing.assert_allclose(out, ref.numpy(), rtol=0, atol=tol["float32"])


class _ConvPooler(torch.nn.Module):
    """The issue's model: a conv, a pooled level, and a two-level MultiScaleRoIAlign."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.pool = torchvision.ops.MultiScaleRoIAlign(["0", "1"], 3, 2)

    def forward(self, x, boxes):
        f0 = self.conv(x)
        f1 = torch.nn.functional.max_pool2d(f0, 2)
        return self.pool(OrderedDict([("0", f0), ("1", f1)]), [boxes], [(64, 64)])


def test_plain_export_conv_and_pooler_vs_eager(tol):
    torch.manual_seed(0)
    model = _ConvPooler().eval()
    x = torch.randn(1, 3, 32, 32)
    boxes = torch.tensor([[0, 0, 30, 40.0], [5, 5, 60, 60], [10, 10, 12, 14], [2, 3, 63, 50]])
    ref = model(x, boxes)
    mod = from_exported_program(torch.export.export(model, (x, boxes)))
    assert _op_names(mod).count("relax.vision.multiscale_roi_align") == 1
    out = _as_list(compile_and_run(mod, [x.numpy(), boxes.numpy()]))[0]
    np.testing.assert_allclose(out, ref.detach().numpy(), rtol=0, atol=tol["float32"])


class _NotAPooler(torch.nn.Module):
    """A roi_align of rois selected data-dependently, but not by torchvision's LevelMapper."""

    def forward(self, x, rois):
        keep = torch.where(rois[:, 3] > 8)[0]
        out = torch.zeros(rois.shape[0], x.shape[1], 2, 2)
        out[keep] = torchvision.ops.roi_align(x, rois[keep], (2, 2), 0.5, 2)
        return out


def test_unrecognised_per_level_form_is_one_line_naming_export():
    x = torch.randn(1, 3, 8, 8)
    rois = torch.tensor([[0, 0, 0, 10, 10.0], [0, 1, 1, 4, 4]])
    ep = torch.export.export(_NotAPooler(), (x, rois))
    with pytest.raises(NotImplementedError) as info:
        from_exported_program(ep)
    message = str(info.value)
    assert "\n" not in message and "tvm_roialign.frontend.export" in message, message


def test_plain_export_mask_rcnn_poolers(tol):
    """torchvision's Mask R-CNN poolers, exported plainly, import as two fused ops."""
    heads, features, pool, boxes = _mask_rcnn_heads()
    ref_box, ref_mask = heads(*features, pool, boxes)
    mod = from_exported_program(torch.export.export(heads, (*features, pool, boxes)))
    assert _op_names(mod).count("relax.vision.multiscale_roi_align") == 2
    box, mask = compile_and_run(
        mod, [f.numpy() for f in features] + [pool.numpy(), boxes.numpy()]
    )
    np.testing.assert_allclose(box, ref_box.numpy(), rtol=0, atol=tol["float32"])
    np.testing.assert_allclose(mask, ref_mask.numpy(), rtol=0, atol=tol["float32"])


def _mask_rcnn_heads():
    """torchvision's Mask R-CNN box and mask poolers in one module, with inputs."""
    from torchvision.models.detection import maskrcnn_resnet50_fpn

    torch.manual_seed(0)
    detector = maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=3
    ).eval()

    class Heads(torch.nn.Module):
        def __init__(self, roi_heads):
            super().__init__()
            self.roi_heads = roi_heads

        def forward(self, f0, f1, f2, f3, pool, boxes):
            x = OrderedDict(
                [("0", f0), ("1", f1), ("2", f2), ("3", f3), ("pool", pool)]
            )
            shapes = [(128, 160)]
            box = self.roi_heads.box_roi_pool(x, [boxes], shapes)
            mask = self.roi_heads.mask_roi_pool(x, [boxes], shapes)
            return box, mask

    heads = Heads(detector.roi_heads).eval()
    g = torch.Generator().manual_seed(1)
    features = [
        torch.randn(1, 16, 128 // 2**k, 160 // 2**k, generator=g) for k in (2, 3, 4, 5)
    ]
    pool = torch.randn(1, 16, 2, 3, generator=g)
    boxes = torch.tensor(
        [
            [0, 0, 150, 120],
            [10, 20, 30, 40],
            [5, 5, 100, 60],
            [50, 40, 52, 43],
            [0, 0, 160, 128],
        ],
        dtype=torch.float32,
    )
    return heads, features, pool, boxes


def test_mask_rcnn_poolers(tol):
    """torchvision's Mask R-CNN box and mask poolers, unmodified, export as the fused op."""
    heads, features, pool, boxes = _mask_rcnn_heads()
    ref_box, ref_mask = heads(*features, pool, boxes)
    ep = export(
        heads,
        (*features, pool, boxes),
        dynamic_shapes=({}, {}, {}, {}, {}, {0: torch.export.Dim("K")}),
    )
    mod = from_exported_program(ep)
    assert _op_names(mod).count("relax.vision.multiscale_roi_align") == 2
    box, mask = compile_and_run(
        mod, [f.numpy() for f in features] + [pool.numpy(), boxes.numpy()]
    )
    np.testing.assert_allclose(box, ref_box.numpy(), rtol=0, atol=tol["float32"])
    np.testing.assert_allclose(mask, ref_mask.numpy(), rtol=0, atol=tol["float32"])
    assert box.shape == (5, 16, 7, 7) and mask.shape == (5, 16, 14, 14)


def test_fuse_context_restores_and_keeps_results():
    model = Pooler(output_size=(3, 2), sampling_ratio=0).eval()
    rng = np.random.default_rng(7)
    g = torch.Generator().manual_seed(7)
    features = [
        torch.randn(2, 4, IMAGE[0] // 2**k, IMAGE[1] // 2**k, generator=g)
        for k in (2, 3, 4, 5)
    ]
    boxes = [_boxes(rng, 6), _boxes(rng, 5)]
    ref = model(*features, *boxes)
    with fuse_multiscale_roi_align(model):
        assert "forward" in model.pool.__dict__
        fused = model(*features, *boxes)  # eager run of the custom op
    assert "forward" not in model.pool.__dict__
    torch.testing.assert_close(fused, ref, rtol=0, atol=0)


class TopDown(torch.nn.Module):
    """An FPN top-down step: the coarse map upsampled (nearest) to the fine map's own size."""

    def forward(self, fine, coarse):
        return fine + torch.nn.functional.interpolate(coarse, size=fine.shape[-2:], mode="nearest")


def test_upsample_to_a_symbolic_size_vs_eager():
    """``interpolate(size=x.shape[-2:])`` of a program exported with symbolic sizes (TVM's
    converter passed the sizes on as fx nodes); one build, two sizes, as eager."""
    height, width = torch.export.Dim("height", min=2, max=64), torch.export.Dim("width", min=2, max=64)
    fine, coarse = torch.randn(1, 3, 8, 12), torch.randn(1, 3, 4, 6)
    ep = torch.export.export(
        TopDown(), (fine, coarse), dynamic_shapes=({2: 2 * height, 3: 2 * width}, {2: height, 3: width})
    )
    mod = from_exported_program(ep)
    assert "relax.image.resize2d" in _op_names(mod)
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    for size in ((4, 6), (5, 9)):
        fine, coarse = torch.randn(1, 3, 2 * size[0], 2 * size[1]), torch.randn(1, 3, *size)
        got = vm["main"](*[tvm.runtime.tensor(t.numpy()) for t in (fine, coarse)])
        got = (got[0] if not hasattr(got, "numpy") else got).numpy()
        np.testing.assert_array_equal(got, TopDown()(fine, coarse).numpy())
