"""The matmul rule (dense, batched, attention's run-time ``b``; tvm_roialign.schedules.contraction): results
equal a float64 reference, the padded tile fits every target's registers, reduction chunks come from the
target's caches."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from _schedules import ON_THREE_CPUS, build_and_run, close_to, fused_primfuncs, matmul_module
from tvm import relax

from tvm_roialign.pipeline import build
from tvm_roialign.schedules import Matmul, cpu_info


@pytest.mark.parametrize(
    "a_shape, k, n, transpose_b",
    [
        ((24, 40), 40, 32, False),  # dense
        ((30, 70), 70, 91, True),  # odd output (padded), linear's transposed weight
        ((3, 20, 16), 16, 48, False),  # batched rows, shared weight
        ((6, 1200), 1200, 64, False),  # long reduction
        ((300, 1200), 1200, 128, False),  # ``a`` over half of L2: reduction chunks
        ((222, 1200), 1200, 128, False),  # chunks, 37 row tiles (a prime): blocks of one tile
        ((784, 192), 192, 768, False),  # ConvNeXt's MLP input: a chunk would be all of it
        (
            (197, 96),
            96,
            48,
            True,
        ),  # a prime row count (ViT's 197 tokens): a partial last tile
    ],
)
def test_matmul_matches_float64(a_shape, k, n, transpose_b, rng):
    a = rng.standard_normal(a_shape).astype("float32")
    weight = (rng.standard_normal((k, n)) * 0.1).astype("float32")
    bias = rng.standard_normal(n).astype("float32")
    expected = np.maximum(a.astype("float64") @ weight + bias, 0)
    const = weight.T.copy() if transpose_b else weight
    out = build_and_run(matmul_module(a_shape, const, bias, transpose_b), a)
    close_to(out, expected)


def test_batch_matmul_of_two_inputs(rng):
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType([4, 12, 20], "float32"))
    b = relax.Var("b", relax.TensorType([4, 20, 32], "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(a, b))
        bb.emit_func_output(out)
    x = rng.standard_normal((4, 12, 20)).astype("float32")
    y = rng.standard_normal((4, 20, 32)).astype("float32")
    close_to(build_and_run(bb.get(), x, y), x.astype("float64") @ y)


@pytest.mark.parametrize(
    "batch, m, k, n, transpose_b, scale",
    [
        (3, 197, 64, 197, False, False),  # ViT-B/16's q @ k^T: prime rows and columns
        (6, 49, 32, 49, True, True),  # a Swin window, k untransposed, a scale epilogue
        (2, 5, 8, 3, False, False),  # fewer columns than one vector
        (2, 17, 24, 36, False, True),  # columns a half-width vector divides, not a full one
    ],
)
def test_attention_matmul_with_ragged_columns(batch, m, k, n, transpose_b, scale, rng):
    """``b`` computed at run time, its columns padded and packed at each call
    (schedules.runtime_matmul): equal to float64, the padding columns never written."""
    bb = relax.BlockBuilder()
    b_shape = [batch, n, k] if transpose_b else [batch, k, n]
    a = relax.Var("a", relax.TensorType([batch, m, k], "float32"))
    b = relax.Var("b", relax.TensorType(b_shape, "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            rhs = relax.op.permute_dims(b, [0, 2, 1]) if transpose_b else b
            y = bb.emit(relax.op.matmul(a, rhs))
            if scale:
                y = bb.emit(relax.op.multiply(y, relax.const(0.125, "float32")))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    x = rng.standard_normal((batch, m, k)).astype("float32")
    y = rng.standard_normal(b_shape).astype("float32")
    rhs = y.astype("float64").transpose(0, 2, 1) if transpose_b else y.astype("float64")
    expected = x.astype("float64") @ rhs * (0.125 if scale else 1.0)
    close_to(build_and_run(bb.get(), x, y), expected)


def test_attention_matmul_tile_fits_every_target():
    """The padded tile of q @ k^T holds in the register file of AVX2, AVX-512 and NEON, its
    accumulator under TVM's 1 KiB stack bound (else a heap workspace per parallel step), and its
    width divides the padded columns."""
    from tvm_roialign.schedules.contraction.analysis import Contraction
    from tvm_roialign.schedules.contraction.runtime_matmul import padded_tiling
    from tvm_roialign.schedules.target_info import CPUInfo

    for bits, registers, arch in ((256, 16, "x86"), (512, 32, "x86"), (128, 32, "aarch64")):
        info = CPUInfo(bits, registers, True, 4, 32768, 1 << 20, arch)
        for m, n in ((197, 197), (49, 49), (50, 3)):
            c = Contraction(None, "BMNR", [12, m, n, 64], 2, 0, 1, 2, 3, "float32")
            tiling = padded_tiling(c, info)
            assert tiling.lanes == bits // 32
            assert tiling.rows * tiling.cols + tiling.cols + 1 <= registers
            assert tiling.rows * tiling.cols * bits // 8 < 1024
            assert tiling.rows <= m


def test_attention_kernels_build_for_aarch64():
    """q @ k^T (197 columns), softmax and layer norm over 197: the padded tile and the row
    rules take them for NEON too (cross build, not run)."""
    from _targets import AARCH64

    from tvm_roialign.schedules import RowReduction

    ones, zeros = np.ones(197, "float32"), np.zeros(197, "float32")
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType([3, 197, 64], "float32"))
    b = relax.Var("b", relax.TensorType([3, 64, 197], "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.matmul(a, b)), axis=-1))
            y = relax.op.nn.layer_norm(y, relax.const(ones), relax.const(zeros), axes=[-1])
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    funcs = fused_primfuncs(mod, AARCH64)
    taken = {
        name: (Matmul() if "matmul" in name else RowReduction()).apply(f, AARCH64, False)
        for name, f in funcs.items()
    }
    assert all(sch is not None for sch in taken.values()), taken
    assert build(mod, AARCH64).executable is not None


@ON_THREE_CPUS
def test_reduction_chunks_come_from_the_target(config, rng):
    """A long reduction's chunks (Goto's order): the chunk divides the reduction, its panel of
    packed weights and a tile's rows of ``a`` fit in L1, a row block (whole row tiles) over a chunk
    fits in half of L2; the matmul rule schedules a chunked matmul for each target, which builds."""
    from tvm_roialign.schedules.contraction.matmul import _row_blocks

    target = tvm.target.Target(config)
    info = cpu_info(target)
    lanes = info.lanes()
    # fc6 of a box head (1000 and 1002 rows), the chunked case of test_matmul_matches_float64
    for rows_extent, k, rows, cols in [(1000, 12544, 5, 2), (1002, 12544, 6, 2), (300, 1200, 6, 2)]:
        chunk, tiles = _row_blocks(k, rows_extent, rows, cols * lanes, info)
        assert k % chunk == 0 and chunk >= 32
        assert chunk * (cols * lanes + rows) * 4 <= info.l1_bytes
        assert (rows_extent // rows) % tiles == 0
        assert tiles * rows * chunk * 4 <= info.l2_bytes // 2
    weight = (rng.standard_normal((1200, 128)) * 0.1).astype("float32")
    mod = matmul_module((300, 1200), weight, np.zeros(128, "float32"))
    funcs = fused_primfuncs(mod, target)
    with target:
        taken = [Matmul().apply(f, target, False) for name, f in funcs.items() if "matmul" in name]
    assert taken and all(sch is not None for sch in taken)
    assert build(mod, target).executable is not None
