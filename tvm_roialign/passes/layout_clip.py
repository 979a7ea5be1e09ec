"""Layout inference (``FRelaxInferLayout``) for ``relax.clip``, which stock TVM 0.27 leaves without one.

``relax.clip(x, min, max)`` is elementwise, yet it is registered without a layout rule, so Relax's
``ConvertLayout`` treats it as an op that only takes its initial layout: after a convolution that
the pass moved to NHWC, it transposes the feature map back to NCHW for the clip and to NHWC again
after it. PyTorch's ReLU6 (MobileNet v2), hardswish and hardsigmoid (MobileNet v3, imported as
``x * clip(clip(x + 3, 0, inf), -inf, 6) / 6``) are clips, so each activation of those models
ran between two transposes that the fusion could not fold (a third of MobileNet v3's time).

The rule (:func:`infer_layout_clip`) is that of every unary elementwise op: the clip takes its data
in the layout it already has, and its output has that layout; the bounds (``PrimValue``) have no
layout. The rule is registered on import of the package (:func:`register`) and reversible through
:func:`tvm_roialign.unregister`.
"""

from __future__ import annotations

from tvm import relax
from tvm.s_tir import slayout

from .. import _registry
from .layout import _make_object, infer_layout_output, initial_layout, layout_decision

#: The op this module gives a layout rule.
CLIP_OP = "relax.clip"


def _no_layout():
    """The decision for an argument without a layout (a ``PrimValue`` bound)."""
    return _make_object(
        "relax.transform.LayoutDecision", "layout", slayout(""), "is_unknown_dim", True
    )


def infer_layout_clip(call, desired_layouts, var_layout_map):
    """``FRelaxInferLayout`` of ``relax.clip(x, min, max)``: ``x`` and the output keep the layout
    ``x`` has now (its initial layout when the pass has not moved it), the bounds none.
    ``desired_layouts`` is not consulted: a clip follows its producer."""
    del desired_layouts  # an elementwise op follows its input
    data = call.args[0]
    decision = var_layout_map.get(data) if isinstance(data, relax.Var) else None
    if decision is None or not hasattr(decision, "is_unknown_dim"):
        ty = data.ty
        ndim = int(ty.ndim) if isinstance(ty, relax.TensorType) else -1
        decision = layout_decision(initial_layout(ndim)) if ndim >= 0 else _no_layout()
    bounds = [_no_layout() for _ in call.args[1:]]
    return infer_layout_output([decision, *bounds], [decision], call.attrs)


def register() -> None:
    """Register :func:`infer_layout_clip` as ``relax.clip``'s ``FRelaxInferLayout`` (idempotent)."""
    _registry.set_op_attr(CLIP_OP, "FRelaxInferLayout", infer_layout_clip)


__all__ = ["CLIP_OP", "infer_layout_clip", "register"]
