"""ConvertLayout dictionaries for converting a whole model to one layout.

``desired_layouts("NHWC")`` is the dictionary the CLI (``compile --desired-layout``) and the
Mask R-CNN build hand to :class:`~.convert_layout.ConvertLayout`: conv2d and both RoIAlign ops to
NHWC, their kernels and rois in the conventional layout (``"default"``). Ops are named as in
:data:`LAYOUT_OPS` (``roi_align`` covers the fused multi-level op too).
"""

from __future__ import annotations

from collections.abc import Iterable

#: Layouts a whole model can be converted to.
LAYOUTS = ("NCHW", "NHWC")

#: Short op names -> the Relax ops they convert.
LAYOUT_OPS = {
    "conv2d": ("relax.nn.conv2d",),
    "roi_align": ("relax.vision.roi_align", "relax.vision.multiscale_roi_align"),
    "multiscale_roi_align": ("relax.vision.multiscale_roi_align",),
    "max_pool2d": ("relax.nn.max_pool2d",),
    "avg_pool2d": ("relax.nn.avg_pool2d",),
    "resize2d": ("relax.image.resize2d",),
}

#: The ops converted when none are named.
DEFAULT_OPS = ("conv2d", "roi_align")


def desired_layouts(layout: str = "NHWC", ops: str | Iterable[str] | None = None) -> dict[str, list[str]]:
    """ConvertLayout's ``desired_layouts`` putting ``ops`` (default conv2d and RoIAlign) in ``layout``.

    ``ops`` is a comma-separated string or a sequence of names from :data:`LAYOUT_OPS` (a Relax or
    Relay-era prefix such as ``relax.nn.`` is accepted and dropped).

    Raises
    ------
    ValueError
        ``layout`` is not NCHW or NHWC, ``ops`` is empty or names an unknown op.
    """
    layout = str(layout).upper()
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be NCHW or NHWC, got {layout!r}")
    if ops is None:
        ops = DEFAULT_OPS
    names = [n.strip() for n in (ops.split(",") if isinstance(ops, str) else ops) if n.strip()]
    if not names:
        raise ValueError("no ops to convert; name some, e.g. conv2d,roi_align")
    out: dict[str, list[str]] = {}
    for name in names:
        key = name.split(".")[-1]
        if key not in LAYOUT_OPS:
            raise ValueError(f"unknown op {name!r}; known: {', '.join(LAYOUT_OPS)}")
        for op in LAYOUT_OPS[key]:
            out[op] = [layout, "default"]
    return out


__all__ = ["DEFAULT_OPS", "LAYOUTS", "LAYOUT_OPS", "desired_layouts"]
