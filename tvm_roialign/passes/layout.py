"""Layout inference (``FRelaxInferLayout``) for ``relax.vision.roi_align`` and ops shaped like it.

Relax's ``ConvertLayout`` walks a dataflow block forward and asks each op's ``FRelaxInferLayout``
rule, given the desired layouts and the layout every earlier variable already has, which layout
it wants for each input and which layout its output will have. Layouts there are *relative*: a
tensor's layout is written as a permutation of the letters of its layout before the pass
(``"ABCD"`` for any 4-D tensor). A feature map that was NCHW and is now NHWC is ``"ACDB"``; one
that was NHWC and is now NCHW is ``"ADBC"``. This module builds those decisions in Python, through
the object constructor ``ffi.MakeObjectFromPackedArgs`` (``relax.transform.LayoutDecision`` and
``relax.transform.InferLayoutOutput`` have no Python class in TVM 0.27).

The rule (:func:`infer_layout_roi_align_like`), for a call whose first ``L`` arguments are feature
maps in the op's ``layout`` attribute (``"NCHW"``: ``[N, C, H, W]``, ``"NHWC"``: ``[N, H, W, C]``)
and whose next argument is ``rois: [K, 5]``:

* desired ``[layout]`` or ``[layout, "default"]`` for the op, ``layout`` in NCHW/NHWC (or
  ``"default"``: the call's current layout): the feature maps are asked for in ``layout``, the
  rois are left as they are, the output is in the matching layout (``[K, C, PH, PW]`` or
  ``[K, PH, PW, C]``), and the call gets the same attributes with ``layout`` rewritten;
* no desired layout for the op: the call takes the layout its feature maps already have when that
  is NCHW or NHWC (no transpose is inserted); any other incoming layout (a permutation such as
  NWCH, or feature maps that disagree) falls back to NCHW, with the transform inserted by the pass.

``layout`` is the call's *current* layout: a call that is already NHWC before the pass has
``"ABCD"`` = NHWC, and NCHW is ``"ADBC"`` for it.
"""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax
from tvm.s_tir import slayout

from .. import _registry
from ..ops.multiscale_roi_align import OP_NAME as MULTISCALE_ROI_ALIGN_OP
from ..ops.ps_roi_align import OP_NAME as PS_ROI_ALIGN_OP
from ..ops.quantized_roi_align import OP_NAME as QUANTIZED_ROI_ALIGN_OP
from ..ops.roi_align import OP_NAME as ROI_ALIGN_OP
from ..ops.roi_align_rotated import OP_NAME as ROI_ALIGN_ROTATED_OP

#: Layouts the RoIAlign kernels (and so the legalization) support.
SUPPORTED_LAYOUTS = ("NCHW", "NHWC")
_DEFAULT = "default"
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

_make_object = tvm.get_global_func("ffi.MakeObjectFromPackedArgs")


def initial_layout(ndim: int) -> str:
    """The layout of an ``ndim``-D tensor before the pass: ``"AB..."`` (``"ABCD"`` for 4-D)."""
    if not 0 <= ndim <= len(_LETTERS):
        raise ValueError(f"ndim must be in [0, {len(_LETTERS)}], got {ndim}")
    return _LETTERS[:ndim]


def transpose_like(layout: str, src: str, dst: str) -> str:
    """Reorder the letters of ``layout`` as ``dst`` reorders ``src`` (all the same length).

    ``transpose_like("ABCD", "NCHW", "NHWC") == "ACDB"`` (NHWC seen from NCHW) and
    ``transpose_like("NCHW", "ABCD", "ACDB") == "NHWC"``.
    """
    if not (len(layout) == len(src) == len(dst)) or sorted(src) != sorted(dst):
        raise ValueError(f"cannot transpose {layout!r} like {src!r} -> {dst!r}")
    return "".join(layout[src.index(axis)] for axis in dst)


def layout_decision(layout: str):
    """A ``relax.transform.LayoutDecision`` for the relative layout string ``layout``."""
    return _make_object(
        "relax.transform.LayoutDecision", "layout", slayout(layout), "is_unknown_dim", False
    )


def infer_layout_output(input_layouts, output_layouts, new_attrs, new_args=None):
    """A ``relax.transform.InferLayoutOutput`` (what an ``FRelaxInferLayout`` rule returns)."""
    return _make_object(
        "relax.transform.InferLayoutOutput",
        "input_layouts",
        list(input_layouts),
        "output_layouts",
        list(output_layouts),
        "new_attrs",
        new_attrs,
        "new_args",
        dict(new_args or {}),
    )


def incoming_layout(var_layout_map, arg) -> str | None:
    """The relative layout ``arg`` has now, or None when unknown (not a plain tensor layout).

    Arguments the pass has not recorded (constants, function parameters) keep the initial layout.
    """
    ty = arg.ty
    if not isinstance(ty, relax.TensorType) or int(ty.ndim) < 0:
        return None
    decision = var_layout_map.get(arg) if isinstance(arg, relax.Var) else None
    if decision is None:
        return initial_layout(int(ty.ndim))
    if not hasattr(decision, "is_unknown_dim"):  # a tuple (nested) layout
        return None
    if bool(decision.is_unknown_dim):
        return None
    name = str(decision.layout.name)
    return name if len(name) == int(ty.ndim) else None


def replace_layout_attr(attrs, layout: str, key: str = "layout"):
    """A copy of ``attrs`` (typed attrs or ``DictAttrs``) with ``key`` set to ``layout``."""
    if isinstance(attrs, tvm.ir.DictAttrs):
        fields = {str(k): v for k, v in attrs.items()}
        if key not in fields and "__dict__" in fields:  # built with make_node(__dict__=...)
            inner = {str(k): v for k, v in fields["__dict__"].items()}
            inner[key] = layout
            return tvm.ir.make_node("ir.DictAttrs", __dict__=inner)
        fields[key] = layout
        return tvm.ir.make_node("ir.DictAttrs", **fields)
    info = type(attrs).__tvm_ffi_type_info__
    args = [info.type_key]
    for field in info.fields:
        args += [field.name, layout if field.name == key else getattr(attrs, field.name)]
    return _make_object(*args)


def current_layout(call, key: str = "layout") -> str:
    """The layout attribute of ``call`` (typed attrs or ``DictAttrs``)."""
    attrs = call.attrs
    if isinstance(attrs, tvm.ir.DictAttrs):
        if key in attrs:
            return str(attrs[key])
        if "__dict__" in attrs:
            return str(attrs["__dict__"][key])
        raise ValueError(f"{call.op.name} call has no {key!r} attribute")
    return str(getattr(attrs, key))


def desired_target(op_name: str, desired, cur: str) -> str:
    """The data layout a desired-layout list asks a RoIAlign-like call (now in ``cur``) for.

    Raises
    ------
    ValueError
        ``desired`` is not ``[layout]`` or ``[layout, "default"]`` with ``layout`` in NCHW, NHWC
        or ``"default"``.
    """
    layouts = [str(x) for x in desired]
    if not layouts or len(layouts) > 2:
        raise ValueError(
            f"desired layouts for {op_name} must be [data_layout] or [data_layout, 'default'] "
            f"with data_layout in {SUPPORTED_LAYOUTS}, got {layouts}"
        )
    target = cur if layouts[0] == _DEFAULT else layouts[0]
    if target not in SUPPORTED_LAYOUTS:
        raise ValueError(
            f"desired data layout for {op_name} must be one of {SUPPORTED_LAYOUTS} or 'default', "
            f"got {layouts[0]!r}"
        )
    if len(layouts) == 2 and layouts[1] not in (_DEFAULT, "", "AB", "NC"):
        raise ValueError(
            f"the rois of {op_name} keep their layout: the second desired layout must be "
            f"'default', got {layouts[1]!r}"
        )
    return target


def infer_layout_roi_align_like(call, desired_layouts, var_layout_map, num_feature_inputs=1):
    """``FRelaxInferLayout`` rule for RoIAlign-like ops (see the module docstring).

    Parameters
    ----------
    call : relax.Call
        The call before the pass: ``args[:num_feature_inputs]`` are feature maps, 4-D, in the
        layout named by the call's ``layout`` attribute (typed attrs or ``DictAttrs``),
        ``args[num_feature_inputs]`` is ``rois: [K, 5]``; further arguments, if any, are kept
        in their initial layout. The output is one 4-D tensor in the same layout as the features.
    desired_layouts : Map[str, Array[str]]
        ``ConvertLayout``'s desired layouts, keyed by op name (``"relax.vision.roi_align"``).
    var_layout_map : Map[relax.Var, NLayout]
        The layouts the pass has given earlier variables.
    num_feature_inputs : int or None
        ``L``; None means every argument but the last is a feature map.

    Returns
    -------
    InferLayoutOutput
        Input layouts (features in the chosen layout, rois untouched), the output layout and the
        attributes with ``layout`` rewritten.

    Raises
    ------
    ValueError
        A desired layout other than ``[NCHW|NHWC|default]`` or ``[..., "default"]``.
    """
    op_name = str(call.op.name)
    args = list(call.args)
    num = len(args) - 1 if num_feature_inputs is None else int(num_feature_inputs)
    if not 1 <= num < len(args):
        raise ValueError(
            f"{op_name}: expected {num} feature maps followed by rois, got {len(args)} arguments"
        )
    cur = current_layout(call)
    init4 = initial_layout(4)

    desired = desired_layouts.get(op_name) if desired_layouts is not None else None
    if desired is not None and cur in SUPPORTED_LAYOUTS:
        target = desired_target(op_name, desired, cur)
    else:
        target = _follow_incoming(cur, [incoming_layout(var_layout_map, a) for a in args[:num]])

    # the same permutation maps the features and the output: the output axes (K, C, PH, PW)
    # stand where the data axes (N, C, H, W) stand.
    decision = layout_decision(transpose_like(init4, cur, target))
    input_layouts = [decision] * num
    for arg in args[num:]:
        ndim = int(arg.ty.ndim) if isinstance(arg.ty, relax.TensorType) else -1
        input_layouts.append(layout_decision(initial_layout(ndim if ndim >= 0 else 2)))
    new_attrs = call.attrs if target == cur else replace_layout_attr(call.attrs, target)
    return infer_layout_output(input_layouts, [decision], new_attrs)


def _follow_incoming(cur: str, incoming: list[str | None]) -> str:
    """The layout the features already have (most common among them), or NCHW."""
    if cur not in SUPPORTED_LAYOUTS:  # not a layout we can rewrite: keep it
        return cur
    actual = [
        transpose_like(cur, initial_layout(4), lay)
        for lay in incoming
        if lay is not None and len(lay) == 4
    ]
    actual = [lay for lay in actual if lay in SUPPORTED_LAYOUTS]
    if not actual:
        return "NCHW"
    counts = Counter(actual)
    best = max(counts.values())
    return next(lay for lay in actual if counts[lay] == best)


def infer_layout_roi_align(call, desired_layouts, var_layout_map):
    """``FRelaxInferLayout`` of ``relax.vision.roi_align(data, rois)``."""
    return infer_layout_roi_align_like(call, desired_layouts, var_layout_map, 1)


def infer_layout_multiscale_roi_align(call, desired_layouts, var_layout_map):
    """``FRelaxInferLayout`` of ``relax.vision.multiscale_roi_align(f_0, ..., f_{L-1}, rois)``."""
    return infer_layout_roi_align_like(call, desired_layouts, var_layout_map, None)


#: The layout rule of each RoIAlign-like op (registered once, by :func:`register`).
RULES = {
    ROI_ALIGN_OP: infer_layout_roi_align,
    MULTISCALE_ROI_ALIGN_OP: infer_layout_multiscale_roi_align,
    # (data, rois): rois [K, 6] for the rotated op, [K, 5] for the position-sensitive one
    ROI_ALIGN_ROTATED_OP: infer_layout_roi_align,
    PS_ROI_ALIGN_OP: infer_layout_roi_align,
    QUANTIZED_ROI_ALIGN_OP: infer_layout_roi_align,
}

#: Every op the layout rule serves (for argument checks before the pass).
ROI_ALIGN_LIKE_OPS = tuple(RULES)


def register() -> None:
    """Register the layout rules of the RoIAlign-like ops (:data:`RULES`) as their
    ``FRelaxInferLayout`` (idempotent; reversible through :func:`tvm_roialign.unregister`). The ops
    are registered first (:mod:`tvm_roialign.ops`)."""
    for op_name, rule in RULES.items():
        _registry.get_or_register_op(op_name)
        _registry.set_op_attr(op_name, "FRelaxInferLayout", rule)


__all__ = [
    "MULTISCALE_ROI_ALIGN_OP",
    "PS_ROI_ALIGN_OP",
    "QUANTIZED_ROI_ALIGN_OP",
    "ROI_ALIGN_LIKE_OPS",
    "ROI_ALIGN_OP",
    "ROI_ALIGN_ROTATED_OP",
    "RULES",
    "SUPPORTED_LAYOUTS",
    "current_layout",
    "desired_target",
    "incoming_layout",
    "infer_layout_multiscale_roi_align",
    "infer_layout_output",
    "infer_layout_roi_align",
    "infer_layout_roi_align_like",
    "initial_layout",
    "layout_decision",
    "register",
    "replace_layout_attr",
    "transpose_like",
]
