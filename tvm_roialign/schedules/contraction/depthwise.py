"""Rule: a fused NHWC depthwise conv2d (one input channel per group, as MobileNet's) with its
epilogue.

Each output vector of channels is the sum of ``KH x KW`` products of an input vector and a weight
vector (the weight laid out ``[KH, KW, 1, C]``: one contiguous vector per tap). The register tile is
a run of ``tw`` consecutive output pixels of one row by one vector of channels, as the JIT
depthwise kernels of oneDNN block the output width: a tap's weight vector is loaded once for the
``tw`` pixels, the input vectors that neighbouring pixels share (a stride-1 row of ``tw`` pixels
reads ``tw + KW - 1`` of them per tap row, not ``tw * KW``) are loaded once, and the ``tw``
independent accumulators keep both multiply-add pipes busy (one pixel's nine taps are a chain of
dependent multiply-adds). ``tw`` is the largest divisor of the output width whose accumulators,
one tap row of weights and two temporaries fit the target's vector registers
(:func:`width_tile`: 8 pixels on AVX2 for a 3x3 or 5x5 conv, 14 or 16 with AVX-512's or AArch64's
32 registers).

The taps and the tile's pixels are unrolled, the channel lanes vectorized, the accumulators kept in
a ``local`` tile written back through the epilogue (bias, clip, SiLU, ...). Rows of all images
and, with a static width, the tiles of a row run in parallel; channel vectors are the innermost
loop of a tile row, so that consecutive tiles read consecutive memory. A symbolic width is not
split (``tw = 1``): the accumulator is one vector whatever the sizes, and the zero padding is read
through its bounds test in the taps' loads (a pass writing a padded copy of the whole input, as
:class:`~tvm_roialign.schedules.contraction.conv2d_nhwc.Conv2DNHWC` has, made a symbolic
MobileNetV2 1.16-1.27x its static build; the static rule pads each task's rows in cache).
"""

from __future__ import annotations

import tvm
from tvm.sym.pattern import detect_linear_equation

from ..base import (
    CPURule,
    find_main_reduction,
    inline_epilogue,
    is_layout_preproc,
    loop_extent,
    pick_lanes,
    static_int,
    try_step,
    vectorize_writeback,
    walk,
)
from ..elementwise import schedule_producers, schedule_rest
from ..target_info import cpu_info
from ..vector_math import ALL_OPS

#: registers a tile needs besides its accumulators: an input vector and the product in flight
_TEMPORARIES = 2
#: bytes of a cache line (x86 and the Arm cores' L1): a task's channels fill whole lines
_LINE_BYTES = 64
#: parallel tasks per core worth having (a task's padded rows are copied once more per task)
_TASKS_PER_CORE = 4


def width_tile(width: int | None, kernel_width: int, registers: int) -> int:
    """Output pixels of a row in one register tile: the largest divisor of ``width`` (1 when
    symbolic) such that the accumulators, ``kernel_width`` weight vectors (one tap row) and
    :data:`_TEMPORARIES` fit in ``registers`` vector registers."""
    if width is None:
        return 1
    most = max(registers - kernel_width - _TEMPORARIES, 1)
    return max(t for t in range(1, min(width, most) + 1) if width % t == 0)


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


def row_chunk(rows_out: int, padded_row_bytes: int, kernel_height: int, stride: int,
              other_tasks: int, info) -> int:
    """Output rows of one parallel task: the largest divisor of ``rows_out`` whose padded input
    rows (``(R - 1) * stride + kernel_height`` of ``padded_row_bytes`` each) fit in half of L2 and
    that still leaves :data:`_TASKS_PER_CORE` tasks per core (``other_tasks``: tasks from the
    other parallel axes) where the sizes allow."""
    budget = max(info.l2_bytes // 2, padded_row_bytes * kernel_height)
    wanted = _TASKS_PER_CORE * info.num_cores
    best = 1
    for rows in range(1, rows_out + 1):
        if rows_out % rows:
            continue
        if ((rows - 1) * stride + kernel_height) * padded_row_bytes > budget:
            break
        if rows > 1 and other_tasks * (rows_out // rows) < wanted:
            break
        best = rows
    return best


def channel_chunk(channels: int, lanes: int, itemsize: int) -> int:
    """Channels of one parallel task: the vectors of one cache line (:data:`_LINE_BYTES`), or one
    vector where they do not divide ``channels``."""
    per_line = max(_LINE_BYTES // (lanes * itemsize), 1)
    for vectors in range(per_line, 0, -1):
        if channels % (vectors * lanes) == 0:
            return vectors * lanes
    return lanes


class DepthwiseConv2DNHWC(CPURule):
    """Depthwise NHWC conv2d: a row of pixels by a vector of channels per register tile, taps
    unrolled (see the module)."""

    vector_ops = ALL_OPS

    def schedule(self, sch, func, target):
        conv = _depthwise_conv(sch)
        if conv is None:
            return None
        block, channels = conv
        dtype = str(sch.get(block).writes[0].source.ty.dtype)
        info = cpu_info(target)
        lanes = pick_lanes(channels, info.lanes(dtype))
        if lanes is None:
            return None
        extents = [loop_extent(sch, lp) for lp in sch.get_loops(block)]
        if None in extents[:3]:
            _schedule_symbolic(sch, block, lanes)
        else:
            _schedule_static(sch, block, lanes, info)
        schedule_rest(sch, lanes)
        return sch


def _schedule_symbolic(sch, block, lanes: int) -> None:
    """A symbolic batch, height or width: one pixel by one vector per tile, rows of all images in
    parallel, the padding inlined (no loop of the image is split)."""
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
    # the zero padding read through its bounds test, not written as a padded copy of the whole
    # input and read back (the static schedule pads each task's rows in cache instead)
    schedule_producers(sch, block, lanes, inline_padding=True)


def _data_strides(sch, block) -> tuple[int, int]:
    """``(stride, dilation)`` of the conv's rows: the coefficients of the output row and the tap
    row in the data's row index (1, 1 where it is not linear)."""
    stmt = sch.get(block)
    row = stmt.reads[0].region[1].min
    coeffs = detect_linear_equation(row, [stmt.iter_vars[1].var, stmt.iter_vars[4].var])
    if len(coeffs) != 3:
        return 1, 1
    stride, dilation = (static_int(v) for v in coeffs[:2])
    return max(stride or 1, 1), max(dilation or 1, 1)


def _schedule_static(sch, block, lanes: int, info) -> None:
    """Static sizes: tasks of (image, channel chunk, row chunk) in parallel, each padding the input
    rows of its chunk into a buffer of its own (in L2) before the register tiles read them."""
    stmt = sch.get(block)
    dtype = str(stmt.writes[0].source.ty.dtype)
    itemsize = max(tvm.runtime.DataType(dtype).bits // 8, 1)
    n, h, w, c, kh, kw, one = sch.get_loops(block)
    batch, height, width, channels, kernel_h, kernel_w, _ = (
        loop_extent(sch, lp) for lp in (n, h, w, c, kh, kw, one)
    )
    stride, dilation = _data_strides(sch, block)
    data_width = static_int(stmt.reads[0].source.ty.shape[2]) or width * stride
    chunk = channel_chunk(channels, lanes, itemsize)
    tw = width_tile(width, kernel_w, info.vector_registers)
    rows = row_chunk(
        height,
        data_width * chunk * itemsize,
        (kernel_h - 1) * dilation + 1,
        stride,
        batch * (channels // chunk),
        info,
    )
    c_chunk, c_outer, c_inner = sch.split(c, [None, chunk // lanes, lanes])
    h_outer, h_inner = sch.split(h, [None, rows])
    w_outer, w_inner = sch.split(w, [None, tw])
    sch.reorder(n, c_chunk, h_outer, h_inner, w_outer, c_outer, kh, kw, one, w_inner, c_inner)
    task = sch.fuse(n, c_chunk, h_outer)
    sch.parallel(task)
    for producer in sch.get_producers(block):
        if is_layout_preproc(sch, producer):
            continue
        if not _is_padding(sch, producer) and try_step(sch.compute_inline, producer):
            continue
        # the padding: the rows of this task's chunk, computed inside the task
        sch.compute_at(producer, task, preserve_unit_loops=True)
        pad_loops = sch.get_loops(producer)
        _, vector = sch.split(pad_loops[-1], [None, lanes])
        sch.vectorize(vector)
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, c_outer, preserve_unit_loops=True)
    sch.vectorize(c_inner)
    sch.unroll(w_inner)
    sch.unroll(kh)
    sch.unroll(kw)
    init = sch.decompose_reduction(block, kh)
    init_loops = sch.get_loops(init)
    sch.vectorize(init_loops[-1])
    sch.unroll(init_loops[-2])
    inline_epilogue(sch, local)
    vectorize_writeback(sch, local, lanes)


def _is_padding(sch, block) -> bool:
    """Whether ``block`` computes through a bounds test (the padding stage)."""
    found = []
    walk(
        sch.get(block).body,
        tvm.ir.expr.Call,
        lambda node: found.append(str(getattr(node.op, "name", ""))),
    )
    return any(name.endswith("if_then_else") for name in found)


__all__ = ["DepthwiseConv2DNHWC", "channel_chunk", "row_chunk", "width_tile"]
