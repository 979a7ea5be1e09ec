"""Keypoint R-CNN's ``heatmaps_to_keypoints`` and ``resize_keypoints`` as one TIR kernel, for the
photo-in, detections-out function of a detector artifact (:mod:`tvm_roialign.models.detector_photo`).

Each detection's ``[K, M, M]`` heatmap logits are resized bicubically to its box's size rounded up, a
size that depends on the detection, so the kernel's loops run over data-dependent extents: per
detection and keypoint, over the rows and columns of the box, each value the bicubic resize at that
pixel (PyTorch's CPU kernel as :func:`tvm_roialign.runtime.keypoints.resize_bicubic` computes it:
along the width, then the height, ``A = -0.75``, taps clamped to the edges, each product rounded
before its sum), the first maximum kept. The keypoint is that pixel's centre in the box, scaled to the
photo by ``float32(photo side) / float32(resized side)``; its score the maximum. Products are rounded
on their own (:func:`~tvm_roialign.topi.photo.mul`), never fused with the sums.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .photo import mul

__all__ = ["heatmaps_to_keypoints"]

F32, I64 = "float32", "int64"
_A = -0.75


def _f32(value):
    return tirx.const(value, F32)


def _cubic_near(x):  # |x| <= 1: ((A + 2) x - (A + 3)) x x + 1
    return mul(mul(mul(_f32(_A + 2), x) - _f32(_A + 3), x), x) + _f32(1.0)


def _cubic_far(x):  # 1 < |x| < 2: ((A x - 5 A) x + 8 A) x - 4 A
    return mul(mul(mul(_f32(_A), x) - _f32(5 * _A), x) + _f32(8 * _A), x) - _f32(4 * _A)


def _taps(size: int, out, dst):
    """``(indices, weights)``: the four taps of output index ``dst`` of a bicubic resize ``size ->
    out`` (:func:`~tvm_roialign.runtime.keypoints.bicubic_weights`)."""
    scale = _f32(float(size)) / out.astype(F32)
    real = mul(scale, dst.astype(F32) + _f32(0.5)) - _f32(0.5)
    start = tirx.floor(real).astype(I64)
    t = real - start.astype(F32)
    one, two = _f32(1.0), _f32(2.0)
    weights = [_cubic_far(t + one), _cubic_near(t), _cubic_near(one - t), _cubic_far(two - t)]
    indices = [tirx.min(tirx.max(start + (j - 1), 0), size - 1) for j in range(4)]
    return indices, weights


def _interp(values, weights):
    out = mul(values[0], weights[0])
    for value, weight in zip(values[1:], weights[1:]):
        out = out + mul(value, weight)
    return out


def _bicubic_at(heat, i, k, size: int, rows, columns, y, x):
    """The value at ``(y, x)`` of detection ``i``'s keypoint ``k`` map resized to ``rows x columns``."""
    column_index, column_weight = _taps(size, columns, x)
    row_index, row_weight = _taps(size, rows, y)
    along_width = [
        _interp([heat[0, i, k, r, c] for c in column_index], column_weight) for r in row_index
    ]
    return _interp(along_width, row_weight)


def _centre(position, extent, side, low):
    """The photo-box coordinate of pixel ``position`` of a box side ``side`` rounded up to ``extent``."""
    return mul(position.astype(F32) + _f32(0.5), side / extent.astype(F32)) + low


def heatmaps_to_keypoints(detections: int, num_keypoints: int, size: int):
    """A TIR function ``(heatmaps [1, D, K, M, M], boxes [1, D, 4], count [1] int64, resized [2]
    int64, photo [2] int64, keypoints [D, K, 3], scores [D, K])``: the keypoints (x, y, 1) of the
    first ``count`` detections in the photo's pixels and their scores, zero rows after them
    (``boxes`` in the resized image's pixels, ``resized`` its size, ``photo`` the photo's). Every
    shape is static: the loops' data-dependent extents are read from the tensors."""
    D, K, M = detections, num_keypoints, size

    @T.prim_func(private=True)
    def kernel(
        heat: T.Buffer((1, D, K, M, M), "float32"),
        boxes: T.Buffer((1, D, 4), "float32"),
        count: T.Buffer((1,), "int64"),
        sizes: T.Buffer((2,), "int64"),
        photo: T.Buffer((2,), "int64"),
        keypoints: T.Buffer((D, K, 3), "float32"),
        scores: T.Buffer((D, K), "float32"),
    ):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        for i in T.parallel(D):
            for k in range(K):
                width = T.max(boxes[0, i, 2] - boxes[0, i, 0], T.float32(1.0))
                height = T.max(boxes[0, i, 3] - boxes[0, i, 1], T.float32(1.0))
                columns = T.Cast("int64", T.ceil(width))
                rows = T.Cast("int64", T.ceil(height))
                best = T.alloc_buffer((1,), "float32", scope="local")
                spot = T.alloc_buffer((1,), "int64", scope="local")
                best[0] = T.float32("-inf")
                spot[0] = T.int64(0)
                if T.Cast("int64", i) < count[0]:
                    for y in range(rows):
                        for x in range(columns):
                            value = _bicubic_at(heat, i, k, M, rows, columns, y, x)
                            if value > best[0]:
                                best[0] = value
                                spot[0] = y * columns + x
                    x_box = _centre(spot[0] % columns, columns, width, boxes[0, i, 0])
                    y_box = _centre(spot[0] // columns, rows, height, boxes[0, i, 1])
                    keypoints[i, k, 0] = mul(x_box, T.Cast("float32", photo[1]) / T.Cast("float32", sizes[1]))
                    keypoints[i, k, 1] = mul(y_box, T.Cast("float32", photo[0]) / T.Cast("float32", sizes[0]))
                    keypoints[i, k, 2] = T.float32(1.0)
                    scores[i, k] = best[0]
                else:
                    for c in range(3):
                        keypoints[i, k, c] = T.float32(0.0)
                    scores[i, k] = T.float32(0.0)

    return kernel
