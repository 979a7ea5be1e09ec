"""Bilinear resizing as PyTorch's CPU kernel computes it (``align_corners=False``), in NumPy.

The runtime's mask paste and its torchvision transform (:mod:`tvm_roialign.runtime.transform`)
use it. NumPy
only: this module must stay importable without PyTorch.
"""

from __future__ import annotations

import numpy as np

__all__ = ["bilinear_weights", "resize_bilinear"]


def bilinear_weights(in_size: int, out_size: int, fused: bool = True):
    """``(index0, index1, lambda0, lambda1)`` of PyTorch's CPU bilinear resize along one axis
    (``align_corners=False``, scale ``in / out``), in float32 as PyTorch computes them:
    ``src = max(scale * (dst + 0.5) - 0.5, 0)``, ``index0 = min(floor(src), in - 1)``,
    ``lambda1 = clamp(src - index0, 0, 1)``, ``lambda0 = 1 - lambda1``,
    ``index1 = index0 + (index0 < in - 1)``.

    ``fused``: ``scale * (dst + 0.5) - 0.5`` rounded once (a fused multiply-add: PyTorch's kernels
    built for AVX2 / AVX-512 / NEON) or twice (its baseline x86-64 build).
    """
    if in_size < 1 or out_size < 1:
        raise ValueError(f"sizes must be positive, got {in_size} -> {out_size}")
    f32 = np.float32
    scale = f32(in_size) / f32(out_size)
    half = np.arange(out_size, dtype=f32) + f32(0.5)
    if fused:
        src = (np.float64(scale) * half.astype(np.float64) - 0.5).astype(f32)
    else:
        src = scale * half - f32(0.5)
    src = np.where(src < 0, f32(0), src).astype(f32)
    index0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    lambda1 = np.clip(src - index0.astype(f32), f32(0), f32(1)).astype(f32)
    index1 = index0 + (index0 < in_size - 1)
    return index0, index1, (f32(1) - lambda1).astype(f32), lambda1


def _lerp(a, wa, b, wb, fused: bool = True):
    """``fma(a, wa, b * wb)`` in float32 (formed in float64, rounded once); ``fused=False``:
    ``a * wa + b * wb`` rounded at each step."""
    if not fused:
        return (a * wa + b * wb).astype(np.float32)
    return (a.astype(np.float64) * wa + (b * wb).astype(np.float64)).astype(np.float32)


def resize_bilinear(array: np.ndarray, height: int, width: int, fused: bool = True) -> np.ndarray:
    """``array [..., H, W]`` float32 resized to ``[..., height, width]`` (width first, then
    height, each ``fma(a, w0, b * w1)``: PyTorch's generic CPU kernel on an FMA machine;
    ``fused=False``: its baseline x86-64 build, source coordinates and sums rounded twice)."""
    array = np.asarray(array, dtype=np.float32)
    wi0, wi1, wl0, wl1 = bilinear_weights(array.shape[-1], width, fused)
    x = _lerp(array[..., wi0], wl0, array[..., wi1], wl1, fused)
    hi0, hi1, hl0, hl1 = bilinear_weights(array.shape[-2], height, fused)
    return _lerp(x[..., hi0, :], hl0[:, None], x[..., hi1, :], hl1[:, None], fused)
