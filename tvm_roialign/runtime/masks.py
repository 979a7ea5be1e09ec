"""Pasting 28x28 mask probabilities into the image, as torchvision's ``paste_masks_in_image``.

Per detection (``box`` in image pixels): the mask is padded by one pixel of zeros and the box
widened about its centre by ``(M + 2) / M`` (``expand_masks`` / ``expand_boxes``), the widened box
truncated to integers, the padded mask resized bilinearly to the box's ``(y2 - y1 + 1) x (x2 - x1
+ 1)`` pixels and copied into the part of the image the box covers. NumPy only.
"""

from __future__ import annotations

import numpy as np

from .bilinear import resize_bilinear

__all__ = ["expand_boxes", "paste_masks"]


def expand_boxes(boxes: np.ndarray, scale: float) -> np.ndarray:
    """Boxes widened about their centres by ``scale`` (float32, torchvision's arithmetic)."""
    boxes = np.asarray(boxes, dtype=np.float32)
    half, scale = np.float32(0.5), np.float32(scale)
    w_half = (boxes[:, 2] - boxes[:, 0]) * half * scale
    h_half = (boxes[:, 3] - boxes[:, 1]) * half * scale
    x_c = (boxes[:, 2] + boxes[:, 0]) * half
    y_c = (boxes[:, 3] + boxes[:, 1]) * half
    return np.stack([x_c - w_half, y_c - h_half, x_c + w_half, y_c + h_half], axis=1)


def paste_masks(
    masks: np.ndarray, boxes: np.ndarray, height: int, width: int, padding: int = 1
) -> np.ndarray:
    """``masks [D, M, M]`` probabilities and ``boxes [D, 4]`` -> ``[D, height, width]`` float32."""
    masks = np.asarray(masks, dtype=np.float32)
    if masks.ndim != 3 or masks.shape[1] != masks.shape[2]:
        raise ValueError(f"masks must be [D, M, M], got shape {list(masks.shape)}")
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    if boxes.shape[0] != masks.shape[0]:
        raise ValueError(f"{masks.shape[0]} masks but {boxes.shape[0]} boxes")
    size = masks.shape[-1]
    padded = np.pad(masks, ((0, 0), (padding, padding), (padding, padding)))
    scale = float(size + 2 * padding) / size
    expanded = np.trunc(expand_boxes(boxes, scale)).astype(np.int64)
    out = _zeros((masks.shape[0], height, width))
    for i, (x0, y0, x1, y1) in enumerate(expanded):
        w, h = max(int(x1 - x0 + 1), 1), max(int(y1 - y0 + 1), 1)
        mask = resize_bilinear(padded[i], h, w)
        left, right = max(x0, 0), min(x1 + 1, width)
        top, bottom = max(y0, 0), min(y1 + 1, height)
        if right > left and bottom > top:
            out[i, top:bottom, left:right] = mask[
                top - y0 : bottom - y0, left - x0 : right - x0
            ]
    return out


def _zeros(shape) -> np.ndarray:
    """A zero float32 array of ``shape`` in memory without NumPy's huge-page advice: NumPy marks
    arrays of 4 MiB and more ``MADV_HUGEPAGE``, and where the kernel then defragments on a fault
    (transparent huge pages in ``madvise`` mode) a fresh 100-mask paste at 512 x 512 (105 MB)
    stalled 0.1-0.3 s in memory compaction after PyTorch had run, against 7 ms in ordinary pages."""
    count = int(np.prod(shape))
    return np.frombuffer(bytearray(4 * count), dtype=np.float32).reshape(shape)
