"""torchvision's GeneralizedRCNN (Faster / Mask R-CNN) in eval mode, in a static form for export.

:class:`StaticGeneralizedRCNN` wraps an unmodified torchvision model for one padded image size
(the batched tensor torchvision's transform makes) and computes, step for step, what the model
computes after its transform, with every size static:

================================  ==========================================================
torchvision (eval)                static form
================================  ==========================================================
transform: normalize, resize      the caller's (:mod:`tvm_roialign.runtime.transform`, NumPy,
(bilinear, ``recompute_scale_     as torchvision computes it); the form takes the padded
factor``), pad to a multiple      image and the resized ``(h, w)`` inside it, which the clips
of ``size_divisible``             use at run time
anchors                           a constant (the anchor generator run once for the padded size)
RPN: per-level top-k, sigmoid,    top-k with ``k = min(pre_nms_top_n, anchors of the level)``;
clip, ``remove_small_boxes``,     ``remove_small_boxes`` and the score threshold become a mask;
score threshold, batched NMS,     ``tvm_roialign::batched_nms`` keeps at most
``[:post_nms_top_n]``             ``post_nms_top_n`` boxes plus a count; the rest are zero rows
RoIHeads: pooler, box head,       the same modules on the ``post_nms_top_n`` rows; softmax,
predictor, decode (weights),      decode, clip, background dropped, ``score > box_score_thresh``
clip, thresholds, batched NMS,    and ``remove_small_boxes(1e-2)`` as a mask, batched NMS with
``[:detections_per_img]``         the cap ``detections_per_img``
mask head, ``maskrcnn_inference`` the mask branch on ``detections_per_img`` rows; each row's
                                  mask logits of its label, sigmoid
keypoint head (Keypoint R-CNN)    the keypoint branch on those rows: its heatmaps
postprocess: boxes to the         the caller's: boxes come in the resized image's pixels;
original size, paste masks        the runner maps and pastes them as torchvision does
================================  ==========================================================

Rows past the valid count are zero (boxes, scores, labels, masks), so they never show. Covered
variants: any ``torchvision.models.detection.FasterRCNN`` / ``MaskRCNN`` (GeneralizedRCNNTransform,
RegionProposalNetwork with an AnchorGenerator, RoIHeads with MultiScaleRoIAlign poolers): the
ResNet-50 FPN v1 and v2 models, MobileNetV3 FPN Faster R-CNN, and users' models built from those
parts with their own backbone, heads or settings, and Keypoint R-CNN (its keypoint branch gives
the heatmaps; the runner finds the keypoints in them as ``heatmaps_to_keypoints`` does). Refused:
models in training mode and ones with a ``fixed_size`` transform. The poolers infer their
scales from the padded size: torchvision infers them from the batch's largest resized height,
which gives the same scales down to :func:`tvm_roialign.runtime.transform.pooler_scales`' bound
(the runner refuses a batch below it).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.rpn import concat_box_prediction_layers

from ..runtime.bilinear import bilinear_weights
from ..topi.nms import OFFSET_TRICK_MAX_NUMEL

__all__ = ["StaticGeneralizedRCNN", "SymbolicGeneralizedRCNN", "torch_bilinear_fused"]


def torch_bilinear_fused(in_size: int, out_size: int) -> bool:
    """Whether this PyTorch's CPU bilinear resize ``in_size -> out_size`` computes its source
    coordinates with a fused multiply-add (see :func:`bilinear_weights`), found by resizing the
    rows of an identity matrix. Raises RuntimeError if neither form matches."""
    eye = torch.eye(in_size).reshape(in_size, 1, 1, in_size)
    with torch.no_grad():
        probe = F.interpolate(
            eye, size=(1, out_size), mode="bilinear", align_corners=False
        )
    probe = probe[:, 0, 0, :].numpy()
    columns = np.arange(out_size)
    for fused in (True, False):
        index0, index1, lambda0, lambda1 = bilinear_weights(in_size, out_size, fused)
        expected = np.zeros_like(probe)
        np.add.at(expected, (index0, columns), lambda0)
        np.add.at(expected, (index1, columns), lambda1)
        if np.array_equal(expected, probe):
            return fused
    raise RuntimeError(
        f"PyTorch's bilinear resize {in_size} -> {out_size} matches neither known form"
    )


def _check_model(model) -> None:
    if not isinstance(model, GeneralizedRCNN):
        raise TypeError(
            f"model must be a torchvision GeneralizedRCNN (FasterRCNN, MaskRCNN), got "
            f"{type(model).__name__}"
        )
    if model.training:
        raise ValueError("model must be in eval mode (call model.eval() first)")
    if getattr(model.transform, "fixed_size", None) is not None:
        raise ValueError("a transform with fixed_size is not supported (min_size / max_size are)")
    heads = model.roi_heads
    for name in ("box_roi_pool", "box_head", "box_predictor"):
        if getattr(heads, name, None) is None:
            raise ValueError(f"model.roi_heads.{name} is missing")


def _clip(boxes, image_size):
    """``clip_boxes_to_image(boxes, (h, w))`` with ``image_size = [h, w]`` a float32 tensor (the
    same clamps: ``[0, w]`` for x, ``[0, h]`` for y)."""
    low = torch.zeros((), dtype=boxes.dtype)
    x = torch.minimum(torch.maximum(boxes[..., 0::2], low), image_size[1])
    y = torch.minimum(torch.maximum(boxes[..., 1::2], low), image_size[0])
    return torch.stack((x, y), dim=boxes.dim()).reshape(boxes.shape)


class StaticGeneralizedRCNN(torch.nn.Module):
    """A torchvision Faster / Mask R-CNN for one padded image size, in the static form.

    Parameters
    ----------
    model : torchvision GeneralizedRCNN
        FasterRCNN or MaskRCNN, eval mode; used as is (parameters shared, nothing modified).
    padded_size : (int, int)
        ``(Hp, W p)`` of the batched image tensor that torchvision's transform makes (a multiple
        of ``size_divisible``; :func:`tvm_roialign.runtime.transform.padded_size`).
    offset_trick_max_numel : int
        torchvision's switch between its batched-NMS paths (4000: CPU eager; 100000: CUDA eager).

    ``forward(images, image_size)`` takes ``images [1, 3, Hp, Wp]`` float32, what
    GeneralizedRCNNTransform makes of a photo (normalized, resized, zero-padded), and
    ``image_size [2]`` float32, the resized ``(h, w)`` inside the padding; it returns ``(boxes
    [1, D, 4]`` (in the resized image's pixels, as torchvision's before its postprocess),
    ``scores [1, D], labels [1, D] int64, masks [1, D, M, M]`` (Mask R-CNN only),
    ``num_detections [1]`` int64) with ``D = detections_per_img``; see the module doc.
    """

    def __init__(
        self,
        model,
        padded_size,
        offset_trick_max_numel: int = OFFSET_TRICK_MAX_NUMEL,
        float64: bool = True,
    ):
        super().__init__()
        _check_model(model)
        height, width = (int(s) for s in padded_size)
        divisible = int(model.transform.size_divisible)
        if height < 1 or width < 1 or height % divisible or width % divisible:
            raise ValueError(
                f"padded_size must be two positive multiples of size_divisible={divisible} "
                f"(Hp, Wp), got {tuple(padded_size)}"
            )
        self.model = model
        self.padded = (height, width)
        self.offset_trick_max_numel = int(offset_trick_max_numel)
        with torch.no_grad():
            image_list = ImageList(torch.zeros((1, 3, height, width)), [self.padded])
            named = model.backbone(image_list.tensors)
            features = list(named.values())
            objectness, _ = model.rpn.head(features)
            anchors = model.rpn.anchor_generator(image_list, features)[0]
        self.feature_heights = {n: int(f.shape[-2]) for n, f in named.items()}
        self.register_buffer("anchors", anchors)
        per_level = [int(o[0].numel()) for o in objectness]
        self.level_sizes = per_level
        self.register_buffer(
            "levels",
            torch.cat(
                [
                    torch.full((n,), i, dtype=torch.int64)
                    for i, n in enumerate(per_level)
                ]
            ),
        )
        rpn = model.rpn
        self.top_n = [min(int(rpn._pre_nms_top_n["testing"]), n) for n in per_level]
        self.num_proposals = int(rpn._post_nms_top_n["testing"])
        self.num_detections = int(model.roi_heads.detections_per_img)

    def pooler_feature_heights(self) -> list[list[int]]:
        """Per pooler of the heads, the heights of the feature maps it pools from (what
        torchvision infers its scales from, with the batch's largest resized height): the maps
        the backbone returns whose names the pooler lists, in the backbone's order, as the pooler
        filters them (a backbone may return fewer levels than the pooler names)."""
        heights = self.feature_heights
        return [
            [h for n, h in heights.items() if n in pooler.featmap_names]
            for pooler in self._poolers()
        ]

    def pooler_strides(self) -> list[list[int]]:
        """Per pooler of the heads, the stride of each feature map it pools from."""
        return [[self.padded[0] // h for h in heights] for heights in self.pooler_feature_heights()]

    def min_height(self) -> int:
        """The smallest largest-resized-height of a batch for which torchvision's poolers infer
        the scales this form uses (those of the padded height)."""
        from ..runtime.transform import min_height_for_scales

        return min_height_for_scales(
            self.pooler_feature_heights(),
            self.padded[0],
            int(self.model.transform.size_divisible),
        )

    def _poolers(self):
        heads = self.model.roi_heads
        names = ("box_roi_pool", "mask_roi_pool", "keypoint_roi_pool")
        return [getattr(heads, n) for n in names if getattr(heads, n, None) is not None]

    # ---------------------------------------------------------------------------------------------
    def _nms(self, boxes, scores, idxs, valid, iou_threshold, max_output):
        keep, count = torch.ops.tvm_roialign.batched_nms(
            boxes,
            scores,
            idxs,
            valid,
            float(iou_threshold),
            int(max_output),
            self.offset_trick_max_numel,
        )
        rows = torch.arange(max_output) < count
        return torch.where(rows, keep, 0), rows, count

    def _proposals(self, features, image_size, images=None):
        rpn = self.model.rpn
        objectness, deltas = rpn.head(features)
        objectness, deltas = concat_box_prediction_layers(objectness, deltas)
        proposals = rpn.box_coder.decode_single(deltas.detach(), self.anchors)
        objectness = objectness.reshape(1, -1)
        top, offset = [], 0
        for size, k in zip(self.level_sizes, self.top_n):
            _, index = objectness[:, offset : offset + size].topk(k, dim=1)
            top.append(index + offset)
            offset += size
        top = torch.cat(top, dim=1)[0]
        scores = torch.sigmoid(objectness[0][top])
        return self._kept_proposals(proposals[top], scores, self.levels[top], image_size)

    def _kept_proposals(self, boxes, scores, levels, image_size, candidates=None):
        """The RPN's filter on the top-k boxes: clip, ``remove_small_boxes`` and the score
        threshold as a mask (and ``candidates``, the rows that are real entries), then the NMS
        per level; the kept boxes, zero rows past the count, and the rows' mask."""
        rpn = self.model.rpn
        boxes = _clip(boxes, image_size)
        widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        valid = (
            (widths >= rpn.min_size)
            & (heights >= rpn.min_size)
            & (scores >= rpn.score_thresh)
        )
        if candidates is not None:
            valid = candidates & valid
        keep, rows, _ = self._nms(
            boxes, scores, levels, valid, rpn.nms_thresh, self.num_proposals
        )
        return torch.where(rows[:, None], boxes[keep], 0.0), rows

    def _detections(self, features, proposals, rows, image_size):
        heads = self.model.roi_heads
        pooled = heads.box_roi_pool(features, [proposals], [self.padded])
        class_logits, box_regression = heads.box_predictor(heads.box_head(pooled))
        num, num_classes = class_logits.shape
        boxes = heads.box_coder.decode_single(box_regression, proposals).reshape(
            num, -1, 4
        )
        scores = F.softmax(class_logits, -1)
        boxes = _clip(boxes, image_size)
        labels = torch.arange(num_classes).view(1, -1).expand_as(scores)
        boxes = boxes[:, 1:].reshape(-1, 4)
        scores = scores[:, 1:].reshape(-1)
        labels = labels[:, 1:].reshape(-1)
        widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        valid = (
            rows[:, None].expand(num, num_classes - 1).reshape(-1)
            & (scores > heads.score_thresh)
            & (widths >= 1e-2)
            & (heights >= 1e-2)
        )
        keep, det_rows, count = self._nms(
            boxes, scores, labels, valid, heads.nms_thresh, self.num_detections
        )
        boxes = torch.where(det_rows[:, None], boxes[keep], 0.0)
        scores = torch.where(det_rows, scores[keep], 0.0)
        labels = torch.where(det_rows, labels[keep], 0)
        return boxes, scores, labels, det_rows, count

    def _masks(self, features, boxes, labels, rows):
        heads = self.model.roi_heads
        pooled = heads.mask_roi_pool(features, [boxes], [self.padded])
        logits = heads.mask_predictor(heads.mask_head(pooled))
        num, _, height, width = logits.shape
        index = labels.view(num, 1, 1, 1).expand(num, 1, height, width)
        probs = torch.sigmoid(logits.gather(1, index)[:, 0])
        return torch.where(rows[:, None, None], probs, 0.0)

    def _keypoints(self, features, boxes, rows):
        """The keypoint branch's heatmaps ``[D, K, 56, 56]`` (logits; zero rows past the count):
        ``heatmaps_to_keypoints`` resizes them to each box's size, which is the runner's
        (:func:`tvm_roialign.runtime.keypoints.heatmaps_to_keypoints`)."""
        heads = self.model.roi_heads
        pooled = heads.keypoint_roi_pool(features, [boxes], [self.padded])
        logits = heads.keypoint_predictor(heads.keypoint_head(pooled))
        return torch.where(rows[:, None, None, None], logits, 0.0)

    def forward(self, images, image_size):
        features = self.model.backbone(images)
        proposals, rows = self._proposals(list(features.values()), image_size, images)
        boxes, scores, labels, det_rows, count = self._detections(
            features, proposals, rows, image_size
        )
        outputs = [boxes[None], scores[None], labels[None]]
        if self.model.roi_heads.has_mask():
            outputs.append(self._masks(features, boxes, labels, det_rows)[None])
        if self.model.roi_heads.has_keypoint():
            outputs.append(self._keypoints(features, boxes, det_rows)[None])
        outputs.append(count)
        return tuple(outputs)

    @property
    def has_mask(self) -> bool:
        return bool(self.model.roi_heads.has_mask())

    def output_names(self) -> list[str]:
        names = ["boxes", "scores", "labels"]
        if self.has_mask:
            names.append("masks")
        if self.model.roi_heads.has_keypoint():
            names.append("keypoint_heatmaps")
        return [*names, "num_detections"]


def _length(vector):
    """The number of elements of a 1-D ``vector`` as an int64 tensor: a length from a tensor, not
    from a symbolic size (a size in the arithmetic of the graph would reach Relax as a scalar
    argument of a tensor op, which its ConvertLayout cannot take)."""
    return torch.ones_like(vector, dtype=torch.int64).sum()


class SymbolicGeneralizedRCNN(StaticGeneralizedRCNN):
    """The static form for any padded image size: one program for every photo.

    What differs from :class:`StaticGeneralizedRCNN` (same inputs, outputs and results):

    * the anchors are computed in the graph from the feature maps' sizes, as torchvision's
      ``AnchorGenerator`` computes them (the stride of a level is ``padded // grid``, which for
      the pooled level of an odd ``padded / 32`` is not 64);
    * each level's objectness is followed by ``pre_nms_top_n`` entries of ``-inf`` before its
      top-k, so that ``k = pre_nms_top_n`` is static and the ``min(pre_nms_top_n, anchors)``
      real entries come first, in the same order; the padding entries are marked invalid, so
      that the NMS (over ``levels x pre_nms_top_n`` rows) keeps what torchvision's keeps and
      takes torchvision's path by the count of the valid ones, as it does;
    * the poolers' scales are those of ``reference_size`` (the scales torchvision infers and
      caches on its first call; the runner checks that a photo gets the same ones:
      :func:`tvm_roialign.runtime.transform.min_height_for_scales`).
    """

    def __init__(
        self,
        model,
        reference_size=(512, 384),
        offset_trick_max_numel: int = OFFSET_TRICK_MAX_NUMEL,
        float64: bool = True,
    ):
        super().__init__(model, reference_size, offset_trick_max_numel, float64)
        self.top_k = int(model.rpn._pre_nms_top_n["testing"])
        num_levels = len(self.level_sizes)
        self.register_buffer("levels", torch.arange(num_levels).repeat_interleave(self.top_k))
        self.register_buffer("pad_objectness", torch.full((1, self.top_k), float("-inf")))
        self.register_buffer("pad_boxes", torch.zeros((self.top_k, 4)))
        with torch.no_grad():  # the poolers infer their scales once, at the reference size
            features = model.backbone(torch.zeros((1, 3, *self.padded)))
            for pooler in self._poolers():
                pooler(features, [torch.zeros((1, 4))], [self.padded])

    def _anchors(self, features, images) -> list:
        generator = self.model.rpn.anchor_generator
        image_height = _length(images[0, 0, :, 0])
        image_width = _length(images[0, 0, 0, :])
        anchors = []
        for feature, cell in zip(features, generator.cell_anchors):
            height, width = feature.shape[-2:]
            ys = torch.arange(height, dtype=torch.int64)
            xs = torch.arange(width, dtype=torch.int64)
            ys = ys * (image_height // _length(feature[0, 0, :, 0]))
            xs = xs * (image_width // _length(feature[0, 0, 0, :]))
            rows, columns = torch.meshgrid(ys, xs, indexing="ij")
            rows, columns = rows.reshape(-1), columns.reshape(-1)
            shifts = torch.stack((columns, rows, columns, rows), dim=1)
            cell = cell.to(features[0].dtype)
            anchors.append((shifts.view(-1, 1, 4) + cell.view(1, -1, 4)).reshape(-1, 4))
        return anchors

    def _proposals(self, features, image_size, images=None):
        rpn = self.model.rpn
        objectness, deltas = rpn.head(features)
        values, boxes = [], []
        for logits, level_deltas, anchors in zip(
            objectness, deltas, self._anchors(features, images)
        ):
            batch, per_cell, height, width = logits.shape
            logits = logits.permute(0, 2, 3, 1).reshape(1, -1)
            level_deltas = level_deltas.view(batch, per_cell, 4, height, width)
            level_deltas = level_deltas.permute(0, 3, 4, 1, 2).reshape(-1, 4)
            decoded = rpn.box_coder.decode_single(level_deltas.detach(), anchors)
            logits = torch.cat([logits, self.pad_objectness], dim=1)
            decoded = torch.cat([decoded, self.pad_boxes], dim=0)
            top, index = logits.topk(self.top_k, dim=1)
            values.append(top[0])
            boxes.append(decoded[index[0]])
        values = torch.cat(values)
        return self._kept_proposals(
            torch.cat(boxes), torch.sigmoid(values), self.levels, image_size,
            candidates=values > float("-inf"),
        )
