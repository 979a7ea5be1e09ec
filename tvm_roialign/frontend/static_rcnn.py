"""torchvision's GeneralizedRCNN (Faster / Mask R-CNN) in eval mode, in a static form for export.

:class:`StaticGeneralizedRCNN` wraps an unmodified torchvision model for one input image of a fixed
size and computes, step for step, what ``model([image])`` computes, with every size static:

================================  ==========================================================
torchvision (eval)                static form
================================  ==========================================================
transform: normalize, resize      the same arithmetic; the bilinear resize as two gathers with
(bilinear, ``recompute_scale_     the weights torchvision's CPU kernel computes (constants for
factor``), pad to a multiple      the input size), skipped where the size does not change; the
of ``size_divisible``             padding a constant pad
anchors                           a constant (the anchor generator run once for the size)
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
postprocess: boxes to the         ``resize_boxes`` as torchvision; pasting the masks into the
original size, paste masks        image is left to the caller (a NumPy step of the runner)
================================  ==========================================================

Rows past the valid count are zero (boxes, scores, labels, masks), so they never show. Covered
variants: any ``torchvision.models.detection.FasterRCNN`` / ``MaskRCNN`` (GeneralizedRCNNTransform,
RegionProposalNetwork with an AnchorGenerator, RoIHeads with MultiScaleRoIAlign poolers): the
ResNet-50 FPN v1 and v2 models, MobileNetV3 FPN Faster R-CNN, and users' models built from those
parts with their own backbone, heads or settings. Keypoint R-CNN (keypoint head) is refused, as
are models in training mode and batches of more than one image.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
from torchvision.models.detection.rpn import concat_box_prediction_layers
from torchvision.models.detection.transform import resize_boxes
from torchvision.ops import boxes as box_ops

from ..runtime.bilinear import bilinear_weights
from ..topi.nms import OFFSET_TRICK_MAX_NUMEL

__all__ = ["StaticGeneralizedRCNN", "torch_bilinear_fused"]


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


def _lerp(a, wa, b, wb, fused: bool):
    """``a * wa + b * wb`` in float32; ``fused``: as ``fma(a, wa, b * wb)`` (rounded once after
    the addition, formed in float64), which is how PyTorch's FMA builds evaluate it."""
    if not fused:
        return a * wa + b * wb
    return (a.double() * wa.double() + (b * wb).double()).float()


class _Resize(torch.nn.Module):
    """PyTorch's CPU bilinear interpolation of ``[N, C, H, W]`` to a fixed size, as gathers:
    along the width first, then the height (the order of PyTorch's generic kernel), with the
    source coordinates and the multiply-adds rounded as this PyTorch rounds them (found by
    :meth:`calibrate`). ``float64=False`` (devices without float64, e.g. Metal): plain float32
    multiply-adds, within an ulp of PyTorch's."""

    def __init__(self, in_size, out_size, float64: bool = True):
        super().__init__()
        self.fused = False
        for axis, (n_in, n_out) in zip("hw", zip(in_size, out_size)):
            n_in, n_out = int(n_in), int(n_out)
            i0, i1, l0, l1 = bilinear_weights(
                n_in, n_out, torch_bilinear_fused(n_in, n_out)
            )
            self.register_buffer(f"{axis}_index0", torch.from_numpy(i0))
            self.register_buffer(f"{axis}_index1", torch.from_numpy(i1))
            self.register_buffer(f"{axis}_lambda0", torch.from_numpy(l0))
            self.register_buffer(f"{axis}_lambda1", torch.from_numpy(l1))
        self.exact = self.calibrate(in_size, out_size) if float64 else False

    def calibrate(self, in_size, out_size) -> bool:
        """Pick the rounding of the multiply-adds that reproduces ``F.interpolate`` bit for bit
        on a random image; False (plain float32, within an ulp) when neither does: PyTorch
        resizes a 3-channel image with its separable kernel when it runs on one thread (and
        any image whose output height + width is at most 128), whose weights differ by an ulp."""
        image = torch.rand((1, 3, *in_size), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            expected = F.interpolate(
                image, size=tuple(out_size), mode="bilinear", align_corners=False
            )
            for fused in (True, False):
                self.fused = fused
                if torch.equal(self(image), expected):
                    return True
        return False

    def forward(self, x):
        x = _lerp(
            x.index_select(3, self.w_index0),
            self.w_lambda0,
            x.index_select(3, self.w_index1),
            self.w_lambda1,
            self.fused,
        )
        return _lerp(
            x.index_select(2, self.h_index0),
            self.h_lambda0[:, None],
            x.index_select(2, self.h_index1),
            self.h_lambda1[:, None],
            self.fused,
        )


def _check_model(model) -> None:
    if not isinstance(model, GeneralizedRCNN):
        raise TypeError(
            f"model must be a torchvision GeneralizedRCNN (FasterRCNN, MaskRCNN), got "
            f"{type(model).__name__}"
        )
    if model.training:
        raise ValueError("model must be in eval mode (call model.eval() first)")
    heads = model.roi_heads
    if heads.has_keypoint():
        raise ValueError("Keypoint R-CNN (a keypoint head) is not supported")
    for name in ("box_roi_pool", "box_head", "box_predictor"):
        if getattr(heads, name, None) is None:
            raise ValueError(f"model.roi_heads.{name} is missing")


class StaticGeneralizedRCNN(torch.nn.Module):
    """A torchvision Faster / Mask R-CNN for one ``[3, H, W]`` image of a fixed size, static form.

    Parameters
    ----------
    model : torchvision GeneralizedRCNN
        FasterRCNN or MaskRCNN, eval mode; used as is (parameters shared, nothing modified).
    image_size : (int, int)
        ``(H, W)`` of the input image.
    offset_trick_max_numel : int
        torchvision's switch between its batched-NMS paths (4000: CPU eager; 100000: CUDA eager).
    float64 : bool
        Whether the target has float64 (the resize then rounds exactly as PyTorch; Metal: no).

    ``forward(image)`` takes ``[3, H, W]`` float32 in ``[0, 1]`` and returns ``(boxes [1, D, 4],
    scores [1, D], labels [1, D] int64, masks [1, D, M, M] (Mask R-CNN only), num_detections [1]
    int64)`` with ``D = detections_per_img``; see the module doc.
    """

    def __init__(
        self,
        model,
        image_size,
        offset_trick_max_numel: int = OFFSET_TRICK_MAX_NUMEL,
        float64: bool = True,
    ):
        super().__init__()
        _check_model(model)
        height, width = (int(s) for s in image_size)
        if height < 1 or width < 1:
            raise ValueError(
                f"image_size must be two positive ints (H, W), got {image_size}"
            )
        self.model = model
        self.image_size = (height, width)
        self.offset_trick_max_numel = int(offset_trick_max_numel)
        transform = model.transform
        with torch.no_grad():
            image_list, _ = transform([torch.zeros((3, height, width))])
            self.resized = tuple(int(s) for s in image_list.image_sizes[0])
            self.padded = tuple(int(s) for s in image_list.tensors.shape[-2:])
            features = list(model.backbone(image_list.tensors).values())
            objectness, _ = model.rpn.head(features)
            anchors = model.rpn.anchor_generator(image_list, features)[0]
        self.resize = (
            _Resize(self.image_size, self.resized, float64)
            if self.resized != self.image_size
            else None
        )
        self.register_buffer(
            "mean", torch.as_tensor(transform.image_mean, dtype=torch.float32)
        )
        self.register_buffer(
            "std", torch.as_tensor(transform.image_std, dtype=torch.float32)
        )
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

    # ---------------------------------------------------------------------------------------------
    def _transform(self, image):
        x = (image - self.mean[:, None, None]) / self.std[:, None, None]
        x = x[None]
        if self.resize is not None:
            x = self.resize(x)
        pad_h, pad_w = (
            self.padded[0] - self.resized[0],
            self.padded[1] - self.resized[1],
        )
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        return x

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

    def _proposals(self, features):
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
        boxes = box_ops.clip_boxes_to_image(proposals[top], self.resized)
        widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        valid = (
            (widths >= rpn.min_size)
            & (heights >= rpn.min_size)
            & (scores >= rpn.score_thresh)
        )
        keep, rows, _ = self._nms(
            boxes, scores, self.levels[top], valid, rpn.nms_thresh, self.num_proposals
        )
        return torch.where(rows[:, None], boxes[keep], 0.0), rows

    def _detections(self, features, proposals, rows):
        heads = self.model.roi_heads
        pooled = heads.box_roi_pool(features, [proposals], [self.resized])
        class_logits, box_regression = heads.box_predictor(heads.box_head(pooled))
        num, num_classes = class_logits.shape
        boxes = heads.box_coder.decode_single(box_regression, proposals).reshape(
            num, -1, 4
        )
        scores = F.softmax(class_logits, -1)
        boxes = box_ops.clip_boxes_to_image(boxes, self.resized)
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
        pooled = heads.mask_roi_pool(features, [boxes], [self.resized])
        logits = heads.mask_predictor(heads.mask_head(pooled))
        num, _, height, width = logits.shape
        index = labels.view(num, 1, 1, 1).expand(num, 1, height, width)
        probs = torch.sigmoid(logits.gather(1, index)[:, 0])
        return torch.where(rows[:, None, None], probs, 0.0)

    def forward(self, image):
        features = self.model.backbone(self._transform(image))
        proposals, rows = self._proposals(list(features.values()))
        boxes, scores, labels, det_rows, count = self._detections(
            features, proposals, rows
        )
        outputs = [
            resize_boxes(boxes, self.resized, self.image_size)[None],
            scores[None],
            labels[None],
        ]
        if self.model.roi_heads.has_mask():
            outputs.append(self._masks(features, boxes, labels, det_rows)[None])
        outputs.append(count)
        return tuple(outputs)

    @property
    def has_mask(self) -> bool:
        return bool(self.model.roi_heads.has_mask())

    def output_names(self) -> list[str]:
        names = ["boxes", "scores", "labels"]
        if self.has_mask:
            names.append("masks")
        return [*names, "num_detections"]
