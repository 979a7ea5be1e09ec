"""Rule: the bf16 contraction (:mod:`tvm_roialign.topi.bf16_contraction`) on AMX tiles, or on
``vdpbf16ps`` where the target has AVX512-BF16 and no AMX, or on ``bfdot`` on AArch64 with bf16.

The function has up to three stages, ``bf16_gather_a`` (activations as bf16, im2col'd for a conv),
``bf16_contraction`` (the GEMM, fp32 accumulation) and ``bf16_output`` (the real rows and columns in
the op's shape), followed by whatever elementwise epilogue fusion gave it. The GEMM's row count is
static or (an any-size image) ``ceil(M / 32) * 32`` of a symbolic ``M``. The GEMM is cut into
32 x 32 output blocks, each computed by the AMX micro-kernel (:mod:`~tvm_roialign.schedules.intrin.amx`;
without AMX the AVX512-BF16 one, :mod:`~tvm_roialign.schedules.intrin.avx512_bf16`; on AArch64 the ``bfdot``
one, :mod:`~tvm_roialign.schedules.intrin.neon_bf16`, all three on the same weight layout) over ``kc``
reduction elements:

* when one operand's whole reduction fits in half of L2 (``kc`` = the reduction), the blocks that
  share the other operand's rows run one after another, in one parallel loop, each block's
  accumulators starting at zero in the micro-kernel: the weights of all columns fit -> row blocks
  outermost (each block of ``A`` read once, from L1); else the rows of ``A`` fit -> column blocks
  outermost;
* otherwise (a box head's ``[1000, 12544] x [12544, 1024]``) the reduction is cut into chunks whose
  slice of the smaller operand fits (GEMM blocking): the chunk loop outermost, the blocks zeroed in
  a pass of their own and accumulating in the output across chunks;
* a bf16-rows output stage (its epilogue in it) runs per 32 x 32 block right after the block's tiles
  are stored; a conv's gather runs per 32-row block inside the parallel row loop where the row
  blocks are outermost and at least two per core; otherwise the gather and the output stages run as
  parallel, vectorized passes, the fused epilogue inlined into the output stage. There may be no
  gather: the GEMM then loads its A tiles straight from the input's bf16 rows.

Targets without any of them are not served (the graph pass only emits these functions for targets with
one; elsewhere the fallback rule would compute the same values in fp32 arithmetic).
"""

from __future__ import annotations

from ...topi.bf16_contraction import CONTRACTION, GATHER_A, OUTPUT
from ..base import CPURule, find_block, inline_epilogue, loop_extent, static_int, try_step
from ..elementwise import schedule_injective_block, schedule_rest
from ..intrin.amx import AMX_TILES, BF16, BLOCK, amx_bf16_intrin
from ..intrin.avx512_bf16 import avx512_bf16_intrin
from ..intrin.neon_bf16 import neon_bf16_intrin
from ..target_info import cpu_info
from ..vector_math import ALL_OPS

#: reduction elements of one step of the micro-kernels
STEP = BF16.step


def choose_blocking(rows: int | None, columns: int, reduction: int, l2_bytes: int) -> tuple[int, bool]:
    """``(kc, rows_outer)``: the reduction chunk and the loop order of the 32 x 32 blocks (see
    module docstring); bf16 operands (2 bytes an element). ``rows`` None: a symbolic row count
    (an any-size image), taken as larger than the columns and than any L2."""
    budget = l2_bytes // 2
    if reduction * columns * 2 <= budget:
        return reduction, True
    if rows is None:
        rows = reduction * columns + budget
    if reduction * rows * 2 <= budget:
        return reduction, False
    rows_outer = columns <= rows
    kept = columns if rows_outer else rows
    chunk = STEP
    for candidate in range(STEP, reduction + 1, STEP):
        if reduction % candidate == 0 and candidate * kept * 2 <= budget:
            chunk = candidate
    return chunk, rows_outer


def _shape(sch, block, index: int = 0) -> list[int | None]:
    return [static_int(d) for d in sch.get(block).writes[index].source.ty.shape]


def _schedule_gather(sch, gather, lanes: int, in_block: bool) -> None:
    """Each row's reduction elements in vectors of ``lanes`` (a conv's input channels are
    contiguous within a kernel tap, and the tap's bounds test is one per vector); the rows in
    parallel, unless the gather runs per row block inside the GEMM's parallel loop."""
    rows, elements = sch.get_loops(gather)[-2:]
    _, vector = sch.split(elements, [None, lanes])
    sch.vectorize(vector)
    if not in_block:
        sch.parallel(rows)


def _fuse_output_into_blocks(sch, out, loop) -> bool:
    """Compute the output stage of a bf16-rows output (2-D, its epilogue in it) block by block,
    right after each GEMM block, under ``loop``: the fp32 block then stays in L1 (the buffer
    is compacted to the block) instead of a full fp32 pass through memory."""
    if len(sch.get(out).iter_vars) != 2 or not try_step(sch.reverse_compute_at, out, loop):
        return False
    inner = sch.get_loops(out)[-1]
    if loop_extent(sch, inner) == BLOCK:
        sch.vectorize(inner)
    return True


def _gather_per_row_block(rows: int | None, rows_outer: bool, gather, cores: int) -> bool:
    """Whether a conv's im2col rows are gathered per 32-row block, right before the block's
    GEMMs (the rows then stay in L1/L2 instead of a full pass through memory): when the row
    blocks are the outer, parallel loop and there are at least two for each core (a symbolic
    row count is an image's: taken as enough)."""
    return gather is not None and rows_outer and (rows is None or rows // BLOCK >= 2 * cores)


def _whole_reduction(sch, acc, out, gather, loops, intrin, per_row_block: bool):
    """The blocks each over the whole reduction (see module docstring); returns whether the
    output stage runs per block."""
    m_out, n_out, m_in, n_in, k = loops
    sch.reorder(m_out, n_out, m_in, n_in, k)
    if per_row_block:
        sch.parallel(m_out)
        sch.compute_at(gather, m_out)
        fused_output = _fuse_output_into_blocks(sch, out, n_out)
    else:
        fused = sch.fuse(m_out, n_out)
        sch.parallel(fused)
        fused_output = _fuse_output_into_blocks(sch, out, fused)
    sch.tensorize(m_in, intrin)
    return fused_output


def bf16_instructions(target) -> str | None:
    """``"amx"`` (AMX bf16), ``"avx512bf16"`` (``vdpbf16ps``, no AMX), ``"bfdot"`` (AArch64 bf16),
    or None: the bf16 kernels ``target`` runs."""
    info = cpu_info(target)
    if info.has_amx_bf16:
        return "amx"
    if info.has_avx512_bf16:
        return "avx512bf16"
    if info.has_bf16:
        return "bfdot"
    return None


_INTRINSICS = {"amx": amx_bf16_intrin, "avx512bf16": avx512_bf16_intrin, "bfdot": neon_bf16_intrin}


class BF16Contraction(CPURule):
    """The bf16 contraction's GEMM on AMX tiles, its gather and output as vector passes."""

    # the output stage carries the model's activations (SiLU, GELU): vectorized as the fp32 rules'
    vector_ops = ALL_OPS

    def schedule(self, sch, func, target):
        acc, out = find_block(sch, CONTRACTION), find_block(sch, OUTPUT)
        if acc is None or out is None:
            return None
        gather = find_block(sch, GATHER_A)
        kind = bf16_instructions(target)
        if kind is None:
            return None
        intrin = _INTRINSICS[kind]
        if kind == "amx":
            # the function asks Linux for the tile state (passes.RequestAMXState)
            sch.annotate(find_block(sch, "root"), AMX_TILES, 1)
        info = cpu_info(target)
        rows, columns = _shape(sch, acc)
        m, n, k = sch.get_loops(acc)
        reduction = loop_extent(sch, k)
        # a symbolic row count is a multiple of the block by construction (the gather's padding)
        if None in (columns, reduction) or (rows or 0) % BLOCK or columns % BLOCK or reduction % STEP:
            return None
        kc, rows_outer = choose_blocking(rows, columns, reduction, info.l2_bytes)
        m_out, m_in = sch.split(m, [None, BLOCK])
        n_out, n_in = sch.split(n, [None, BLOCK])
        per_row_block = False
        if kc == reduction:
            # the whole reduction in one call: the accumulators start at zero in the tiles
            per_row_block = _gather_per_row_block(rows, rows_outer, gather, info.num_cores)
            loops = [m_out, n_out, m_in, n_in, k] if rows_outer else [n_out, m_out, m_in, n_in, k]
            fused_output = _whole_reduction(
                sch, acc, out, gather, loops, intrin(kc, zero_init=True), per_row_block
            )
        else:
            spatial = [m_out, n_out] if rows_outer else [n_out, m_out]
            k_out, k_in = sch.split(k, [None, kc])
            sch.reorder(k_out, *spatial, m_in, n_in, k_in)
            sch.parallel(sch.fuse(*spatial))
            schedule_injective_block(sch, sch.decompose_reduction(acc, k_out), info.lanes())
            sch.tensorize(m_in, intrin(kc))
            fused_output = False
        if gather is not None:
            # a copy of bf16 rows moves 16-bit lanes; a rounding of fp32 works on 32-bit ones
            source = sch.get(gather).reads[0].source.ty.dtype
            lanes = info.lanes("uint16" if str(source) == "uint16" else "float32")
            _schedule_gather(sch, gather, lanes, per_row_block)
        if not fused_output:
            inline_epilogue(sch, out)
        schedule_rest(sch, info.lanes())
        return sch


__all__ = ["BF16Contraction", "bf16_instructions", "choose_blocking"]
