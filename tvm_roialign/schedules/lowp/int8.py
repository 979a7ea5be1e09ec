"""Rule: the int8 contraction (:mod:`tvm_roialign.topi.int8_contraction`) on AMX-INT8 tiles
(``tdpbusd``), or on AVX512-VNNI (``vpdpbusd``) where the target has no AMX-INT8, or on AVX-VNNI
(``vpdpbusd`` on ymm) where it has neither, else on AVX2
(``vpmaddubsw``, weights within +-64); on AArch64 on ``usdot`` (I8MM) or ``sdot`` (the dot product alone).

The function has three stages, ``int8_gather_a`` (activations quantized to uint8, im2col'd for a
conv), ``int8_contraction`` (the GEMM, int32 accumulation) and ``int8_output`` (dequantized to fp32
in the op's shape), followed by whatever elementwise epilogue fusion gave it (bias, residual add,
ReLU, and the next contraction's quantization where its input is quantized before it:
:func:`~tvm_roialign.topi.int8_contraction.quantize_activation`), inlined into the output stage. The
GEMM is cut into 32 x 32 output blocks, each computed by the micro-kernel
(:mod:`~tvm_roialign.schedules.intrin.amx`, :mod:`~tvm_roialign.schedules.intrin.vnni`,
:mod:`~tvm_roialign.schedules.intrin.neon_int8`) over ``kc`` reduction elements, with the loop order and the
reduction chunks of the bf16 contraction (:func:`choose_blocking`, for operands of one byte).
Where a block covers the whole reduction, its output stage runs right after it (its int32 sums stay
in L1 instead of a pass through memory), and with the row blocks outermost and at least two a core,
a conv's im2col rows are gathered per row block (:func:`_whole_reduction`).

Targets with none of them are not served: the graph pass emits these functions only for targets with
one, or under :func:`tvm_roialign.testing.generic_int8`, whose functions the generic rules schedule.
"""

from __future__ import annotations

import functools
import math

from tvm.tirx import IndexMap

from ...topi.contraction_geometry import ROW_TAP_DEPTH
from ...topi.int8_contraction import CONTRACTION, GATHER_A, OUTPUT, PADDED_INPUT
from ..base import CPURule, find_block, inline_epilogue, loop_extent, static_int, try_step
from ..elementwise import schedule_injective_block, schedule_rest
from ..intrin.amx import AMX_TILES, BLOCK, INT8, amx_int8_intrin
from ..intrin.avx2 import avx2_int8_intrin
from ..intrin.neon_int8 import neon_int8_intrin
from ..intrin.vnni import avx_vnni_intrin, vnni_intrin
from ..target_info import cpu_info
from ..vector_math import ALL_OPS

#: reduction elements of one step of the micro-kernels
STEP = INT8.step

#: the largest weight magnitude of each kind's kernels where it is not 127: AVX2's ``vpmaddubsw`` adds
#: two u8 x s8 products in int16, exact only while ``2 * 255 * |w| <= 32767``
WEIGHT_LIMITS = {"avx2": 64}


def int8_weight_limit(kind: str | None) -> int:
    """The weights' quantization range ``[-limit, limit]`` of the kernels ``kind``."""
    return WEIGHT_LIMITS.get(kind, 127)


#: how many times fewer products fp32 Winograd F(4x4, 3x3) needs than a direct 3x3 conv, as
#: :func:`int8_leaves_winograd_convs` counts it
WINOGRAD_SAVING = 2.25


def int8_leaves_winograd_convs(kind: str | None) -> bool:
    """Whether the convolutions Winograd takes stay fp32 with the kernels ``kind``: where their rate
    over fp32 (:data:`INT8_RATES`) is below Winograd's saving in products. AVX2's int8 multiply-adds
    (two instructions per 32 products, exactness in int16) run at most twice its fp32 FMA rate, and
    F(4x4, 3x3) needs 2.25x fewer products (a 3x3 stride-1 conv over 64 channels: fp32 Winograd
    0.59 ms, int8 1.14 ms on an AMD Zen 3); every other kind's rate is 4x or more."""
    return INT8_RATES.get(kind, 4) < WINOGRAD_SAVING


#: how many times fp32's rate of products each kind's kernels run at (per core, at best): AVX2's
#: two multiply-adds per 32 products 2x, the dot products 4x, AMX's tiles 16x
INT8_RATES = {"avx2": 2, "avxvnni": 4, "avx512vnni": 4, "usdot": 4, "sdot": 4, "amx": 16}


def int8_pays(kind: str | None, reduction: int, kernel_reduction: int | None = None) -> bool:
    """Whether the kernels ``kind`` beat fp32 on a contraction over ``reduction`` elements that
    they run as ``kernel_reduction`` (default ``reduction``; a narrow-tap conv's kernel rows are
    padded further): the kernels pad it to a multiple of 64 (:data:`STEP`), and where the padded
    products outnumber the real ones by more than the kernels' rate over fp32 (:data:`INT8_RATES`),
    fp32 is faster (a 1x1 conv over 16 channels: 4x the products, on AVX2 at 2x the rate; measured
    on a Zen 3, mobilenet_v2 int8 5.46 ms with such layers in int8, 4.35 ms with them in fp32;
    mobilenet_v2's 3x3 RGB stem: 27 products a row run as 128)."""
    padded = -(-(kernel_reduction or reduction) // STEP) * STEP
    return padded <= INT8_RATES.get(kind, 4) * reduction


def int8_instructions(target) -> str | None:
    """``"amx"`` (AMX-INT8), ``"avx512vnni"``, ``"usdot"`` (AArch64 I8MM), ``"sdot"`` (AArch64
    dot product without I8MM), ``"avxvnni"`` (x86 with the 256-bit AVX-VNNI and no AVX512-VNNI: Intel
    client cores since Alder Lake, Sierra Forest), ``"avx2"`` (x86 with AVX2: weights within +-64,
    :data:`WEIGHT_LIMITS`), or None: the int8 kernels ``target`` runs."""
    info = cpu_info(target)
    if info.has_amx_int8:
        return "amx"
    if info.arch == "x86" and {"avx512f", "avx512vnni"} <= info.features:
        return "avx512vnni"
    if info.has_i8mm:
        return "usdot"
    if info.has_dotprod:
        return "sdot"
    if info.arch == "x86" and "avxvnni" in info.features:
        return "avxvnni"
    if info.arch == "x86" and "avx2" in info.features:
        return "avx2"
    return None


def choose_blocking(rows: int | None, columns: int, reduction: int, l2_bytes: int) -> tuple[int, bool]:
    """``(kc, rows_outer)``: the reduction chunk and the loop order of the 32 x 32 blocks: the whole
    reduction where one operand's fits in half of L2 (the weights -> row blocks outermost, else
    column blocks outermost), else the largest chunk (a multiple of 64 dividing the reduction)
    whose slice of the smaller operand fits. ``rows`` None: symbolic, taken as large."""
    budget = l2_bytes // 2
    if reduction * columns <= budget:
        return reduction, True
    if rows is None:
        rows = reduction * columns + budget
    if reduction * rows <= budget:
        return reduction, False
    rows_outer = columns <= rows
    kept = columns if rows_outer else rows
    chunk = STEP
    for candidate in range(STEP, reduction + 1, STEP):
        if reduction % candidate == 0 and candidate * kept <= budget:
            chunk = candidate
    return chunk, rows_outer


def _shape(sch, block, index: int = 0) -> list[int | None]:
    return [static_int(d) for d in sch.get(block).writes[index].source.ty.shape]


def _gather_lanes(sch, gather, lanes: int) -> int:
    """The gather's vector: ``lanes`` (fp32 input, quantized in it), for a narrow-tap conv's padded
    copy one kernel row's run (:data:`ROW_TAP_DEPTH` bytes), or for a uint8 input (quantized by its
    producer) up to 64 bytes within one kernel tap (a divisor of the input's channels)."""
    if find_block(sch, PADDED_INPUT) is not None:
        return ROW_TAP_DEPTH
    source = sch.get(gather).reads[0].source.ty
    channels = static_int(source.shape[-1])
    if str(source.dtype) != "uint8" or channels is None:
        return lanes
    return max(math.gcd(channels, 64), 1)


def _schedule_padded_input(sch, padded) -> None:
    """A narrow-tap conv's padded copy ``[n, y, x * c + ch]``: one parallel step per padded input
    row, the row as pixels of ``c`` channels (the pixel and channel then index the input without a
    division)."""
    channels = static_int(sch.get(padded).reads[0].source.ty.shape[-1])
    b, y, xc = sch.get_loops(padded)
    sch.parallel(sch.fuse(b, y))
    if channels and (loop_extent(sch, xc) or 0) % channels == 0:
        sch.unroll(sch.split(xc, [None, channels])[1])


def _schedule_gather(sch, gather, lanes: int, in_block: bool = False) -> None:
    lanes = _gather_lanes(sch, gather, lanes)
    rows, elements = sch.get_loops(gather)[-2:]
    _, vector = sch.split(elements, [None, lanes])
    sch.vectorize(vector)
    if not in_block:
        sch.parallel(rows)


def _output_as_rows(sch, out) -> bool:
    """The output stage's iteration ``(i0, ..., c)`` (the op's shape, its epilogue inlined) as
    ``(row, c)``, ``row`` the GEMM's row (``i0`` may be symbolic: a detector head's batch), so
    that it can run per 32 x 32 block of the GEMM; False where refused (the stage unchanged)."""
    extents = [it.dom.extent for it in sch.get(out).iter_vars]
    if len(extents) == 2:
        return True

    def rows(*index):
        row = index[0]
        for extent, i in zip(extents[1:-1], index[1:-1]):
            row = row * extent + i
        return row, index[-1]

    return try_step(sch.transform_block_layout, out, IndexMap.from_func(rows, ndim=len(extents)))


def _fuse_output(sch, out, loop, lanes: int) -> bool:
    """Run the output stage (dequantization and epilogue) per 32 x 32 block, right after the
    block's GEMM under ``loop``: its int32 sums then stay in L1 (the buffer is compacted to the
    block) instead of a pass of ``rows x columns`` int32 through memory and back."""
    if not _output_as_rows(sch, out) or not try_step(sch.reverse_compute_at, out, loop):
        return False
    inner = sch.get_loops(out)[-1]
    if (loop_extent(sch, inner) or 0) % lanes == 0:
        _, vector = sch.split(inner, [None, lanes])
        sch.vectorize(vector)
    return True


def _whole_reduction(sch, blocks, loops, intrin, rows_outer: bool, lanes: int, cores: int) -> bool:
    """The blocks each over the whole reduction, their accumulators zeroed in the micro-kernel,
    each block's output stage right after it. Row blocks outermost (the weights fit in L2): a
    conv's im2col rows gathered per 32-row block too, right before the block's GEMMs, where
    there are at least two row blocks a core (a symbolic row count is an image's: taken as
    enough), the rows then staying in L1; else one parallel loop over the blocks. Returns whether
    the gather ran per row block."""
    gather, acc, out = blocks
    m_out, n_out, m_in, n_in, k = loops
    rows = static_int(sch.get(acc).writes[0].source.ty.shape[0])
    per_row_block = rows_outer and gather is not None and (rows is None or rows // BLOCK >= 2 * cores)
    spatial = [m_out, n_out] if rows_outer else [n_out, m_out]
    sch.reorder(*spatial, m_in, n_in, k)
    if per_row_block:
        sch.parallel(m_out)
        sch.compute_at(gather, m_out)
        at = n_out
    else:
        at = sch.fuse(*spatial)
        sch.parallel(at)
    _fuse_output(sch, out, at, lanes)
    sch.tensorize(m_in, intrin)
    return per_row_block


_INTRINSICS = {"amx": amx_int8_intrin, "avx512vnni": vnni_intrin, "avxvnni": avx_vnni_intrin,
               "avx2": avx2_int8_intrin}


class Int8Contraction(CPURule):
    """The int8 contraction's GEMM on the target's int8 kernels, its gather and output per block
    where they fit (:func:`_whole_reduction`), else as vector passes."""

    # the output stage carries the model's activations (SiLU, GELU): vectorized as the fp32 rules'
    vector_ops = ALL_OPS

    def schedule(self, sch, func, target):
        gather, acc, out = (find_block(sch, n) for n in (GATHER_A, CONTRACTION, OUTPUT))
        if gather is None or acc is None or out is None:
            return None
        kind = int8_instructions(target)
        if kind is None:
            return None
        intrin = _INTRINSICS.get(kind) or functools.partial(neon_int8_intrin, signed=kind == "sdot")
        if kind == "amx":
            # the function asks Linux for the tile state (passes.RequestAMXState)
            sch.annotate(find_block(sch, "root"), AMX_TILES, 1)
        info = cpu_info(target)
        (rows, columns), (_, reduction) = _shape(sch, acc), _shape(sch, gather)
        if None in (columns, reduction) or (rows or 0) % BLOCK or columns % BLOCK or reduction % STEP:
            return None
        kc, rows_outer = choose_blocking(rows, columns, reduction, info.l2_bytes)
        lanes = info.lanes()
        # the epilogue (bias, residual add, ReLU) into the output stage first: it then runs per block
        inline_epilogue(sch, out)
        m, n, k = sch.get_loops(acc)
        m_out, m_in = sch.split(m, [None, BLOCK])
        n_out, n_in = sch.split(n, [None, BLOCK])
        per_row_block = False
        if kc == reduction:
            per_row_block = _whole_reduction(sch, (gather, acc, out), [m_out, n_out, m_in, n_in, k],
                                             intrin(kc, zero_init=True), rows_outer, lanes, info.num_cores)
        else:
            spatial = [m_out, n_out] if rows_outer else [n_out, m_out]
            k_out, k_in = sch.split(k, [None, kc])
            sch.reorder(k_out, *spatial, m_in, n_in, k_in)
            sch.parallel(sch.fuse(*spatial))
            schedule_injective_block(sch, sch.decompose_reduction(acc, k_out), lanes)
            sch.tensorize(m_in, intrin(kc))
        _schedule_gather(sch, gather, lanes, per_row_block)
        padded = find_block(sch, PADDED_INPUT)
        if padded is not None:
            _schedule_padded_input(sch, padded)
        schedule_rest(sch, lanes)
        return sch


__all__ = [
    "INT8_RATES",
    "WEIGHT_LIMITS",
    "WINOGRAD_SAVING",
    "Int8Contraction",
    "choose_blocking",
    "int8_instructions",
    "int8_leaves_winograd_convs",
    "int8_pays",
    "int8_weight_limit",
]
