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
computes what torchvision computes. :func:`export_detector` exports a model for one padded image size;
:func:`from_exported_program` imports any program that holds these ops (also one loaded from a
``.pt2`` file: importing this module registers the ops with torch).
"""

from __future__ import annotations

import torch
from torchvision.ops import boxes as box_ops

from ..ops.nms import make_batched_nms
from ..passes.wrap_takes import WrapTakes
from ..topi.nms import OFFSET_TRICK_MAX_NUMEL
from . import torch as torch_frontend

__all__ = [
    "ANY_SIDES",
    "batched_nms",
    "convert_map",
    "export_detector",
    "from_exported_program",
    "settings_of_tensor",
    "settings_tensor",
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
    mod = torch_frontend.from_exported_program(exported_program, custom_convert_map=table, **kwargs)
    return WrapTakes()(mod)


#: The padded sides (pixels) a program for any size (``padded_size="any"``) takes: torch.export
#: specialises a side whose pooled feature map (stride 64) would have one row, below 65.
ANY_SIDES = (96, 4096)


def export_detector(model, padded_size, **static_kwargs):
    """``torch.export`` of a torchvision Faster / Mask R-CNN for one padded image size, or for
    any (``padded_size="any"``: a symbolic height and width within :data:`ANY_SIDES`,
    :class:`~tvm_roialign.frontend.static_rcnn.SymbolicGeneralizedRCNN`).

    ``model`` is wrapped by :class:`~tvm_roialign.frontend.static_rcnn.StaticGeneralizedRCNN`
    (``static_kwargs`` go to it) and exported with its poolers fused. The program takes
    ``images [1, 3, Hp, Wp]`` float32 (a photo after torchvision's transform: normalized,
    resized, zero-padded; :class:`tvm_roialign.runtime.transform.TransformSettings`) and
    ``image_size [2]`` float32 (the resized ``(h, w)``), and returns ``boxes [1, D, 4]`` (in the
    resized image's pixels), ``scores [1, D]``, ``labels [1, D]`` (int64), ``masks [1, D, M, M]``
    (Mask R-CNN only: each detection's mask probabilities for its label) and ``num_detections
    [1]`` (int64); rows from ``num_detections`` on are zero. The transform's settings travel in
    the program as the buffer ``transform_settings`` (see :func:`settings_tensor`), and the
    smallest largest-resized-height it serves (:meth:`StaticGeneralizedRCNN.min_height`) as
    ``min_resized_height`` (0 for any size: the runner works it out per padded size). A program
    for any size imports from memory; ``torch.export.load`` of one saved to a file fails in
    torch's own decompositions (its sizes are expressions), so it is not a ``.pt2`` to compile.

    Returns
    -------
    (torch.export.ExportedProgram, StaticGeneralizedRCNN)
    """
    from torch.export import Dim

    from .static_rcnn import StaticGeneralizedRCNN, SymbolicGeneralizedRCNN, torch_bilinear_fused

    symbolic = isinstance(padded_size, str)
    if symbolic and padded_size != "any":
        raise ValueError(f"padded_size must be (Hp, Wp) or 'any', got {padded_size!r}")
    if symbolic:
        static = SymbolicGeneralizedRCNN(model, **static_kwargs).eval()
        low, high = ANY_SIDES
        dynamic = {
            "images": {2: Dim("height", min=low, max=high), 3: Dim("width", min=low, max=high)},
            "image_size": None,
        }
    else:
        static = StaticGeneralizedRCNN(model, padded_size, **static_kwargs).eval()
        dynamic = None
    static.register_buffer(
        "transform_settings", settings_tensor(model.transform, torch_bilinear_fused(30, 57))
    )
    lowest = 0 if symbolic else static.min_height()
    static.register_buffer("min_resized_height", torch.tensor(lowest, dtype=torch.int64))
    args = (torch.zeros((1, 3, *static.padded)), torch.tensor(static.padded, dtype=torch.float32))
    with torch.no_grad(), torch_frontend.fuse_multiscale_roi_align(static):
        program = torch.export.export(static, args, dynamic_shapes=dynamic)
    return program, static


def settings_tensor(transform, resize_fma: bool) -> torch.Tensor:
    """GeneralizedRCNNTransform's eval settings as float64 ``[min_size, max_size,
    size_divisible, mean (3), std (3), resize_fma]`` (a buffer of the exported program)."""
    values = [
        float(transform.min_size[-1]),
        float(transform.max_size),
        float(transform.size_divisible),
        *(float(v) for v in transform.image_mean),
        *(float(v) for v in transform.image_std),
        float(bool(resize_fma)),
    ]
    return torch.tensor(values, dtype=torch.float64)


def settings_of_tensor(values) -> dict:
    """:func:`settings_tensor`'s values as ``TransformSettings.to_dict()``."""
    v = [float(x) for x in values]
    return {
        "min_size": int(v[0]),
        "max_size": int(v[1]),
        "size_divisible": int(v[2]),
        "image_mean": v[3:6],
        "image_std": v[6:9],
        "resize_fma": bool(v[9]),
    }
