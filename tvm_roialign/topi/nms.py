"""Greedy batched NMS with torchvision's CPU semantics, a static maximum and a valid count
(semantics in docs/semantics.md).

``boxes [N, 4]`` float32, ``idxs [N]`` classes (boxes of different classes never suppress each
other), ``valid [N]`` bool (invalid boxes take no part), ``order [N]`` the boxes by score,
descending, ties by index -> ``keep [max_output]`` int64 (kept indices in score order, ``-1`` after
the last) and ``count [1]`` int64. The pass takes torchvision's path: per class on the raw
coordinates above ``offset_trick_max_numel`` valid coordinates, else one pass over boxes shifted by
``idx * (max_coordinate + 1)``; a box is kept unless a kept box has ``iou > iou_threshold``, and
the pass stops at ``max_output`` kept boxes. Products that feed an addition are formed in float64
and rounded to float32 once (never contracted into an FMA), and ``iou > t`` is tested in float32
against the largest float32 not above ``t``.
"""

from __future__ import annotations

import contextlib

import numpy as np
import tvm
from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

__all__ = [
    "OFFSET_TRICK_MAX_NUMEL",
    "batched_nms",
    "check_batched_nms_args",
    "threshold_below",
]

#: torchvision's CPU threshold between the coordinate trick and per-class NMS (``boxes.numel()``).
OFFSET_TRICK_MAX_NUMEL = 4000


def check_batched_nms_args(
    boxes_shape, idxs_shape, valid_shape, order_shape, iou_threshold, max_output
):
    """Raise ValueError unless the shapes and attributes are those of the contract above."""
    width = boxes_shape[1] if len(boxes_shape) == 2 else None
    if len(boxes_shape) != 2 or (
        isinstance(width, (int, tirx.IntImm)) and int(width) != 4
    ):
        raise ValueError(f"boxes must be [N, 4], got shape {list(boxes_shape)}")
    for name, shape in (
        ("idxs", idxs_shape),
        ("valid", valid_shape),
        ("order", order_shape),
    ):
        if len(shape) != 1:
            raise ValueError(
                f"{name} must be [N] (one per box), got shape {list(shape)}"
            )
    if not 0.0 <= float(iou_threshold) <= 1.0:
        raise ValueError(f"iou_threshold must be in [0, 1], got {iou_threshold}")
    if int(max_output) < 1:
        raise ValueError(f"max_output must be a positive int, got {max_output}")


def threshold_below(value: float) -> float:
    """The largest float32 that is not above ``value``: for a float32 ``x``,
    ``x > value`` (compared in float64, as torchvision does) iff ``x > threshold_below(value)``."""
    below = np.float32(value)
    if float(below) > float(value):
        below = np.nextafter(below, np.float32(-np.inf))
    return float(below)


class _Pass:
    """The greedy pass, written with TVM's IRBuilder (one sequential loop nest)."""

    def __init__(self, iou_threshold, max_output, trick_numel, exact_products, gpu):
        self.threshold = threshold_below(iou_threshold)
        self.max_output = max_output
        self.trick_numel = trick_numel
        self.exact_products = exact_products
        # the kept boxes: a heap workspace on the CPU, the thread's local memory on a GPU
        self.scratch = "local" if gpu else "global"

    def mul32(self, a, b):
        """A float32 product; formed in float64 and rounded once where the device has float64, so
        that LLVM cannot contract it into a fused multiply-add with the addition it feeds."""
        if not self.exact_products:  # Metal: no float64
            return a * b
        return tirx.Cast("float32", tirx.Cast("float64", a) * tirx.Cast("float64", b))

    def local(self, shape, dtype, scope="local"):
        return T.buffer_proxy(T.alloc_buffer(shape, dtype, scope=scope))

    def emit(self, boxes, idxs, valid, order, keep, count):
        num, f32 = boxes.shape[0], "float32"
        zero = tirx.const(0.0, f32)
        kept = self.local((1,), "int64")
        num_valid = self.local((1,), "int64")
        top = self.local((1,), f32)
        use_trick = self.local((1,), "bool")
        suppressed = self.local((1,), "bool")
        cur = self.local((5,), f32)  # the candidate: x1, y1, x2, y2, area
        # the kept boxes (in the coordinates of the chosen path) with their area, and their class
        kbox = self.local((self.max_output, 5), f32, self.scratch)
        kcls = self.local((self.max_output,), "int64", self.scratch)

        # which path torchvision takes: the number of valid coordinates against the threshold
        num_valid[0] = tirx.const(0, "int64")
        with T.serial(0, num) as i, T.If(valid[i]), T.Then():
            num_valid[0] = num_valid[0] + 1
        use_trick[0] = tirx.const(False, "bool")
        if self.trick_numel >= 0:
            use_trick[0] = num_valid[0] * 4 <= self.trick_numel
        trick = use_trick[0]
        # the coordinate trick's offsets: idx * (max coordinate of the valid boxes + 1)
        top[0] = tirx.const(float("-inf"), f32)
        with T.serial(0, num) as i, T.If(tirx.all(trick, valid[i])), T.Then():
            pair = (
                tvm.te.max(boxes[i, 0], boxes[i, 1]),
                tvm.te.max(boxes[i, 2], boxes[i, 3]),
            )
            top[0] = tvm.te.max(top[0], tvm.te.max(*pair))

        kept[0] = tirx.const(0, "int64")
        with T.serial(0, num) as i:
            j = order[i]
            cls = tirx.Cast("int64", idxs[j])
            with T.If(tirx.all(kept[0] < self.max_output, valid[j])), T.Then():
                offset = tirx.Select(
                    trick,
                    self.mul32(tirx.Cast(f32, idxs[j]), top[0] + tirx.const(1.0, f32)),
                    zero,
                )
                with T.serial(0, 4) as c:
                    cur[c] = tirx.Select(trick, boxes[j, c] + offset, boxes[j, c])
                cur[4] = self.mul32(cur[2] - cur[0], cur[3] - cur[1])
                suppressed[0] = tirx.const(False, "bool")
                with T.serial(0, kept[0]) as t:
                    check = tirx.all(
                        tirx.Not(suppressed[0]), tirx.Or(trick, kcls[t] == cls)
                    )
                    with T.If(check), T.Then():
                        w = tvm.te.max(
                            zero,
                            tvm.te.min(kbox[t, 2], cur[2])
                            - tvm.te.max(kbox[t, 0], cur[0]),
                        )
                        h = tvm.te.max(
                            zero,
                            tvm.te.min(kbox[t, 3], cur[3])
                            - tvm.te.max(kbox[t, 1], cur[1]),
                        )
                        inter = self.mul32(w, h)
                        iou = inter / (kbox[t, 4] + cur[4] - inter)
                        with T.If(iou > tirx.const(self.threshold, f32)), T.Then():
                            suppressed[0] = tirx.const(True, "bool")
                with T.If(tirx.Not(suppressed[0])), T.Then():
                    with T.serial(0, 5) as c:
                        kbox[kept[0], c] = cur[c]
                    kcls[kept[0]] = cls
                    keep[kept[0]] = tirx.Cast("int64", j)
                    kept[0] = kept[0] + 1
        count[0] = kept[0]
        with T.serial(0, self.max_output) as t, T.If(t >= kept[0]), T.Then():
            keep[t] = tirx.const(-1, "int64")


def _nms_ir(ins, outs, nms_pass: _Pass, gpu: bool):
    with IRBuilder() as ib:
        args = [T.buffer_proxy(b) for b in (*ins, *outs)]
        with contextlib.ExitStack() as frames:
            # the pass is sequential: one GPU thread (a deployable build, not a fast one), or a
            # unit loop on the CPU (IRBuilder allocates inside a frame)
            if gpu:
                block, thread = (
                    te.thread_axis("blockIdx.x"),
                    te.thread_axis("threadIdx.x"),
                )
                frames.enter_context(
                    T.frame_scope(
                        [
                            T.attr(block, "thread_extent", 1),
                            T.attr(thread, "thread_extent", 1),
                        ]
                    )
                )
            else:
                frames.enter_context(T.serial(0, 1))
            nms_pass.emit(*args)
    return ib.get()


def batched_nms(
    boxes,
    idxs,
    valid,
    order,
    iou_threshold: float,
    max_output: int,
    offset_trick_max_numel: int = OFFSET_TRICK_MAX_NUMEL,
    gpu: bool = False,
    exact_products: bool = True,
):
    """``(keep [max_output] int64, count [1] int64)``: torchvision's batched NMS (module doc).

    ``gpu`` binds the sequential pass to one GPU thread (CUDA, Metal); otherwise it is CPU code.
    ``exact_products=False`` avoids float64 (for devices without it; products may then be
    contracted into FMAs by the device compiler).
    """
    check_batched_nms_args(
        boxes.shape, idxs.shape, valid.shape, order.shape, iou_threshold, max_output
    )
    nms_pass = _Pass(
        float(iou_threshold),
        int(max_output),
        int(offset_trick_max_numel),
        bool(exact_products),
        bool(gpu),
    )
    return te.extern(
        [(int(max_output),), (1,)],
        [boxes, idxs, valid, order],
        lambda ins, outs: _nms_ir(ins, outs, nms_pass, gpu),
        dtype=["int64", "int64"],
        name="batched_nms",
        tag="batched_nms",
    )
