"""RoIAlign's CPU schedule rule (x86, ARM and generic llvm strategies) and the vector-width policy.

Both layouts compute one bin ``(roi, ph, pw)`` at a time for all channels, with the bin's sampling
loops outside the channel loop, so that each sample's four positions and four weights are computed
once and shared across channels (the pre-calculation of torchvision's CPU kernel, without its
buffer); the bin's channel vectors are unrolled when their accumulators fit in half the target's
vector registers. NHWC spreads rois x rows of bins over TVM's thread pool and writes each bin's
channel vectors. NCHW spreads rois: a roi's bins accumulate channels-last and its output is written
row by row once they are all done (its channels are ``PH * PW`` elements apart in the output).

Vector lanes (:func:`vector_lanes`, one policy for x86 and ARM, also used by the adaptive-grid kernel
of :mod:`~tvm_roialign.schedules.roi_align.kernel`) are counted in *data* elements of one vector register: 2
for float64, 4 for float32 and 8 for float16 in a 128-bit register (NEON, SSE), 16 / 32 with AVX-512. float16
data are accumulated in float32, so a float16 vector is one full-width load of data widened into two
float32 registers (ARM ``fcvtl``/``fcvtl2``, x86 ``vcvtph2ps``) that take one multiply-add each;
counting in accumulator elements instead would halve every load.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule

from ..base import buffer_dtypes, find_block, largest_divisor_lanes, loop_extent
from ..target_info import cpu_info
from .base import (
    GATHERED_CHANNELS_ATTR,
    NESTED_ACC_BLOCK,
    RoIAlignRule,
    find_roi_blocks,
    layout_of,
)

__all__ = ["RoIAlignCPU", "vector_bits", "vector_lanes"]


def vector_bits(target: tvm.target.Target) -> int:
    """Width of the target's vector registers, from the package's one target-info layer
    (:func:`~tvm_roialign.schedules.target_info.cpu_info`, which the conv/matmul rules use too): NEON's 128
    bits on ARM (SVE's width is not known at compile time), 128 / 256 / 512 for SSE / AVX2 / AVX-512 x86 CPUs
    by their features."""
    return cpu_info(target).vector_bits


def vector_lanes(target: tvm.target.Target, dtype: str) -> int:
    """Lanes of a channel vector of ``dtype`` data on ``target``: one register of data elements."""
    return cpu_info(target).lanes(str(dtype))


class RoIAlignCPU(RoIAlignRule, CPUScheduleRule):
    """Parallel over (roi, bin row) in NHWC, over rois in NCHW; channels innermost and vectorized
    by :func:`vector_lanes`.

    ``vectorize=False`` gives the plain schedule of the generic llvm strategy (no vector width is
    assumed for an unknown CPU). Returns None for a PrimFunc that is not a RoIAlign of this package.
    """

    def __init__(self, vectorize: bool = True):
        self.vectorize = vectorize

    def schedule(self, sch, func, target) -> Schedule | None:
        layout = layout_of(func)
        if find_block(sch, NESTED_ACC_BLOCK) is not None:
            return _schedule_nested(sch, layout)
        acc, out = find_roi_blocks(sch)
        max_lanes = vector_lanes(target, buffer_dtypes(func)[0]) if self.vectorize else 1
        lanes = largest_divisor_lanes(loop_extent(sch, sch.get_loops(out)[layout.index("C")]),
                                      max_lanes)
        gathered = func.attrs is not None and bool(func.attrs.get(GATHERED_CHANNELS_ATTR, False))
        if lanes > 1 and layout == "NCHW" and not gathered:
            _channels_last_copies(sch, acc, lanes)
        if lanes > 1 and layout == "NCHW":
            acc, parallel, c_acc, decompose_at = _roi_major(sch)
        else:
            acc, parallel, c_out, c_acc, decompose_at = _bin_major(sch, layout)
            if lanes > 1:
                _, inner = sch.split(c_out, [None, lanes])
                sch.vectorize(inner)
        if lanes > 1:
            vectors, inner = sch.split(c_acc, [None, lanes])
            sch.vectorize(inner)
            _unroll_to_registers(sch, vectors, target)
        sch.parallel(parallel)
        sch.decompose_reduction(acc, decompose_at)
        return sch


def _unroll_to_registers(sch: Schedule, vectors, target) -> None:
    """Unroll the bin's channel vectors when their accumulators fit in half the target's vector
    registers (the other half holds the four weights and the loaded data), so that they stay in
    registers over the sampling loops."""
    extent = loop_extent(sch, vectors)
    if extent is not None and extent <= cpu_info(target).vector_registers // 2:
        sch.unroll(vectors)


def _roi_major(sch: Schedule):
    """NCHW: one roi per parallel iteration. Its bins accumulate channels-last (``[PH, PW, C]``:
    contiguous channel vectors, the sampling loops outside the channel loop as in
    :func:`_bin_major`), and its output ``[C, PH, PW]`` is written in one contiguous pass once every
    bin is done: a bin's channels lie ``PH * PW`` elements apart in the output, so writing them per
    bin would store to a different cache line for each channel. Returns (acc, the roi loop, acc
    channel loop, the loop to decompose the reduction at)."""
    acc, out = find_roi_blocks(sch)
    sch.transform_layout(acc, ("write", 0), lambda k, c, ph, pw: (k, ph, pw, c))
    k, _, _, pw_out = sch.get_loops(out)
    # each output row of PW elements as one vector (its elements are PH * PW bins of the
    # accumulator apart, which are loaded one by one)
    sch.vectorize(pw_out)
    sch.compute_at(acc, k, preserve_unit_loops=True)
    # the accumulator's own loops under k: (k, c, ph, pw, iy, ix)
    _, c_acc, ph, pw, iy, ix = sch.get_loops(acc)[1:]
    sch.reorder(ph, pw, iy, ix, c_acc)
    return acc, k, c_acc, iy


def _bins_at(sch: Schedule, layout: str, block):
    """Output loops in the order ``(k, ph, pw, c)``, ``k`` and ``ph`` fused; ``block`` computed at
    the bin (under ``pw``). Returns ``(fused, c)``."""
    _, out = find_roi_blocks(sch)
    if layout == "NHWC":
        k, ph, pw, c = sch.get_loops(out)
    else:
        k, c, ph, pw = sch.get_loops(out)
        sch.reorder(k, ph, pw, c)
    fused = sch.fuse(k, ph)
    sch.compute_at(block, pw, preserve_unit_loops=True)
    return fused, c


def _bin_major(sch: Schedule, layout: str):
    """The accumulator at its bin, its sampling loops outside its channel loop. Returns (acc, fused
    parallel loop, out channel loop, acc channel loop, the loop to decompose the reduction at)."""
    acc, _ = find_roi_blocks(sch)
    fused, c = _bins_at(sch, layout, acc)
    # the accumulator's own loops under (fused, pw), unit loops kept: (k, c, ph, pw, iy, ix) in
    # NCHW, (k, ph, pw, c, iy, ix) in NHWC
    acc_loops = sch.get_loops(acc)[2:]
    c_acc = acc_loops[1 if layout == "NCHW" else 3]
    iy, ix = acc_loops[-2:]
    sch.reorder(iy, ix, c_acc)
    return acc, fused, c, c_acc, iy


def _schedule_nested(sch: Schedule, layout: str) -> Schedule:
    """Adaptive grids: the sampling loops depend on the roi, so TE nests them in a block of their
    own (``roi_align_acc_l1``) per output element; they cannot move outside the channel loop. The
    accumulator is computed at its bin and rois x bin rows run in parallel."""
    fused, _ = _bins_at(sch, layout, sch.get_sblock(NESTED_ACC_BLOCK))
    sch.parallel(fused)
    return sch


def _feature_reads(sch: Schedule, block):
    """Indices of the 4-D buffers (feature maps) that ``block`` reads."""
    return [i for i, region in enumerate(sch.get(block).reads) if len(region.region) == 4]


def _channels_last_copies(sch: Schedule, acc, lanes: int) -> None:
    """NCHW: vector loads across channels would be strided gathers (one scalar load per lane).
    Copy each feature map to channels-last inside the kernel (a tiled, vectorized transpose, in
    parallel over rows) so that the bin-major loop reads contiguous channel vectors."""
    for index in _feature_reads(sch, acc):
        cache = sch.cache_read(acc, index, "global")
        sch.transform_layout(cache, ("write", 0), lambda n, c, h, w: (n, h, w, c))
        n, c, h, w = sch.get_loops(cache)
        w_outer, w_inner = sch.split(w, [None, lanes])
        c_outer, c_inner = sch.split(c, [None, lanes])
        sch.reorder(n, h, w_outer, c_outer, w_inner, c_inner)
        sch.parallel(sch.fuse(n, h))
        sch.vectorize(c_inner)
