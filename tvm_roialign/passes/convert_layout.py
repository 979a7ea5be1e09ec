"""``ConvertLayout`` as users wrote it for Relay and tvmc, on top of Relax's own pass.

:class:`ConvertLayout` takes the same ``desired_layouts`` dictionaries people have in scripts and
tvmc configs (``{"nn.conv2d": ["NHWC", "default"], "vision.roi_align": ["NHWC", "default"]}``)
and runs ``relax.transform.ConvertLayout`` with a per-call callback that

* maps Relay-era op names to Relax ones (``nn.conv2d`` -> ``relax.nn.conv2d``);
* resolves ``"default"`` to a concrete layout for each call (stock Relax rejects
  ``"default"`` for conv2d with "Invalid layout default"): the current data layout for the data,
  the conventional kernel layout of the data layout (OIHW for NCHW, HWIO for NHWC) for a kernel;
* never moves an op to a layout that has no legalization: the transposed convolutions legalize
  only in NCW/NCHW/NCDHW, so they are pinned there, with transposes at their edges, even when
  the layout of their producer would otherwise spread into them;
* leaves out ops whose stock rule refuses any desired layout (pools follow their input);

and then folds ``permute_dims`` pairs (:class:`FoldPermuteDims`): pairs that compose to the
identity disappear, others become one ``permute_dims``; and a transpose feeding a flatten and a dense
layer with a constant weight moves into that weight (:class:`~.fold_flatten_permute.FoldFlattenPermute`),
so that a box head's flatten leaves no transpose after an NHWC RoIAlign.
"""

from __future__ import annotations

import warnings

import tvm
from tvm import relax

from .._registry import op_exists
from .fold_flatten_permute import FoldFlattenPermute
from .fold_permute_dims import FoldPermuteDims
from .layout import ROI_ALIGN_LIKE_OPS, desired_target
from .normalize_squeeze_axes import NormalizeSqueezeAxes

_DEFAULT = "default"

#: Conventional kernel layout of each data layout (what ``"default"`` means for a kernel).
_DEFAULT_KERNEL = {
    "NCW": "OIW",
    "NWC": "WIO",
    "NCHW": "OIHW",
    "NHWC": "HWIO",
    "NCDHW": "OIDHW",
    "NDHWC": "DHWIO",
}

_CONV_OPS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")

#: Ops that legalize in one layout only: (data layout, kernel layout) they are pinned to.
PINNED_LAYOUTS = {
    "relax.nn.conv1d_transpose": ("NCW", "IOW"),
    "relax.nn.conv2d_transpose": ("NCHW", "IOHW"),
    "relax.nn.conv3d_transpose": ("NCDHW", "IODHW"),
}

#: Ops whose stock layout rule fails on any desired layout: they follow their input instead.
FOLLOW_ONLY_OPS = frozenset(
    f"relax.nn.{kind}_pool{d}d" for kind in ("max", "avg", "adaptive_avg") for d in (1, 2, 3)
)

#: Ops with a single desired data layout (``"default"``: keep the current one).
_DATA_LAYOUT_ATTR = {
    "relax.image.resize2d": "layout",
    "relax.image.resize3d": "layout",
}


def relax_op_name(name: str) -> str:
    """``"nn.conv2d"`` -> ``"relax.nn.conv2d"``; Relax names are returned unchanged."""
    name = str(name).strip()
    return name if name.startswith("relax.") else "relax." + name


def normalize_desired_layouts(desired_layouts) -> dict[str, list[str]]:
    """Validate ``desired_layouts`` and key it by Relax op names.

    Raises
    ------
    TypeError
        ``desired_layouts`` is not a mapping from op name to a list of layout strings.
    ValueError
        The same op is given twice (``nn.conv2d`` and ``relax.nn.conv2d``) with different
        layouts, a list is empty, or a RoIAlign layout is not ``[NCHW|NHWC|default]`` optionally
        followed by ``"default"``.
    """
    if not hasattr(desired_layouts, "items"):
        raise TypeError(
            "desired_layouts must be a dict {op name: [layout, ...]}, e.g. "
            f"{{'nn.conv2d': ['NHWC', 'default']}}, got {type(desired_layouts).__name__}"
        )
    out: dict[str, list[str]] = {}
    for name, layouts in desired_layouts.items():
        if isinstance(layouts, str) or not all(isinstance(x, str) for x in layouts):
            raise TypeError(
                f"desired_layouts[{name!r}] must be a list of layout strings such as "
                f"['NHWC', 'default'], got {layouts!r}"
            )
        layouts = [str(x) for x in layouts]
        if not layouts:
            raise ValueError(f"desired_layouts[{name!r}] is empty")
        op = relax_op_name(name)
        if not op_exists(op):
            warnings.warn(f"ConvertLayout: no Relax op {op!r} (from {name!r}); ignored", stacklevel=3)
            continue
        if op in out and out[op] != layouts:
            raise ValueError(f"desired_layouts gives {op} twice: {out[op]} and {layouts}")
        out[op] = layouts
    for op, layouts in out.items():
        if op in ROI_ALIGN_LIKE_OPS:
            desired_target(op, layouts, "NCHW")  # raises ValueError now rather than mid-pass
        if op in PINNED_LAYOUTS and layouts[0] not in (_DEFAULT, PINNED_LAYOUTS[op][0]):
            warnings.warn(
                f"ConvertLayout: {op} legalizes only in {PINNED_LAYOUTS[op][0]}; "
                f"it stays there (asked for {layouts[0]})",
                stacklevel=3,
            )
    return out


def _resolve_conv(call, layouts: list[str]) -> list[str]:
    attrs = call.attrs
    data = str(attrs.data_layout) if layouts[0] == _DEFAULT else layouts[0]
    kernel = layouts[1] if len(layouts) > 1 else _DEFAULT
    if kernel == _DEFAULT:
        kernel = _DEFAULT_KERNEL.get(data, str(attrs.kernel_layout))
    out = layouts[2] if len(layouts) > 2 else _DEFAULT
    if out not in (_DEFAULT, data):
        warnings.warn(
            f"ConvertLayout: {call.op.name} cannot legalize out_layout {out} != data layout "
            f"{data}; using {data}",
            stacklevel=2,
        )
    if len(data) != len(kernel) or sorted(data) != sorted(str(attrs.data_layout)):
        raise ValueError(
            f"desired layouts for {call.op.name} must be permutations of "
            f"{attrs.data_layout!s}/{attrs.kernel_layout!s} (axis swaps only), got {layouts}"
        )
    return [data, kernel, data]


def resolve_layouts(call, desired: dict[str, list[str]]) -> dict[str, list[str]]:
    """The concrete desired layouts for one call (what the per-call callback returns)."""
    op = call.op
    if not isinstance(op, tvm.ir.Op):
        return {}
    name = str(op.name)
    if name in PINNED_LAYOUTS:
        return {name: list(PINNED_LAYOUTS[name])}
    layouts = desired.get(name)
    if layouts is None or name in FOLLOW_ONLY_OPS:
        return {}
    if name in _CONV_OPS:
        return {name: _resolve_conv(call, layouts)}
    if name in _DATA_LAYOUT_ATTR:
        cur = str(getattr(call.attrs, _DATA_LAYOUT_ATTR[name]))
        return {name: [cur if layouts[0] == _DEFAULT else layouts[0]]}
    # roi_align and ops shaped like it read "default" themselves; other ops get what was given
    return {name: list(layouts)}


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.ConvertLayout")
class ConvertLayout:  # pylint: disable=too-few-public-methods
    """Convert layouts as Relay's ConvertLayout did, then fold the transposes that cancel.

    Parameters
    ----------
    desired_layouts : dict[str, list[str]]
        Op name (Relay-era ``"nn.conv2d"``, ``"vision.roi_align"`` or Relax ``"relax.nn.conv2d"``)
        to ``[data_layout, kernel_or_rois_layout, ...]``; ``"default"`` keeps the current layout
        (data, rois) or takes the conventional kernel layout (OIHW for NCHW, HWIO for NHWC).
        Example: ``{"nn.conv2d": ["NHWC", "default"], "vision.roi_align": ["NHWC", "default"]}``.

    Raises
    ------
    TypeError, ValueError
        ``desired_layouts`` is not such a dict (see :func:`normalize_desired_layouts`).

    Ops with no Relax counterpart are ignored with a warning; transposed convolutions stay in the
    only layout they legalize in; pools follow their input. Only dataflow blocks are converted
    (as with the stock pass).
    """

    def __init__(self, desired_layouts):
        self.desired_layouts = normalize_desired_layouts(desired_layouts)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return convert_layouts(mod, self.desired_layouts)


def own_layouts(call) -> dict[str, list[str]]:
    """The desired layouts that keep ``call`` in the layouts it has (TVM's rules make a call
    without desired layouts follow its input's layout)."""
    name = str(call.op.name)
    if name in _CONV_OPS:
        attrs = call.attrs
        return {name: [str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)]}
    if name in _DATA_LAYOUT_ATTR:
        return {name: [str(getattr(call.attrs, _DATA_LAYOUT_ATTR[name]))]}
    return {name: [_DEFAULT]}  # RoIAlign-like ops read "default" as their current layout


def convert_layouts(mod: tvm.IRModule, desired: dict[str, list[str]], keep=frozenset()) -> tvm.IRModule:
    """:class:`ConvertLayout`'s steps on ``mod`` with ``desired`` (already
    :func:`normalize_desired_layouts`-ed); the calls in ``keep`` (calls of ``mod`` after
    :class:`NormalizeSqueezeAxes`, among those ``desired`` converts) stay in their own layouts."""

    def callback(call):
        return own_layouts(call) if call in keep else resolve_layouts(call, desired)

    mod = NormalizeSqueezeAxes()(mod)
    converted = relax.transform.ConvertLayout({}, callback)(mod)
    return FoldFlattenPermute()(FoldPermuteDims()(converted))


__all__ = [
    "FOLLOW_ONLY_OPS",
    "PINNED_LAYOUTS",
    "ConvertLayout",
    "convert_layouts",
    "normalize_desired_layouts",
    "own_layouts",
    "relax_op_name",
    "resolve_layouts",
]
