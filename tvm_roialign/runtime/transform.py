"""torchvision's GeneralizedRCNNTransform and its postprocess (eval), in NumPy.

What ``model(images)`` does to a list of photos before the network sees them, and to the
detections after: each photo is normalized, resized keeping its aspect ratio (``scale = min(
min_size / short side, max_size / long side)``, torchvision's ``interpolate(scale_factor=scale,
recompute_scale_factor=True)``: the output size is ``int(side * scale)``, the kernel's scale
``side / output``), and the batch is zero-padded to its largest height and width rounded up to a
multiple of ``size_divisible`` (``batch_images``); boxes and keypoints are scaled back with
``float32(original) / float32(resized)`` and the masks pasted into the photo
(:func:`~tvm_roialign.runtime.masks.paste_masks`). NumPy only: this module must stay importable
without PyTorch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .bilinear import resize_bilinear

__all__ = [
    "TransformSettings",
    "all_padded_sizes",
    "feature_heights",
    "min_height_for_scales",
    "padded_size",
    "pooler_scales",
    "resize_boxes",
    "resize_keypoints",
    "resized_size",
]


@dataclass(frozen=True)
class TransformSettings:
    """GeneralizedRCNNTransform's eval settings (``min_size`` is its last, as in eval)."""

    min_size: int
    max_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    size_divisible: int = 32
    resize_fma: bool = True  # how this PyTorch rounds the bilinear source coordinate

    @classmethod
    def of(cls, transform, resize_fma: bool = True) -> TransformSettings:
        """The settings of a torchvision ``GeneralizedRCNNTransform``."""
        return cls(
            int(transform.min_size[-1]),
            int(transform.max_size),
            tuple(float(v) for v in transform.image_mean),
            tuple(float(v) for v in transform.image_std),
            int(transform.size_divisible),
            bool(resize_fma),
        )

    @classmethod
    def from_dict(cls, data: dict) -> TransformSettings:
        return cls(**{**data, "image_mean": tuple(data["image_mean"]), "image_std": tuple(data["image_std"])})

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def longest_padded_side(self) -> int:
        """The padded length of a photo's longer side (``max_size`` rounded up to
        ``size_divisible``): the size at which a symbolic-size build judges its convs."""
        return padded_size([(self.max_size, self.max_size)], self.size_divisible)[0]

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        """``rgb [H, W, 3]`` uint8 -> ``[3, h, w]`` float32: to [0, 1], normalized, resized."""
        image = np.ascontiguousarray(rgb.transpose(2, 0, 1)).astype(np.float32) / np.float32(255)
        mean = np.asarray(self.image_mean, np.float32)[:, None, None]
        std = np.asarray(self.image_std, np.float32)[:, None, None]
        image = (image - mean) / std
        height, width = resized_size(rgb.shape[:2], self.min_size, self.max_size)
        if (height, width) == image.shape[1:]:
            return image
        return resize_bilinear(image, height, width, self.resize_fma)


def resized_size(size, min_size: int, max_size: int) -> tuple[int, int]:
    """torchvision's resized ``(h, w)`` of a ``(H, W)`` photo (Python floats, as it computes)."""
    height, width = (int(s) for s in size)
    scale = min(float(min_size) / min(height, width), float(max_size) / max(height, width))
    return int(height * scale), int(width * scale)


def padded_size(sizes, size_divisible: int = 32) -> tuple[int, int]:
    """``batch_images``' padded ``(Hp, Wp)`` of a batch of resized ``(h, w)`` sizes."""
    stride = float(size_divisible)
    height = max(int(s[0]) for s in sizes)
    width = max(int(s[1]) for s in sizes)
    return (
        int(math.ceil(float(height) / stride) * stride),
        int(math.ceil(float(width) / stride) * stride),
    )


def all_padded_sizes(min_size: int, max_size: int, size_divisible: int = 32, longest: int = 4096):
    """Every padded size that photos up to ``longest`` pixels a side can get, sorted."""
    sizes = set()
    for long_side in (longest, longest - 1, max(longest // 3, 1)):
        for short_side in range(1, long_side + 1):
            resized = resized_size((short_side, long_side), min_size, max_size)
            if min(resized) < 1:
                continue
            sizes.add(padded_size([resized], size_divisible))
    return sorted(sizes | {(w, h) for h, w in sizes})


def feature_heights(padded_height: int, strides) -> list[int]:
    """The heights of feature maps of the given ``strides`` for a padded image height (each
    stride-2 step rounds up, as a padded convolution or a ``max_pool2d(x, 1, 2)`` does)."""
    return [-(-int(padded_height) // int(s)) for s in strides]


def pooler_scales(feature_heights, height: int) -> list[float]:
    """MultiScaleRoIAlign's scales (torchvision's ``_infer_scale``: from the heights only) for a
    batch whose largest resized height is ``height``."""
    return [
        float(2.0 ** float(np.round(np.log2(np.float32(float(f) / float(height))))))
        for f in feature_heights
    ]


def min_height_for_scales(poolers_heights, padded_height: int, size_divisible: int = 32) -> int:
    """The smallest largest-resized-height of a batch padded to ``padded_height`` for which every
    pooler infers the scales it infers at ``padded_height`` (the static form's)."""
    expected = [pooler_scales(h, padded_height) for h in poolers_heights]
    lowest = padded_height
    for height in range(padded_height, max(padded_height - size_divisible, 0), -1):
        if [pooler_scales(h, height) for h in poolers_heights] != expected:
            break
        lowest = height
    return lowest


def min_height_at(poolers_strides, padded_height: int, size_divisible: int = 32) -> int:
    """:func:`min_height_for_scales` of a batch padded to ``padded_height`` for poolers of the
    given strides (one list per pooler)."""
    heights = [feature_heights(padded_height, row) for row in poolers_strides]
    return min_height_for_scales(heights, padded_height, size_divisible)


def served_height(poolers_strides, size_divisible: int = 32) -> int:
    """The resized height from which every height is served: below it, some resized heights
    (just over a multiple of ``size_divisible``) make torchvision's poolers infer other scales
    than at the padded height, in any build (e.g. 68 for FPN strides 4 to 32). The first block
    whose heights all pass ends the search (in the next blocks they pass by more)."""
    lowest = 1
    for padded in range(size_divisible, 64 * size_divisible + 1, size_divisible):
        need = min_height_at(poolers_strides, padded, size_divisible)
        if need <= padded - size_divisible + 1:
            break
        lowest = need
    return lowest


def _ratios(resized, original):
    return [np.float32(o) / np.float32(r) for r, o in zip(resized, original)]


def resize_boxes(boxes: np.ndarray, resized, original) -> np.ndarray:
    """torchvision's ``resize_boxes``: ``[n, 4]`` boxes from the resized image to the photo."""
    ratio_h, ratio_w = _ratios(resized, original)
    scale = np.array([ratio_w, ratio_h, ratio_w, ratio_h], np.float32)
    return (np.asarray(boxes, np.float32) * scale).astype(np.float32)


def resize_keypoints(keypoints: np.ndarray, resized, original) -> np.ndarray:
    """torchvision's ``resize_keypoints``: ``[n, K, 3]`` (x, y, visibility) to the photo."""
    ratio_h, ratio_w = _ratios(resized, original)
    out = np.array(keypoints, np.float32, copy=True)
    out[..., 0] *= ratio_w
    out[..., 1] *= ratio_h
    return out
