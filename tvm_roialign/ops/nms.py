"""``relax.vision.batched_nms``: torchvision's batched NMS with a static maximum and a valid count.

``call.args = (boxes [N, 4] float32, idxs [N] int, valid [N] bool, order [N] int)``, ``order`` the
boxes by score, descending (:func:`make_batched_nms` sorts them); ``call.attrs``: ``ir.DictAttrs``
with ``iou_threshold``, ``max_output`` and ``offset_trick_max_numel`` (4000; ``-1``: always per
class). Output ``(keep [max_output] int64, count [1] int64)``; semantics in
:mod:`tvm_roialign.topi.nms`. Stock TVM's NMS ops suppress at ``iou >= threshold`` and cap per
class, so they keep other boxes than torchvision. :func:`register` registers the op with
``FInferType``, ``FPurity`` and ``FLegalize`` (the strategy of the call's target).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax, te

from ..strategies.nms import select_nms_strategy
from ..topi.nms import OFFSET_TRICK_MAX_NUMEL, check_batched_nms_args
from ._legalize import FreshDims, add_prim_func, call_target, register_op, tensor_info

OP_NAME = "relax.vision.batched_nms"


@dataclass(frozen=True)
class BatchedNMSAttrs:
    iou_threshold: float
    max_output: int
    offset_trick_max_numel: int = OFFSET_TRICK_MAX_NUMEL

    @classmethod
    def from_call(cls, call) -> BatchedNMSAttrs:
        if call.attrs is None:
            raise ValueError(f"{OP_NAME} needs attributes (iou_threshold, max_output)")
        values = dict(call.attrs.items())
        missing = {"iou_threshold", "max_output"} - set(values)
        if missing:
            raise ValueError(f"{OP_NAME} attributes lack {sorted(missing)}")
        return cls(
            float(values["iou_threshold"]),
            int(values["max_output"]),
            int(values.get("offset_trick_max_numel", OFFSET_TRICK_MAX_NUMEL)),
        )

    def to_attrs(self) -> tvm.ir.Attrs:
        return tvm.ir.make_node(
            "ir.DictAttrs",
            iou_threshold=float(self.iou_threshold),
            max_output=int(self.max_output),
            offset_trick_max_numel=int(self.offset_trick_max_numel),
        )


def _infos(call):
    if len(call.args) != 4:
        raise ValueError(
            f"{OP_NAME} takes (boxes, idxs, valid, order), got {len(call.args)} argument(s)"
        )
    names = ("boxes", "idxs", "valid", "order")
    return [tensor_info(arg, name) for arg, name in zip(call.args, names)]


def _check(call):
    attrs = BatchedNMSAttrs.from_call(call)
    infos = _infos(call)
    shapes = [
        shape if shape is not None else [None] * (2 if i == 0 else 1)
        for i, (shape, _, _) in enumerate(infos)
    ]
    check_batched_nms_args(*shapes, attrs.iou_threshold, attrs.max_output)
    (_, _, boxes_dtype), (_, _, idx_dtype), (_, _, valid_dtype), (_, _, order_dtype) = (
        infos
    )
    if boxes_dtype != "float32":
        raise TypeError(f"{OP_NAME}: boxes must be float32, got {boxes_dtype}")
    for name, dtype in (("idxs", idx_dtype), ("order", order_dtype)):
        if not dtype.startswith("int"):
            raise TypeError(f"{OP_NAME}: {name} must be an integer tensor, got {dtype}")
    if valid_dtype != "bool":
        raise TypeError(f"{OP_NAME}: valid must be bool, got {valid_dtype}")
    return attrs, infos


def infer_struct_info(call, _ctx=None):
    """``(keep [max_output] int64, count [1] int64)``."""
    attrs, _ = _check(call)
    return relax.TupleType(
        [relax.TensorType([attrs.max_output], "int64"), relax.TensorType([1], "int64")]
    )


def legalize(bb: relax.BlockBuilder, call):
    """``call_tir`` of the greedy pass built by the strategy of the call's target."""
    attrs, infos = _check(call)
    target = call_target(call)
    strategy = select_nms_strategy(target)
    fresh = FreshDims()
    names = ("boxes", "idxs", "valid", "order")
    inputs = []
    for (shape, _, dtype), name in zip(infos, names):
        if shape is None:
            raise ValueError(f"{OP_NAME} needs {name} of known shape to legalize")
        inputs.append(te.placeholder(fresh(shape), dtype, name))
    func = strategy.build(
        inputs, attrs.iou_threshold, attrs.max_output, attrs.offset_trick_max_numel
    )
    gvar = add_prim_func(bb, call, func, "batched_nms", target)
    return relax.call_tir(gvar, list(call.args), list(call.ty.fields))


def register() -> None:
    """Register the op and its attributes (idempotent)."""
    register_op(OP_NAME, infer_struct_info, legalize)


def make_batched_nms_call(
    boxes,
    idxs,
    valid,
    order,
    iou_threshold,
    max_output,
    offset_trick_max_numel=OFFSET_TRICK_MAX_NUMEL,
):
    """The bare ``relax.vision.batched_nms`` call (``order`` given)."""
    attrs = BatchedNMSAttrs(
        float(iou_threshold), int(max_output), int(offset_trick_max_numel)
    )
    return relax.Call(
        tvm.ir.Op.get(OP_NAME), [boxes, idxs, valid, order], attrs.to_attrs()
    )


def make_batched_nms(
    bb: relax.BlockBuilder,
    boxes,
    scores,
    idxs,
    valid,
    iou_threshold,
    max_output,
    offset_trick_max_numel=OFFSET_TRICK_MAX_NUMEL,
):
    """Emit torchvision's ``batched_nms`` on the valid boxes, capped at ``max_output``.

    Parameters
    ----------
    bb : relax.BlockBuilder
        Where the sort and the pass are emitted.
    boxes, scores, idxs, valid : relax.Expr
        ``[N, 4]`` float32, ``[N]`` float32, ``[N]`` int, ``[N]`` bool.
    iou_threshold : float
    max_output : int
        The static cap (the model's ``post_nms_top_n`` or ``detections_per_img``).
    offset_trick_max_numel : int
        torchvision's switch (4000 on CPU, 100000 on CUDA; -1: always per class).

    Returns
    -------
    relax.Expr
        The tuple ``(keep [max_output] int64, count [1] int64)``.
    """
    masked = bb.emit(
        relax.op.where(valid, scores, relax.const(float("-inf"), "float32"))
    )
    order = bb.emit(relax.op.argsort(masked, axis=-1, descending=True, dtype="int64"))
    return bb.emit(
        make_batched_nms_call(
            boxes, idxs, valid, order, iou_threshold, max_output, offset_trick_max_numel
        )
    )


__all__ = [
    "OP_NAME",
    "BatchedNMSAttrs",
    "infer_struct_info",
    "legalize",
    "make_batched_nms",
    "make_batched_nms_call",
    "register",
]
