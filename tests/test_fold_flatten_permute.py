"""FoldFlattenPermute: after ConvertLayout to NHWC, a box head's flatten + dense layer leaves no
transpose behind RoIAlign (the transpose moves into the constant weight)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision
from tvm import relax

from tvm_roialign.frontend import export, from_exported_program
from tvm_roialign.passes import ConvertLayout, FoldFlattenPermute
from tvm_roialign.testing import compile_and_run
from tvm_roialign.testing import op_calls as _ops

NHWC = {"nn.conv2d": ["NHWC", "default"], "vision.roi_align": ["NHWC", "default"]}


def _first(result):
    return result[0] if isinstance(result, list) else result


class _Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 5 * 4, 6)

    def forward(self, x, rois):
        pooled = torchvision.ops.roi_align(self.conv(x), rois, (5, 4), 0.5, 2, True)
        return torch.relu(self.fc(pooled.flatten(1)))


@pytest.fixture(scope="module")
def head():
    torch.manual_seed(0)
    model = _Head().eval()
    x = torch.randn(1, 3, 16, 16)
    rois = torch.tensor([[0, 1, 2, 20, 24.0], [0, 0, 0, 31, 31], [0, 5, 3, 9, 30]])
    return model, x, rois


@pytest.mark.parametrize("fold_constants_first", [False, True])
def test_transpose_moves_into_the_weight(head, fold_constants_first):
    model, x, rois = head
    mod = from_exported_program(
        torch.export.export(model, (x, rois)), keep_params_as_input=False
    )
    if (
        fold_constants_first
    ):  # the weight is a constant; otherwise permute_dims(constant)
        mod = relax.transform.FoldConstant()(mod)
    converted = relax.transform.FoldConstant()(ConvertLayout(NHWC)(mod))
    # the only transpose left is the input image's NCHW -> NHWC
    permutes = _ops(converted, "relax.permute_dims")
    assert len(permutes) == 1, permutes
    assert [int(a) for a in permutes[0].attrs.axes] == [0, 2, 3, 1]
    (roi_align,) = _ops(converted, "relax.vision.roi_align")
    assert str(roi_align.attrs.layout) == "NHWC"
    expected = model(x, rois).detach().numpy()
    got = _first(compile_and_run(converted, [x.numpy(), rois.numpy()]))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_unchanged_without_constant_weight(head):
    """Weights as function inputs: nothing to fold into; the pass returns the same module."""
    model, x, rois = head
    mod = from_exported_program(
        torch.export.export(model, (x, rois))
    )  # weights are inputs
    converted = ConvertLayout(NHWC)(mod)
    assert FoldFlattenPermute()(converted).same_as(converted)
    (roi_align,) = _ops(converted, "relax.vision.roi_align")
    assert (
        str(roi_align.attrs.layout) == "NHWC"
    )  # the transpose after it stays (correct flatten)


def test_faster_rcnn_box_branch_has_no_transpose_after_roi_align():
    """torchvision's Faster R-CNN box branch (MultiScaleRoIAlign + TwoMLPHead + predictor), weights
    as constants: in NHWC no transpose follows the fused RoIAlign, and the outputs match eager."""
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_resnet50_fpn(
        weights=None, weights_backbone=None
    ).eval()
    heads = model.roi_heads

    class BoxBranch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pool, self.head, self.predictor = (
                heads.box_roi_pool,
                heads.box_head,
                heads.box_predictor,
            )

        def forward(self, p0, p1, p2, p3, boxes):
            feats = {"0": p0, "1": p1, "2": p2, "3": p3}
            return self.predictor(self.head(self.pool(feats, [boxes], [(128, 128)])))

    branch = BoxBranch().eval()
    feats = [torch.randn(1, 256, 128 // s, 128 // s) for s in (4, 8, 16, 32)]
    boxes = torch.tensor(
        [[1.0, 2.0, 30.0, 40.0], [0.0, 0.0, 127.0, 120.0], [50, 60, 70, 66.0]]
    )
    with torch.no_grad():
        expected = [t.numpy() for t in branch(*feats, boxes)]
        program = export(branch, (*feats, boxes))
    mod = relax.transform.FoldConstant()(
        from_exported_program(program, keep_params_as_input=False)
    )
    desired = {**NHWC, "vision.multiscale_roi_align": ["NHWC", "default"]}
    converted = relax.transform.FoldConstant()(ConvertLayout(desired)(mod))
    (pooler,) = _ops(converted, "relax.vision.multiscale_roi_align")
    consumers = [
        call
        for call in _ops(converted, "relax.permute_dims")
        if any(arg.same_as(pooler) for arg in call.args)
    ]
    assert not consumers
    # transposes left: the four feature maps' NCHW -> NHWC at the graph inputs
    assert len(_ops(converted, "relax.permute_dims")) == 4
    got = compile_and_run(converted, [f.numpy() for f in feats] + [boxes.numpy()])
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)
