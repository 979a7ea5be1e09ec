"""Rule: a fused NHWC depthwise conv2d (one input channel per group, as MobileNet's) with its
epilogue.

Each output vector of channels is the sum of ``KH x KW`` products of an input vector and a weight
vector (the weight laid out ``[KH, KW, 1, C]``: one contiguous vector per tap): the taps unrolled,
the channel lanes vectorized, the sum kept in a one-vector ``local`` accumulator and written back
through the epilogue (bias, clip, ...). Image rows of all images run in parallel. No loop of the
image is split, so a symbolic batch, height or width costs nothing: the accumulator is one vector
whatever the sizes (the fallback rule's row tile, split over a symbolic width, guards every step).
The padding stage is its own parallel, vectorized pass, as for :class:`~.conv2d_nhwc.Conv2DNHWC`.
"""

from __future__ import annotations

from .base import (
    CPURule,
    find_main_reduction,
    inline_epilogue,
    loop_extent,
    pick_lanes,
    static_int,
    vectorize_writeback,
)
from .elementwise import schedule_producers, schedule_rest
from .target_info import cpu_info
from .vector_math import ALL_OPS


def _depthwise_conv(sch):
    """``(block, channels)`` of a depthwise NHWC conv (loops ``n, h, w, c, kh, kw, 1``), or None."""
    block = find_main_reduction(sch)
    if block is None:
        return None
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    if not stmt.name_hint.startswith("group_conv2d_nhwc") or len(stmt.reads) != 2 or len(loops) != 7:
        return None
    extents = [loop_extent(sch, lp) for lp in loops]
    channels = extents[3]
    if channels is None or None in extents[4:] or extents[6] != 1:
        return None
    # one input channel per output channel: the data has as many channels as the output
    if static_int(stmt.reads[0].source.ty.shape[-1]) != channels:
        return None
    return block, channels


class DepthwiseConv2DNHWC(CPURule):
    """Depthwise NHWC conv2d: taps unrolled over one vector of channels (see the module)."""

    vector_ops = ALL_OPS

    def schedule(self, sch, func, target):
        conv = _depthwise_conv(sch)
        if conv is None:
            return None
        block, channels = conv
        dtype = str(sch.get(block).writes[0].source.ty.dtype)
        lanes = pick_lanes(channels, cpu_info(target).lanes(dtype))
        if lanes is None:
            return None
        n, h, w, c, kh, kw, one = sch.get_loops(block)
        c_outer, c_inner = sch.split(c, [None, lanes])
        sch.reorder(n, h, w, c_outer, kh, kw, one, c_inner)
        sch.parallel(sch.fuse(n, h))
        local = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(local, c_outer, preserve_unit_loops=True)
        sch.vectorize(c_inner)
        sch.unroll(kh)
        sch.unroll(kw)
        init = sch.decompose_reduction(block, kh)
        sch.vectorize(sch.get_loops(init)[-1])
        inline_epilogue(sch, local)
        vectorize_writeback(sch, local, lanes)
        schedule_producers(sch, block, lanes)
        schedule_rest(sch, lanes)
        return sch


__all__ = ["DepthwiseConv2DNHWC"]
