"""torch.export converters of the RoI family: torchvision ``ps_roi_align`` and rotated RoIAlign ops.

* ``torchvision::ps_roi_align(input, rois, spatial_scale, pooled_height, pooled_width,
  sampling_ratio) -> (output, channel_mapping)`` -> ``relax.vision.ps_roi_align`` (the mapping,
  an int32 ``[K, C, PH, PW]`` of the input channel each output element read, is a constant
  broadcast over the rois; a graph that does not use it loses it to dead-code elimination).
* A rotated RoIAlign is no torchvision op: detectron2 and mmcv ship C++ extensions, which a user
  exports as a ``torch.library`` custom op of their own. :func:`roi_align_rotated_converter` builds
  a converter for such an op from its argument list (``signature``) and its system's convention
  (``"detectron2"``: degrees, counter-clockwise, aligned; ``"mmcv"``: radians, its ``aligned`` /
  ``clockwise`` arguments); :func:`roi_align_rotated_convert_map` keys it by the op's name as
  ``from_exported_program``'s ``custom_convert_map`` expects.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tvm import relax

from ..ops.ps_roi_align import make_ps_roi_align
from ..ops.roi_align_rotated import CONVENTIONS, make_roi_align_rotated

__all__ = [
    "DETECTRON2_SIGNATURE",
    "MMCV_SIGNATURE",
    "convert_ps_roi_align",
    "roi_align_rotated_convert_map",
    "roi_align_rotated_converter",
]

#: detectron2's ``torch.ops.detectron2.roi_align_rotated_forward``.
DETECTRON2_SIGNATURE = (
    "input", "rois", "spatial_scale", "pooled_height", "pooled_width", "sampling_ratio",
)
#: mmcv's ``RoIAlignRotated`` arguments, in the order of its ``roi_align_rotated`` function.
MMCV_SIGNATURE = (
    "input", "rois", "output_size", "spatial_scale", "sampling_ratio", "aligned", "clockwise",
)
_ARGUMENTS = frozenset(
    {"input", "rois", "spatial_scale", "pooled_height", "pooled_width", "output_size",
     "sampling_ratio", "aligned", "clockwise"}
)


def convert_ps_roi_align(node, importer):
    """``torchvision::ps_roi_align`` -> ``(relax.vision.ps_roi_align, channel_mapping)``."""
    args = importer.retrieve_args(node)
    data, rois = args[0], args[1]
    spatial_scale = float(args[2]) if len(args) > 2 else 1.0
    pooled_height = int(args[3]) if len(args) > 3 else 1
    pooled_width = int(args[4]) if len(args) > 4 else pooled_height
    sampling_ratio = int(args[5]) if len(args) > 5 else -1
    bb = importer.block_builder
    out = bb.emit(
        make_ps_roi_align(
            data,
            rois,
            (pooled_height, pooled_width),
            spatial_scale=spatial_scale,
            sampling_ratio=sampling_ratio,
        )
    )
    channels = int(out.ty.shape[1])
    mapping = np.arange(channels * pooled_height * pooled_width, dtype="int32").reshape(
        1, channels, pooled_height, pooled_width
    )
    return out, bb.emit(relax.op.broadcast_to(relax.const(mapping), out.ty.shape))


def roi_align_rotated_converter(
    convention: str = "detectron2", signature: Sequence[str] | None = None, **fixed
):
    """A ``custom_convert_map`` converter for a rotated RoIAlign custom op.

    Parameters
    ----------
    convention : str
        ``"detectron2"`` (angles in degrees, counter-clockwise, always aligned) or ``"mmcv"``
        (radians; ``aligned`` / ``clockwise`` from the op's arguments, default True / False).
    signature : sequence of str, optional
        The op's positional arguments by name (default: the convention's op,
        :data:`DETECTRON2_SIGNATURE` or :data:`MMCV_SIGNATURE`); names from ``input``, ``rois``
        (``[K, 6]``: batch, cx, cy, w, h, angle), ``spatial_scale``, ``pooled_height``,
        ``pooled_width``, ``output_size`` (an int or a pair), ``sampling_ratio``, ``aligned``,
        ``clockwise``. Keyword arguments of the node are read by the same names.
    **fixed
        Values for arguments the op does not take (e.g. ``clockwise=True``).

    Raises
    ------
    ValueError
        An unknown convention or argument name.
    """
    if convention not in ("detectron2", "mmcv"):
        raise ValueError(f"convention must be 'detectron2' or 'mmcv', got {convention!r}")
    signature = tuple(signature or (DETECTRON2_SIGNATURE if convention == "detectron2"
                                    else MMCV_SIGNATURE))
    unknown = sorted((set(signature) | set(fixed)) - _ARGUMENTS)
    if unknown or not {"input", "rois"} <= set(signature):
        raise ValueError(
            f"signature must name 'input' and 'rois' and only arguments of {sorted(_ARGUMENTS)}, "
            f"got {list(signature)} and fixed {sorted(fixed)}"
        )

    def convert(node, importer):
        values = dict(CONVENTIONS[convention], spatial_scale=1.0, sampling_ratio=-1, **fixed)
        values.update(zip(signature, importer.retrieve_args(node)))
        values.update(importer._retrieve_args(dict(node.kwargs)))
        if "output_size" in values:
            size = values["output_size"]
            size = (size, size) if isinstance(size, int) else tuple(size)
        else:
            height = int(values.get("pooled_height", 1))
            size = (height, int(values.get("pooled_width", height)))
        return importer.block_builder.emit(
            make_roi_align_rotated(
                values["input"],
                values["rois"],
                tuple(int(s) for s in size),
                spatial_scale=float(values["spatial_scale"]),
                sampling_ratio=int(values["sampling_ratio"]),
                aligned=bool(values["aligned"]),
                clockwise=bool(values["clockwise"]),
                angle_unit=values["angle_unit"],
            )
        )

    return convert


def roi_align_rotated_convert_map(
    op_name: str = "detectron2::roi_align_rotated_forward",
    convention: str = "detectron2",
    signature: Sequence[str] | None = None,
    **fixed,
) -> dict:
    """``{key: converter}`` for ``from_exported_program(custom_convert_map=...)``: the converter
    of :func:`roi_align_rotated_converter` keyed by the op's name as TVM's importer looks it up
    (``"namespace::name"`` or ``"namespace::name.overload"`` -> ``"name.overload"``, overload
    ``default`` when not given)."""
    name = str(op_name).split("::")[-1]
    key = name if "." in name else f"{name}.default"
    return {key: roi_align_rotated_converter(convention, signature, **fixed)}
