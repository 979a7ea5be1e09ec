"""RoIAlign's GPU schedule rule, shared by the CUDA and Metal strategies: one thread per output
element (:class:`RoIAlignCUDA` at most 256 threads per block; :class:`RoIAlignMetal` at most 256 per
threadgroup, and no float64: Metal has no 64-bit floating point type).

The output loops are fused in memory order, so that consecutive threads write consecutive output
elements: ``(k, c, ph, pw)`` in NCHW, ``(k, ph, pw, c)`` in NHWC. In NHWC the channel is then the
fastest-varying index within a warp, and the warp's loads of a sample's four corners are contiguous
(coalesced). The fused loop is split into ``[blocks, threads]`` and bound to ``blockIdx.x`` /
``threadIdx.x``; a thread computes its element's sampling grid itself (the reduction block
``roi_align_acc``, and with an adaptive grid its nesting block ``roi_align_acc_l1``, are computed at
the thread loop with the accumulator in a register, ``local`` scope) and writes it once.

No thread loops over outputs: a launch covers the output exactly once (``blocks * threads >= total
> (blocks - 1) * threads``, the tail guarded by a predicate), so a thread's work is its element's
sampling grid and never grows with the output. The grid is at most ``MAX_GRID_BLOCKS`` blocks
(CUDA's limit along x, kept for Metal too), i.e. over ``5 * 10**11`` outputs with 256 threads, far
beyond any device memory; a larger static output raises ValueError.

Index width: the strategy creates the PrimFunc with int64 indices when an input or the output
has more than ``2**31 - 1`` elements; the thread indices are then widened before they are combined.
"""

from __future__ import annotations

from tvm.s_tir import Schedule
from tvm.s_tir.dlight.base.utils import max_threads_per_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

from ..base import buffer_dtypes, find_block, loop_extent
from .base import LEVEL_BLOCK, NESTED_ACC_BLOCK, RoIAlignRule, find_roi_blocks

#: CUDA's limit of blocks along x (also applied to Metal's threadgroups).
MAX_GRID_BLOCKS = 2**31 - 1
#: Threads per CUDA block, capped by the target's ``max_num_threads``: a RoIAlign thread holds
#: 32-40 registers, so 256-thread blocks let several blocks share an SM's register file.
CUDA_THREADS = 256
#: Threads per Metal threadgroup: the target's ``max_num_threads``, never more than 256.
METAL_MAX_THREADS = 256


def _threads_for(total: int | None, max_threads: int) -> int:
    """``max_threads``, or the smallest power of two (>= 32, one warp) covering a small ``total``."""
    if total is None or total >= max_threads:
        return max_threads
    threads = 32
    while threads < total:
        threads *= 2
    return min(threads, max_threads)


class RoIAlignGPU(RoIAlignRule, GPUScheduleRule):
    """One thread per output element.

    Threads per block: dlight's ``max_threads_per_block(target)``, at most ``thread_cap``.
    ``bind_threads=False`` builds the same loop nest without binding it to GPU threads, so that the
    schedule's arithmetic can be run and checked on the host CPU.

    ``apply`` returns None for a PrimFunc that is not a RoIAlign of this package (no
    ``roi_align_acc`` / ``roi_align`` blocks or no ``roi_align.layout`` attribute), and raises
    ValueError when a static output needs more than ``MAX_GRID_BLOCKS`` blocks.
    """

    def __init__(self, thread_cap: int | None = None, bind_threads: bool = True):
        self.thread_cap = thread_cap
        self.bind_threads = bind_threads

    def max_threads(self, target) -> int:
        threads = int(max_threads_per_block(target))
        if self.thread_cap is not None:
            threads = min(threads, self.thread_cap)
        return max(threads, 1)

    def schedule(self, sch, func, target) -> Schedule | None:
        acc, out = find_roi_blocks(sch)
        fused = sch.fuse(*sch.get_loops(out))  # memory order: the innermost output index is fastest
        total = loop_extent(sch, fused)
        threads = _threads_for(total, self.max_threads(target))
        if total is not None and -(-total // threads) > MAX_GRID_BLOCKS:
            raise ValueError(
                f"roi_align: an output of {total} elements needs more than {MAX_GRID_BLOCKS} blocks "
                f"of {threads} threads, the most one GPU launch can have; split the rois"
            )
        self._split_and_bind(sch, fused, threads)
        level = find_block(sch, LEVEL_BLOCK)
        if level is not None:  # multiscale_roi_align: one thread per roi computes its level
            (rois,) = sch.get_loops(level)
            self._split_and_bind(sch, rois, threads)
        tx = sch.get_loops(out)[-1]
        # adaptive grid: the sampling loops' extents depend on the roi; they stay nested in their
        # own block, which computes the whole reduction of the thread's element
        nested = find_block(sch, NESTED_ACC_BLOCK)
        reduction = nested if nested is not None else acc
        sch.compute_at(reduction, tx)
        sch.set_scope(reduction, 0, "local")
        # the accumulator's init stays in the block (``if iy == 0 and ix == 0``):
        # decompose_reduction refuses a block under the tail predicate
        return sch

    def _split_and_bind(self, sch, loop, threads):
        bx, tx = sch.split(loop, [None, threads])
        if self.bind_threads:
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")


class RoIAlignCUDA(RoIAlignGPU):
    """The GPU rule with at most :data:`CUDA_THREADS` threads per block."""

    def __init__(self, bind_threads: bool = True):
        super().__init__(CUDA_THREADS, bind_threads)


def check_metal_dtypes(func, target) -> None:
    """Raise ValueError when a buffer of ``func`` is float64 (Metal Shading Language has no double)."""
    for dtype in buffer_dtypes(func):
        if dtype == "float64":
            raise ValueError(
                f"roi_align: dtype float64 is not supported by target {target.kind.name!r} "
                "(Metal has no 64-bit floating point); use float32 or float16 data and rois"
            )


class RoIAlignMetal(RoIAlignGPU):
    """The GPU rule with at most :data:`METAL_MAX_THREADS` threads per threadgroup; raises
    ValueError for float64 data (unsupported by Metal)."""

    def __init__(self, bind_threads: bool = True):
        super().__init__(METAL_MAX_THREADS, bind_threads)

    def schedule_func(self, func, target):
        check_metal_dtypes(func, target)
        return super().schedule_func(func, target)


__all__ = [
    "CUDA_THREADS",
    "MAX_GRID_BLOCKS",
    "METAL_MAX_THREADS",
    "RoIAlignCUDA",
    "RoIAlignGPU",
    "RoIAlignMetal",
    "check_metal_dtypes",
]
