"""Whole torchvision detectors through ``torch.export``: the data-dependent steps as custom ops.

A whole-model ``torch.export`` of torchvision's Faster / Mask R-CNN fails in ``batched_nms``
(pytorch/vision#9321): NMS, ``remove_small_boxes`` and the score thresholds return as many boxes
as the data says. :class:`~tvm_roialign.frontend.static_rcnn.StaticGeneralizedRCNN` gives those
steps a static form (masks instead of filters, NMS with a static maximum and a valid count, every
size from the model's own caps) and the two data-dependent computations become custom ops that
``torch.export`` records as single nodes:

* ``tvm_roialign::batched_nms`` (below): torchvision's ``batched_nms`` over the boxes marked
  valid, ``keep`` padded to ``max_output`` with ``-1`` plus the ``count``; imported as
  ``relax.vision.batched_nms`` (:mod:`tvm_roialign.ops.nms`) after a stable argsort;
* ``tvm_roialign::multiscale_roi_align`` (:mod:`tvm_roialign.frontend.torch`): the poolers.

Both run eagerly with torchvision's own functions, so the exported program (``ep.module()``)
computes what torchvision computes. :func:`export_detector` exports a model for one input size;
:func:`from_exported_program` imports any program that holds these ops (also one loaded from a
``.pt2`` file: importing this module registers the ops with torch).
"""

from __future__ import annotations

import torch
from torchvision.ops import boxes as box_ops

from ..ops.nms import make_batched_nms
from ..topi.nms import OFFSET_TRICK_MAX_NUMEL
from . import torch as torch_frontend

__all__ = [
    "batched_nms",
    "convert_map",
    "export_detector",
    "from_exported_program",
]


@torch.library.custom_op("tvm_roialign::batched_nms", mutates_args=())
def batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    idxs: torch.Tensor,
    valid: torch.Tensor,
    iou_threshold: float,
    max_output: int,
    offset_trick_max_numel: int = OFFSET_TRICK_MAX_NUMEL,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's ``batched_nms`` over ``boxes[valid]``, in a static form.

    Parameters
    ----------
    boxes, scores, idxs, valid : Tensor
        ``[N, 4]`` float32, ``[N]`` float32, ``[N]`` int (class or level), ``[N]`` bool.
    iou_threshold : float
    max_output : int
        The static cap.
    offset_trick_max_numel : int
        Which of torchvision's two paths runs: the coordinate-offset trick when
        ``4 * valid.sum() <= offset_trick_max_numel`` (torchvision on CPU: 4000), else per-class
        NMS (``-1``: always per class).

    Returns
    -------
    keep : Tensor
        ``[max_output]`` int64: indices into ``boxes`` in decreasing score order, ``-1`` padded.
    count : Tensor
        ``[1]`` int64: the number of kept boxes.
    """
    selected = torch.where(valid)[0]
    args = (boxes[selected], scores[selected], idxs[selected], float(iou_threshold))
    if selected.numel() == 0:
        kept = torch.zeros((0,), dtype=torch.int64)
    elif 0 <= offset_trick_max_numel and selected.numel() * 4 <= offset_trick_max_numel:
        kept = box_ops._batched_nms_coordinate_trick(*args)
    else:
        kept = box_ops._batched_nms_vanilla(*args)
    kept = selected[kept][:max_output]
    keep = torch.full((max_output,), -1, dtype=torch.int64)
    keep[: kept.numel()] = kept
    return keep, torch.tensor([kept.numel()], dtype=torch.int64)


@batched_nms.register_fake
def _batched_nms_fake(
    boxes, scores, idxs, valid, iou_threshold, max_output, offset_trick_max_numel=4000
):
    return boxes.new_empty((max_output,), dtype=torch.int64), boxes.new_empty(
        (1,), dtype=torch.int64
    )


def _convert_batched_nms(node, importer):
    """``tvm_roialign::batched_nms`` -> argsort + ``relax.vision.batched_nms``."""
    args = importer.retrieve_args(node)
    boxes, scores, idxs, valid, iou_threshold, max_output = args[:6]
    trick = int(args[6]) if len(args) > 6 else OFFSET_TRICK_MAX_NUMEL
    return make_batched_nms(
        importer.block_builder,
        boxes,
        scores,
        idxs,
        valid,
        float(iou_threshold),
        int(max_output),
        trick,
    )


def convert_map() -> dict:
    """The converters of this module and of :mod:`tvm_roialign.frontend.torch`."""
    table = torch_frontend.convert_map()
    table["batched_nms.default"] = _convert_batched_nms
    return table


def from_exported_program(exported_program, *, custom_convert_map=None, **kwargs):
    """:func:`tvm_roialign.frontend.from_exported_program` that also converts
    ``tvm_roialign::batched_nms`` (see the module doc)."""
    table = convert_map()
    table.update(custom_convert_map or {})
    return torch_frontend.from_exported_program(
        exported_program, custom_convert_map=table, **kwargs
    )


def export_detector(model, image_size, **static_kwargs):
    """``torch.export`` of a torchvision Faster / Mask R-CNN for one ``(H, W)`` input image.

    ``model`` is wrapped by :class:`~tvm_roialign.frontend.static_rcnn.StaticGeneralizedRCNN`
    (``static_kwargs`` go to it) and exported with its poolers fused. The program takes one
    ``[3, H, W]`` float32 image in ``[0, 1]`` (what the torchvision model takes) and returns
    ``boxes [1, D, 4]``, ``scores [1, D]``, ``labels [1, D]`` (int64), ``masks [1, D, M, M]``
    (Mask R-CNN only: each detection's mask probabilities for its label) and
    ``num_detections [1]`` (int64); rows from ``num_detections`` on are zero.

    Returns
    -------
    (torch.export.ExportedProgram, StaticGeneralizedRCNN)
    """
    from .static_rcnn import StaticGeneralizedRCNN

    static = StaticGeneralizedRCNN(model, image_size, **static_kwargs).eval()
    image = torch.zeros((3, *static.image_size))
    with torch.no_grad(), torch_frontend.fuse_multiscale_roi_align(static):
        program = torch.export.export(static, (image,))
    return program, static
