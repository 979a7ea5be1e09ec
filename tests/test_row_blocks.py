"""Row blocks over the whole reduction (schedules.contraction_tiles.resident_row_block): which
contractions get them on each target, their sizes from the target's caches, and the results of a
1x1 conv and a batched matmul scheduled that way against a float64 reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from _targets import NATIVE as HOST
from tvm import relax

from tvm_roialign.pipeline import build
from tvm_roialign.schedules import cpu_info
from tvm_roialign.schedules.contraction.analysis import Contraction
from tvm_roialign.schedules.contraction.tiles import choose_tiling, resident_row_block
from tvm_roialign.testing import run_first

_CPUS = pytest.mark.parametrize(
    "config",
    [
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2},
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512", "num-cores": 16},
        {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1", "num-cores": 4},
    ],
    ids=["avx2", "avx512", "neon"],
)


def _contraction(roles: str, extents: list) -> Contraction:
    column = roles.index("N")
    return Contraction(None, roles, extents, column, 0, 1, len(roles) - 1, 2, "float32")


#: Mask R-CNN's mask predictor (a 1x1 conv 256 -> 1024 over 100 maps of 14 x 14, the height and
#: width merged), its mask head's Winograd F(5x5) products ([49, 900, 256] x [49, 256, 256]) and a
#: box head's fc6 (the reduction too long)
MASK_1X1 = ("MMNRRR", [100, 196, 1024, 1, 1, 256])
WINOGRAD = ("BMNR", [49, 900, 256, 256])  # weights in half of L2: rows outermost
FC6 = ("MNR", [1000, 1024, 12544])
#: Keypoint R-CNN's Winograd products: the panel over L1, the blocks read less than column blocks
KEYPOINT = ("BMNR", [49, 900, 512, 512])
#: a box head's fc7 (1000 rows: 167 tiles of 6, a prime): blocks of one tile would read the
#: weights once per tile, more than column blocks outermost read ``a``
FC7 = ("MNR", [1000, 1024, 1024])


@_CPUS
def test_row_blocks_come_from_the_target(config):
    info = cpu_info(tvm.target.Target(config))
    assert choose_tiling(_contraction(*WINOGRAD), info).block_tiles is None
    for roles, extents in (MASK_1X1,):
        c = _contraction(roles, extents)
        tiling = choose_tiling(c, info)
        tiles = tiling.block_tiles
        rows_extent = extents[roles.rindex("M")]
        reduction = int(np.prod([e for r, e in zip(roles, extents) if r == "R"]))
        panel = reduction * tiling.cols * tiling.lanes * 4
        if panel + reduction * tiling.rows * 4 > info.l1_bytes and tiles is None:
            # (the panel over L1, and blocks would read as much as column blocks outermost)
            continue
        assert tiles is not None, (roles, extents)
        assert (-(-rows_extent // tiling.rows)) % tiles == 0
        assert panel + tiles * tiling.rows * reduction * 4 <= info.l2_bytes // 2
    c = _contraction(*KEYPOINT)
    if config.get("mcpu") == "znver3":
        # a Zen 3's 512 KiB of L2 (whatever the host's, which a target of the host's architecture
        # reads): 6 x 2 vectors, 10 blocks per batch read 11.8 MB, column blocks outermost 59 MB
        zen3 = dataclasses.replace(info, l2_bytes=512 * 1024)
        assert choose_tiling(c, zen3).block_tiles == 15
    fc7 = choose_tiling(_contraction(*FC7), info)
    if fc7.rows == 6:
        # 167 tiles, a prime: blocks of one tile
        assert fc7.block_tiles is None
    else:
        # AVX-512's 7 x 2 vectors (its accumulator under the 1 KiB stack bound): 143 tiles in
        # blocks that divide them, a block's rows of ``a`` in half of L2
        assert fc7.block_tiles is not None and 143 % fc7.block_tiles == 0
        assert fc7.block_tiles * fc7.rows * 1024 * 4 <= info.l2_bytes // 2
    assert choose_tiling(_contraction(*FC6), info).block_tiles is None
    # a batch whose ``a`` fits in half of L2 keeps the old order
    assert resident_row_block(_contraction("BMNR", [49, 100, 256, 256]), 6, 16, info) is None
    # symbolic rows keep it too
    assert resident_row_block(_contraction("MMNRRR", [None, 196, 1024, 1, 1, 256]), 6, 16, info) is None


def _module(x_shape, weight, conv: bool):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(x_shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if conv:
                y = relax.op.nn.conv2d(
                    x, relax.const(weight), data_layout="NHWC", kernel_layout="HWIO"
                )
            else:
                y = relax.op.matmul(x, relax.const(weight))
            y = bb.emit(relax.op.nn.relu(bb.emit(y)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    "x_shape, w_shape, conv",
    [
        # the mask predictor's 1x1 conv 256 -> 1024 over 12 maps of 14 x 14 (a partial last row
        # tile): 2.4 MiB of ``a``, 1 MiB of weights, over half of L2 up to 2 MiB L2s
        ((12, 14, 14, 256), (1, 1, 256, 1024), True),
        # batched products with constant weights per batch, as Winograd's (3 MiB of ``a`` and
        # 1 MiB of weights per batch; the panel over L1, blocks read less)
        ((2, 1500, 512), (2, 512, 512), False),
    ],
)
def test_row_blocked_contractions_match_float64(x_shape, w_shape, conv, rng):
    x = rng.standard_normal(x_shape).astype("float32")
    w = (rng.standard_normal(w_shape) * 0.1).astype("float32")
    if conv:
        expected = np.einsum("nhwi,io->nhwo", x.astype("float64"), w[0, 0].astype("float64"))
    else:
        expected = np.matmul(x.astype("float64"), w.astype("float64"))
    expected = np.maximum(expected, 0)
    out = run_first(build(_module(x_shape, w, conv), HOST).executable, x)
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(out, expected, rtol=0, atol=2e-5 * scale)
