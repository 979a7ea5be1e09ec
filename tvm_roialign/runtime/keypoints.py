"""Keypoint R-CNN's ``heatmaps_to_keypoints`` (torchvision, eval) in NumPy.

Each detection's ``[K, 56, 56]`` heatmap logits are resized (bicubic, ``align_corners=False``,
as PyTorch's CPU kernel: ``A = -0.75``, source index ``scale * (dst + 0.5) - 0.5`` with ``scale =
in / out``, taps clamped to the edges; along the width, then the height) to the box's size
rounded up, and each keypoint is the first maximum: ``x = (column + 0.5) * width / ceil(width) +
x1`` (likewise ``y``), its score the maximum. The box size depends on the detection, so this step
is the runner's, not the artifact's. NumPy only: this module must stay importable without PyTorch.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "COCO_KEYPOINT_NAMES",
    "COCO_PERSON_CATEGORIES",
    "COCO_SKELETON",
    "bicubic_weights",
    "heatmaps_to_keypoints",
    "resize_bicubic",
]

#: The 17 keypoints of a COCO person, in the order of COCO's annotations (index = keypoint).
COCO_KEYPOINT_NAMES = (
    "nose",
    "left_eye",
    "right_eye",
    "left_ear",
    "right_ear",
    "left_shoulder",
    "right_shoulder",
    "left_elbow",
    "right_elbow",
    "left_wrist",
    "right_wrist",
    "left_hip",
    "right_hip",
    "left_knee",
    "right_knee",
    "left_ankle",
    "right_ankle",
)

#: COCO's person skeleton: pairs of indices of :data:`COCO_KEYPOINT_NAMES` joined by a limb.
COCO_SKELETON = (
    (15, 13), (13, 11), (16, 14), (14, 12), (11, 12),  # legs and hips
    (5, 11), (6, 12), (5, 6),  # torso
    (5, 7), (6, 8), (7, 9), (8, 10),  # arms
    (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6),  # head to shoulders
)

#: The labels of a person-keypoint detector (two classes: background and person).
COCO_PERSON_CATEGORIES = ("__background__", "person")

_A = np.float32(-0.75)


def _cubic1(x):  # |x| <= 1
    return ((_A + np.float32(2)) * x - (_A + np.float32(3))) * x * x + np.float32(1)


def _cubic2(x):  # 1 < |x| < 2
    return ((_A * x - np.float32(5) * _A) * x + np.float32(8) * _A) * x - np.float32(4) * _A


def bicubic_weights(in_size: int, out_size: int):
    """``(indices [out, 4], weights [out, 4])`` of PyTorch's bicubic resize along one axis."""
    f32 = np.float32
    scale = f32(in_size) / f32(out_size)
    real = scale * (np.arange(out_size, dtype=f32) + f32(0.5)) - f32(0.5)
    start = np.floor(real).astype(np.int64)
    t = (real - start.astype(f32)).astype(f32)
    weights = np.stack(
        [_cubic2(t + f32(1)), _cubic1(t), _cubic1(f32(1) - t), _cubic2(f32(2) - t)], axis=1
    ).astype(f32)
    indices = np.clip(start[:, None] + np.arange(-1, 3)[None, :], 0, in_size - 1)
    return indices, weights


def _interp(values, weights):
    """``x0 * w0 + x1 * w1 + x2 * w2 + x3 * w3`` in float32, PyTorch's order."""
    out = values[0] * weights[0]
    for i in range(1, 4):
        out = (out + values[i] * weights[i]).astype(np.float32)
    return out


def resize_bicubic(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """``array [..., H, W]`` float32 resized to ``[..., height, width]`` (bicubic)."""
    array = np.asarray(array, np.float32)
    wi, ww = bicubic_weights(array.shape[-1], width)
    x = _interp([array[..., wi[:, k]] for k in range(4)], [ww[:, k] for k in range(4)])
    hi, hw = bicubic_weights(array.shape[-2], height)
    return _interp(
        [x[..., hi[:, k], :] for k in range(4)], [hw[:, k, None] for k in range(4)]
    )


def heatmaps_to_keypoints(maps: np.ndarray, boxes: np.ndarray):
    """``(keypoints [n, K, 3], scores [n, K])`` of ``maps [n, K, M, M]`` heatmap logits and their
    ``boxes [n, 4]`` (the resized image's pixels), as torchvision's ``heatmaps_to_keypoints``."""
    maps = np.asarray(maps, np.float32)
    boxes = np.asarray(boxes, np.float32)
    count, num_keypoints = maps.shape[:2]
    keypoints = np.zeros((count, num_keypoints, 3), np.float32)
    scores = np.zeros((count, num_keypoints), np.float32)
    widths = np.maximum(boxes[:, 2] - boxes[:, 0], np.float32(1))
    heights = np.maximum(boxes[:, 3] - boxes[:, 1], np.float32(1))
    for i in range(count):
        roi_w, roi_h = int(np.ceil(widths[i])), int(np.ceil(heights[i]))
        roi_map = resize_bicubic(maps[i], roi_h, roi_w)
        pos = roi_map.reshape(num_keypoints, -1).argmax(axis=1)
        x_int, y_int = pos % roi_w, pos // roi_w
        x = (x_int.astype(np.float32) + np.float32(0.5)) * (widths[i] / np.float32(roi_w))
        y = (y_int.astype(np.float32) + np.float32(0.5)) * (heights[i] / np.float32(roi_h))
        keypoints[i, :, 0] = x + boxes[i, 0]
        keypoints[i, :, 1] = y + boxes[i, 1]
        keypoints[i, :, 2] = 1
        scores[i] = roi_map[np.arange(num_keypoints), y_int, x_int]
    return keypoints, scores
