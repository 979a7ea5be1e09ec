"""The three static graphs of Mask R-CNN as exportable torch modules, and their export.

:func:`piece_modules` cuts torchvision's model into ``backbone`` (ResNet-50 + FPN + RPN head),
``box_branch`` and ``mask_branch`` (pooler + head + predictor), sharing the model's parameters.
Two operators are swapped for equivalent forms that TVM compiles better (``rewrite=True``):

* :class:`ConvTranspose2x2` (:mod:`tvm_roialign.models._torch_rewrites`): the mask predictor's
  2x2/stride-2 ``ConvTranspose2d`` as a 1x1 conv and a depth-to-space (the same sums; TVM's
  conv2d_transpose computes over a zero-inserted input, 4x the work, and stays in NCHW);
* :class:`ChannelsLastTwoMLPHead`: in NHWC, the box head flattens the pooled rois channels-last, with
  fc6's columns permuted to match, so that no transpose follows RoIAlign.

:func:`count_permutes` and :func:`permutes_adjacent_to_roi_align` measure what ConvertLayout leaves.
"""

from __future__ import annotations

import numpy as np
import torch
import tvm
from tvm import relax

from .._torch_rewrites import ConvTranspose2x2, conv_transpose_as_conv

_ROI_OPS = ("relax.vision.roi_align", "relax.vision.multiscale_roi_align")
PIECE_NAMES = ("backbone", "box_branch", "mask_branch")


def _to_io(x, nhwc: bool):
    return x.permute(0, 2, 3, 1) if nhwc else x


def _from_io(x, nhwc: bool):
    return x.permute(0, 3, 1, 2) if nhwc else x


class ChannelsLastTwoMLPHead(torch.nn.Module):
    """torchvision's ``TwoMLPHead`` on ``[K, C, H, W]``, flattening in (H, W, C) order."""

    def __init__(self, head, channels: int, size: tuple[int, int]):
        super().__init__()
        h, w = size
        fc6 = head.fc6
        weight = fc6.weight.detach().reshape(-1, channels, h, w).permute(0, 2, 3, 1)
        self.fc6 = torch.nn.Linear(fc6.in_features, fc6.out_features)
        self.fc6.weight = torch.nn.Parameter(
            weight.reshape(fc6.out_features, -1).contiguous(), requires_grad=False
        )
        self.fc6.bias = fc6.bias
        self.fc7 = head.fc7

    def forward(self, x):
        x = x.permute(0, 2, 3, 1).flatten(1)
        return torch.relu(self.fc7(torch.relu(self.fc6(x))))


class MaskPredictor(torch.nn.Module):
    """torchvision's ``MaskRCNNPredictor`` with ``conv5_mask`` as :class:`ConvTranspose2x2`
    (the ReLU inside its depth-to-space)."""

    def __init__(self, predictor):
        super().__init__()
        self.conv5_mask = ConvTranspose2x2(predictor.conv5_mask)
        self.relu = predictor.relu
        self.mask_fcn_logits = predictor.mask_fcn_logits

    def forward(self, x):
        return self.mask_fcn_logits(self.conv5_mask(x, activation=self.relu))


class Backbone(torch.nn.Module):
    """``[1, 3, H, W]`` -> the FPN maps, then objectness and box deltas per level, all in the io layout."""

    def __init__(self, model, nhwc: bool):
        super().__init__()
        self.body = model.backbone
        self.rpn_head = model.rpn.head
        self.nhwc = nhwc

    def forward(self, images):
        feats = list(self.body(images).values())
        objectness, deltas = self.rpn_head(feats)
        return tuple(_to_io(t, self.nhwc) for t in (*feats, *objectness, *deltas))


class Branch(torch.nn.Module):
    """Pooler + head + predictor on the pooler's FPN maps (io layout) and boxes ``[K, 4]``."""

    def __init__(self, pooler, head, predictor, image_size: tuple[int, int], nhwc: bool):
        super().__init__()
        self.pooler, self.head, self.predictor = pooler, head, predictor
        self.image_size = tuple(image_size)
        self.nhwc = nhwc

    def forward(self, p0, p1, p2, p3, boxes):
        maps = (_from_io(p, self.nhwc) for p in (p0, p1, p2, p3))
        pooled = self.pooler(dict(zip(self.pooler.featmap_names, maps)), [boxes], [self.image_size])
        return self.predictor(self.head(pooled))


def piece_modules(model, io_layout: str, image_size: tuple[int, int], rewrite: bool = True):
    """``(backbone, box_branch, mask_branch)`` as torch modules sharing ``model``'s parameters.

    ``io_layout`` is the layout of the feature maps between pieces (NHWC: each piece permutes at
    its edges, and ConvertLayout cancels those permutes); ``image_size`` the padded image
    ``(H, W)`` the poolers scale against; ``rewrite`` swaps in :class:`ConvTranspose2x2` and, in
    NHWC, :class:`ChannelsLastTwoMLPHead` (see the module docstring).
    """
    nhwc = io_layout == "NHWC"
    heads = model.roi_heads
    box_head, mask_predictor = heads.box_head, heads.mask_predictor
    if rewrite:
        if nhwc and hasattr(box_head, "fc6"):
            box_head = ChannelsLastTwoMLPHead(
                box_head, model.backbone.out_channels, tuple(heads.box_roi_pool.output_size)
            )
        if ConvTranspose2x2.applies_to(getattr(mask_predictor, "conv5_mask", None)):
            mask_predictor = MaskPredictor(mask_predictor)
    return (
        Backbone(model, nhwc).eval(),
        Branch(heads.box_roi_pool, box_head, heads.box_predictor, image_size, nhwc).eval(),
        Branch(heads.mask_roi_pool, heads.mask_head, mask_predictor, image_size, nhwc).eval(),
    )


def export_piece(module, args, dynamic_shapes=None):
    """``tvm_roialign.frontend.export`` of one piece: with static shapes, or with the symbolic
    image / feature-map sizes of ``dynamic_shapes`` (``torch.export``'s, by argument name). The
    branches' roi counts are static either way: the model's own roi bounds (1000 proposals, 100
    detections; :func:`static_rois` pads), so that their kernels can be tiled and tuned.

    A branch is run once eagerly first: its pooler works out its scales from the sizes of the
    first maps it sees and keeps them (torchvision's own caching), so that the export does not
    specialise the symbolic sizes on that arithmetic; the scales (1/4 ... 1/32) do not depend on
    the image size."""
    from ... import frontend

    with torch.no_grad():
        if dynamic_shapes is not None and isinstance(module, Branch):
            module(*args)
        return frontend.export(module, tuple(args), dynamic_shapes=dynamic_shapes)


def static_rois(rois: np.ndarray, count: int) -> np.ndarray:
    """``rois [K, 4]`` padded with zero boxes to ``[count, 4]`` (``K <= count``); the rows past
    ``K`` of a branch's outputs are to be dropped."""
    if rois.shape[0] > count:
        raise ValueError(f"{rois.shape[0]} rois for a branch compiled for at most {count}")
    padded = np.zeros((count, 4), dtype="float32")
    padded[: rois.shape[0]] = rois
    return padded


# --------------------------------------------------------------------------------------------------
# what ConvertLayout leaves: transposes, and those next to RoIAlign


def count_permutes(mod: tvm.IRModule) -> int:
    """Number of ``relax.permute_dims`` calls in the Relax functions of ``mod``."""
    return _scan(mod)[0]


def permutes_adjacent_to_roi_align(mod: tvm.IRModule) -> int:
    """Number of ``permute_dims`` whose output feeds, or whose input is, a RoIAlign op's value."""
    return _scan(mod)[1]


def _scan(mod: tvm.IRModule) -> tuple[int, int]:
    bindings: dict = {}
    calls = []
    for _gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                    bindings[binding.var] = value
                    calls.append(value)
    permutes = [c for c in calls if c.op.name == "relax.permute_dims"]
    adjacent = 0
    for call in calls:
        if call.op.name in _ROI_OPS:
            for arg in call.args:
                src = bindings.get(arg)
                if src is not None and src.op.name == "relax.permute_dims":
                    adjacent += 1
    for perm in permutes:
        src = bindings.get(perm.args[0])
        if src is not None and src.op.name in _ROI_OPS:
            adjacent += 1
    return len(permutes), adjacent


__all__ = [
    "PIECE_NAMES",
    "Backbone",
    "Branch",
    "ChannelsLastTwoMLPHead",
    "ConvTranspose2x2",
    "MaskPredictor",
    "conv_transpose_as_conv",
    "count_permutes",
    "export_piece",
    "permutes_adjacent_to_roi_align",
    "piece_modules",
]
