"""What the adaptive-grid CPU kernel (:mod:`~tvm_roialign.schedules.roi_align.kernel`) is built from: the RoI
family's part (:class:`FamilyKernel`), the channel blocking (:func:`channel_block_for`) and the record of
dtypes, shapes, extents and scalar constants its TVMScript reads (:class:`KernelConstants`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import tirx
from tvm.script import tirx as T

from ...topi._sampling import accumulate_dtype, data_dims, index_dtype_for, is_static, output_shape
from ..target_info import cpu_info

__all__ = ["MAX_ACC_BYTES", "FamilyKernel", "KernelConstants", "channel_block_for"]

#: Largest per-bin channel accumulator (bytes, on the stack of each worker); with more channels the
#: channels are processed in blocks that fit (the sampling positions are then computed per block).
MAX_ACC_BYTES = 64 * 1024


@dataclass(frozen=True)
class FamilyKernel:
    """What the kernel needs of a RoI-family op: ``geometry(roi, num_batch, acc, idx)`` (a
    :class:`~tvm_roialign.topi._sampling.RoiGeometry` with an adaptive grid; its ``rotation`` turns
    the samples), the output channel count, and whether output channel ``c`` of bin ``(ph, pw)``
    reads data channel ``(c * PH + ph) * PW + pw`` (position-sensitive)."""

    geometry: Callable
    out_channels: int
    rotated: bool = False
    position_sensitive: bool = False


def channel_block_for(channels: int, lanes: int, acc: str) -> int:
    """Channels per accumulator: all of them if they fit in :data:`MAX_ACC_BYTES`, else the largest
    multiple of ``lanes`` dividing ``channels`` that fits."""
    limit = MAX_ACC_BYTES // (8 if acc == "float64" else 4)
    if channels <= limit:
        return channels
    return max(b for b in range(lanes, limit + 1, lanes) if channels % b == 0)


@dataclass(frozen=True, eq=False)
class KernelConstants:
    """What the kernel's TVMScript reads, computed once per kernel (:meth:`of`): dtypes, buffer
    shapes, loop extents and the scalar constants, as PrimExprs of the right dtypes (index
    arithmetic in ``idx``, float arithmetic in ``acc``)."""

    dtype: str
    rois_dtype: str  # the data's, or float32 for bfloat16 and quantized data (topi._args.ROIS_DTYPES)
    acc: str
    idx: str
    mode: str
    nchw: bool
    rotated: bool
    position_sensitive: bool
    block: int  # channels per accumulator
    data_shape: list
    rois_shape: list
    out_shape: list
    feat_shape: list  # the channels-last copy of an NCHW feature map
    ordered: bool  # work runs in the order of the feature rows it reads (not rotated)
    #: a static grid whose accumulator has the data's dtype: sample rows are the work items,
    #: accumulating in the output (:mod:`~tvm_roialign.schedules.roi_align.kernel_order`); else bin rows
    by_sample_row: bool
    rows: tirx.PrimExpr  # (roi, bin row) pairs
    row_samples: tirx.PrimExpr  # work items per bin row: the static grid's rows, or 1
    items: tirx.PrimExpr  # work items: rows * row_samples
    chunks: tirx.PrimExpr  # runs of bin rows, one per core of the target (sample rows)
    num_keys: tirx.PrimExpr  # sort keys of the items: one per (image, feature row)
    num_rois: tirx.PrimExpr
    channels: tirx.PrimExpr
    bins_shape: list  # [K, PH, PW, C]: the channels-last accumulators of an NCHW output
    #: the accumulator's channel vectors unrolled: they fit in half the target's vector registers
    #: (the other half holds the weights and the loaded data), so that they stay in registers
    unroll_vectors: bool
    pooled_h: tirx.PrimExpr
    pooled_w: tirx.PrimExpr
    bins: tirx.PrimExpr  # PH * PW
    num_batch: tirx.PrimExpr
    height: tirx.PrimExpr
    width: tirx.PrimExpr
    lanes: tirx.PrimExpr
    copy_vectors: tirx.PrimExpr  # channel vectors of the NCHW copy
    block_i: tirx.PrimExpr
    block_vectors: tirx.PrimExpr  # channel vectors of one block
    num_blocks: tirx.PrimExpr
    zero: tirx.PrimExpr
    one: tirx.PrimExpr
    half: tirx.PrimExpr
    i_zero: tirx.PrimExpr
    i_one: tirx.PrimExpr
    init: tirx.PrimExpr  # the reduction's identity
    target: object = None  # what the geometry's products are fenced for (topi's exact_product)

    @classmethod
    def of(cls, data, rois, pooled_size, mode, layout, lanes, channel_block, family, target=None,
           sampling_ratio=0):
        dtype = str(data.dtype)
        acc = accumulate_dtype(dtype)
        num_batch, in_channels, height, width = data_dims(data.shape, layout)
        channels = int(in_channels if family is None else family.out_channels)
        pooled_h, pooled_w = pooled_size
        out_shape = list(output_shape(rois.shape[0], channels, pooled_size, layout))
        idx = index_dtype_for(data.shape, out_shape)
        block = channel_block or channels
        assert channels % block == 0 and block % lanes == 0, (channels, block, lanes)

        def ival(dim):
            return tirx.const(int(dim), idx) if is_static(dim) else tirx.Cast(idx, dim)

        def const(value):
            return tirx.const(value, idx)

        zero = tirx.const(0.0, acc)
        by_sample_row = family is None and sampling_ratio > 0 and acc == dtype
        row_samples = sampling_ratio if by_sample_row else 1
        rows = ival(rois.shape[0]) * const(pooled_h)
        info = cpu_info(target) if target is not None else None
        chunks = info.num_cores if info is not None else 1
        acc_bits = block * tvm.runtime.DataType(acc).bits
        unroll = info is not None and acc_bits <= info.vector_bits * (info.vector_registers // 2)
        return cls(
            dtype, str(rois.dtype), acc, idx, mode, layout == "NCHW",
            family is not None and family.rotated,
            family is not None and family.position_sensitive,
            block, data.shape, rois.shape, out_shape, [num_batch, height, width, in_channels],
            ordered=family is None or not family.rotated,
            by_sample_row=by_sample_row,
            rows=rows,
            row_samples=const(row_samples),
            items=rows * const(row_samples),
            chunks=const(chunks),
            num_keys=ival(num_batch) * ival(height),
            num_rois=ival(rois.shape[0]),
            channels=const(channels),
            bins_shape=[rois.shape[0], pooled_h, pooled_w, channels],
            unroll_vectors=unroll,
            pooled_h=const(pooled_h), pooled_w=const(pooled_w), bins=const(pooled_h * pooled_w),
            num_batch=ival(num_batch), height=ival(height), width=ival(width),
            lanes=const(lanes), copy_vectors=const(int(in_channels) // lanes),
            block_i=const(block), block_vectors=const(block // lanes),
            num_blocks=const(channels // block),
            zero=zero, one=tirx.const(1.0, acc), half=tirx.const(0.5, acc),
            i_zero=const(0), i_one=const(1),
            init=zero if mode == "avg" else tirx.min_value(acc),
            target=target,
        )

    def vector_loop(self, extent):
        """The loop over an accumulator's channel vectors: unrolled when they stay in registers."""
        return T.unroll(extent) if self.unroll_vectors else T.serial(extent)
