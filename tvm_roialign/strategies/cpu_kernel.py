"""The x86 and ARM strategies' kernel: from the op's attributes to the hand-scheduled CPU kernel of
:mod:`tvm_roialign.schedules.roi_align.kernel`, for RoIAlign with an adaptive grid or NHWC data, and
for the RoI family with adaptive grids.

:func:`cpu_adaptive_kernel` tells the ops of the RoI family apart by their attributes, checks them
as the op's TE compute does, picks the vector lanes
(:func:`~tvm_roialign.schedules.roi_align.cpu.vector_lanes`) and the channel blocking, and returns
the kernel as a TE extern op; it returns None (the TE path is used) for a static grid
(``sampling_ratio > 0``) in NCHW or of a family op, a symbolic channel count, or arguments the TE
compute would reject (so that it raises its own error).
"""

from __future__ import annotations

from tvm import te

from ..schedules.base import largest_divisor_lanes
from ..schedules.roi_align.cpu import vector_lanes
from ..schedules.roi_align.kernel import roi_align_adaptive_cpu
from ..schedules.roi_align.kernel_constants import FamilyKernel, channel_block_for
from ..topi._sampling import (
    accumulate_dtype,
    data_dims,
    is_static,
    roi_geometry,
    rotated_roi_geometry,
)
from ..topi.ps_roi_align import check_ps_roi_align_args
from ..topi.roi_align import check_roi_align_args, check_spatial_scale
from ..topi.roi_align_rotated import angle_scale, check_roi_align_rotated_args

__all__ = ["cpu_adaptive_kernel"]


def _family_of(data, rois, attrs, target=None):
    """``(pooled, spatial_scale, mode, FamilyKernel or None)`` of the op ``attrs`` belong to
    (RoIAlign, rotated or position-sensitive RoIAlign, told apart by their fields); ValueError /
    TypeError as the op's TE compute raises them."""
    layout = str(attrs.layout)
    spatial_scale = check_spatial_scale(attrs.spatial_scale)
    num_batch = data_dims(data.shape, layout)[0]
    if hasattr(attrs, "angle_unit"):  # relax.vision.roi_align_rotated
        pooled = check_roi_align_rotated_args(data.shape, data.dtype, rois.shape, rois.dtype,
                                              attrs.pooled_size, layout, attrs.angle_unit)

        def geometry(roi, _num_batch, acc, idx):
            return rotated_roi_geometry(roi, num_batch, pooled, spatial_scale, 0, attrs.aligned,
                                        angle_scale(attrs.angle_unit), attrs.clockwise, acc, idx,
                                        target)

        channels = data_dims(data.shape, layout)[1]
        if not is_static(channels):
            raise ValueError("symbolic channels")
        return pooled, spatial_scale, "avg", FamilyKernel(geometry, int(channels), rotated=True)
    if getattr(attrs, "position_sensitive", False):  # relax.vision.ps_roi_align
        pooled, channels = check_ps_roi_align_args(data.shape, data.dtype, rois.shape, rois.dtype,
                                                   attrs.pooled_size, layout)
        if channels is None:
            raise ValueError("symbolic channels")

        def geometry(roi, _num_batch, acc, idx):
            return roi_geometry(roi, num_batch, pooled, spatial_scale, 0, True, acc, idx, True,
                                target)

        return pooled, spatial_scale, "avg", FamilyKernel(geometry, channels,
                                                          position_sensitive=True)
    mode = str(attrs.mode)
    pooled = check_roi_align_args(data.shape, data.dtype, rois.shape, rois.dtype,
                                  attrs.pooled_size, layout, mode)
    return pooled, spatial_scale, mode, None


def cpu_adaptive_kernel(te_inputs, attrs, target):
    """Strategy kernel ``(te_inputs, attrs, target) -> te.Tensor | None`` (x86 and ARM strategies).

    ``te_inputs`` are the ``data`` and ``rois`` placeholders, ``attrs`` the op's attributes
    (:class:`~tvm_roialign.ops.roi_align.RoiAlignAttrs`, ``RoiAlignRotatedAttrs`` or
    ``PSRoiAlignAttrs``). Returns the output tensor of the scheduled adaptive-grid kernel
    (:func:`roi_align_adaptive_cpu`) wrapped as a TE extern op, or None (the op's TE compute is
    used) for ``sampling_ratio > 0`` in NCHW or of a family op, a symbolic channel count, or arguments the
    TE compute rejects (it raises the error).
    """
    if len(te_inputs) != 2:
        return None
    data, rois = te_inputs
    layout = str(attrs.layout)
    try:
        pooled, spatial_scale, mode, family = _family_of(data, rois, attrs, target)
    except (ValueError, TypeError):
        return None
    sampling_ratio = int(attrs.sampling_ratio)
    if sampling_ratio > 0 and (family is not None or layout == "NCHW"):
        # an NCHW output of a static grid: the TE schedule's roi-major write is faster than the
        # kernel's channels-last copies
        return None
    channels = data_dims(data.shape, layout)[1] if family is None else family.out_channels
    if not is_static(channels) or int(channels) <= 0:
        return None
    acc = accumulate_dtype(data.dtype)
    lanes = largest_divisor_lanes(int(channels), vector_lanes(target, data.dtype))
    func = roi_align_adaptive_cpu(
        data,
        rois,
        pooled,
        spatial_scale,
        mode,
        bool(getattr(attrs, "aligned", True)),
        layout,
        lanes,
        channel_block_for(int(channels), lanes, acc),
        bool(getattr(attrs, "half_pixel", False)),
        family,
        target,
        sampling_ratio,
    )
    return te.extern_primfunc(
        [data, rois], func, name="roi_align_adaptive", tag=f"roi_align_{layout.lower()}"
    )
