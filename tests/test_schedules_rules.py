"""What every CPU schedule rule shares (tvm_roialign.schedules): each rule recognizes its functions and
declines the rest, scheduled functions are left alone, tiles and cpu_info come from the target, tiny
contractions run serially."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from _schedules import conv_module, fused_primfuncs, matmul_module, parallel_loops, squeeze_excitation_module
from _targets import NATIVE as HOST
from tvm.s_tir.dlight.base.transform import ApplyDefaultSchedule

from tvm_roialign.pipeline import build
from tvm_roialign.schedules import Conv2DNHWC, CPUDefault, Elementwise, Matmul, cpu_info
from tvm_roialign.schedules.base import pick_lanes
from tvm_roialign.schedules.contraction.tiles import pick_tile


def test_rules_pick_their_functions(rng):
    weight = rng.standard_normal((3, 3, 16, 32)).astype("float32")
    nhwc = fused_primfuncs(
        conv_module((1, 8, 8, 16), weight, np.zeros(32, "float32"), 1, 1, 1, 1, "NHWC")
    )
    (conv,) = nhwc.values()
    assert Conv2DNHWC().apply(conv, HOST, False) is not None
    assert Matmul().apply(conv, HOST, False) is None
    assert Elementwise().apply(conv, HOST, False) is None
    nchw = fused_primfuncs(
        conv_module(
            (1, 16, 8, 8),
            weight.transpose(3, 2, 0, 1).copy(),
            np.zeros(32, "float32"),
            1,
            1,
            1,
            1,
            "NCHW",
        )
    )
    (conv_nchw,) = nchw.values()
    assert Conv2DNHWC().apply(conv_nchw, HOST, False) is None
    assert CPUDefault().apply(conv_nchw, HOST, False) is not None
    dense = fused_primfuncs(
        matmul_module(
            (8, 16),
            rng.standard_normal((16, 32)).astype("float32"),
            np.zeros(32, "float32"),
        )
    )
    (mm,) = dense.values()
    assert Matmul().apply(mm, HOST, False) is not None
    assert Conv2DNHWC().apply(mm, HOST, False) is None


def test_tiles_fit_the_register_file():
    for rows_extent, vectors in [(1000, 64), (14, 16), (128, 4), (7, 1), (13, 3)]:
        for registers in (16, 32):
            rows, cols = pick_tile(rows_extent, vectors, registers)
            assert rows <= max(rows_extent, 1) and vectors % cols == 0
            assert rows * cols + cols + 1 <= registers
    # 32 registers: a tile of most of them (six rows of four vectors, as SGEMM kernels use)
    rows, cols = pick_tile(128, 16, 32)
    assert rows * cols >= 24
    assert (
        pick_lanes(96, 16) == 16
        and pick_lanes(91, 16) is None
        and pick_lanes(12, 16) == 4
    )


@pytest.mark.parametrize(
    "config, bits, registers",
    [
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu"}, 128, 16),
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}, 256, 16),
        (
            {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"},
            512,
            32,
        ),
        (
            {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"},
            128,
            32,
        ),
    ],
)
def test_cpu_info_from_the_target(config, bits, registers):
    info = cpu_info(tvm.target.Target({**config, "num-cores": 3}))
    assert (info.vector_bits, info.vector_registers, info.num_cores) == (
        bits,
        registers,
        3,
    )
    assert info.lanes("float32") == bits // 32


def test_cpu_info_cache_is_bounded_and_keyed_by_the_targets_fields():
    """One entry per (triple, cpu, features, cores), however the target is spelled; at most a
    bounded number of entries."""
    from tvm_roialign.schedules.target_info import _cpu_info_by_fields

    config = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"}
    first = cpu_info(tvm.target.Target({**config, "num-cores": 5}))
    before = _cpu_info_by_fields.cache_info()
    again = cpu_info(tvm.target.Target({**config, "num-cores": 5, "keys": ["cpu", "other"]}))
    assert again is first and _cpu_info_by_fields.cache_info().hits == before.hits + 1
    assert cpu_info(tvm.target.Target({**config, "num-cores": 6})).num_cores == 6
    for cores in range(1, 80):
        cpu_info(tvm.target.Target({**config, "num-cores": cores}))
    assert _cpu_info_by_fields.cache_info().currsize <= _cpu_info_by_fields.cache_info().maxsize


def test_scheduled_functions_are_not_touched(rng):
    """A PrimFunc marked tirx.is_scheduled (RoIAlign's strategies) passes through unchanged."""
    weight = rng.standard_normal((1, 1, 16, 16)).astype("float32")
    funcs = fused_primfuncs(
        conv_module((1, 4, 4, 16), weight, np.zeros(16, "float32"), 1, 0, 1, 1, "NHWC")
    )
    ((name, func),) = funcs.items()
    marked = func.with_attr("tirx.is_scheduled", True)
    mod = tvm.IRModule({name: marked})
    with HOST:
        out = ApplyDefaultSchedule(Conv2DNHWC(), CPUDefault())(mod)
    tvm.ir.assert_structural_equal(out[name], marked)


@pytest.mark.parametrize(
    "config",
    [
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2},
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512", "num-cores": 8},
        {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1", "num-cores": 4},
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 1},
    ],
)
def test_tiny_contractions_run_serially(config, rng):
    """A squeeze-excitation's FC on the pooled map has too few multiply-adds to pay for a
    parallel launch: its tiles run serially, its broadcast multiply over the activation in
    parallel; a pointwise conv on a feature map stays parallel (serial for a one-core target)."""
    target = tvm.target.Target(config)
    c = 48
    mod = squeeze_excitation_module(
        (1, 14, 14, c),
        rng.standard_normal((1, 1, c, 8)).astype("float32"),
        rng.standard_normal(8).astype("float32"),
        rng.standard_normal((1, 1, 8, c)).astype("float32"),
        rng.standard_normal(c).astype("float32"),
        "sigmoid",
    )
    gate = next(f for n, f in fused_primfuncs(mod, target).items() if "multiply1" in n)
    with target:
        scheduled = Conv2DNHWC().apply(gate, target, False).mod["main"]
    multi = cpu_info(target).num_cores > 1
    # only the broadcast multiply's pass over the 14 x 14 pixels (the elementwise rule's)
    assert parallel_loops(scheduled) == [14 * 14]
    pointwise = fused_primfuncs(
        conv_module((1, 28, 28, 64), rng.standard_normal((1, 1, 64, 64)).astype("float32"),
                     np.zeros(64, "float32"), 1, 0, 1, 1, "NHWC"),
        target,
    )
    (conv,) = pointwise.values()
    with target:
        scheduled = Conv2DNHWC().apply(conv, target, False).mod["main"]
    assert bool(parallel_loops(scheduled)) == multi


@pytest.mark.parametrize(
    "mcpu",
    ["haswell", "znver3", "skylake-avx512", "sapphirerapids", "znver4", "neoverse-n1"],
)
def test_register_tile_stays_on_the_stack(mcpu, rng):
    """On every target family (AVX2 of Intel and AMD, AVX-512 of Intel and of Zen 4, AArch64) the
    fp32 register tile fits the register file and its accumulator is under TVM's stack bound (a
    ``global`` buffer of 1 KiB or more is a heap workspace at every parallel step: AVX-512's
    6 x 4 zmm are 1.5 KiB), static or symbolic rows; a 1x1 conv built for the target (cross, not
    run) calls no ``TVMBackendAllocWorkspace``."""
    from tvm_roialign.schedules.contraction.analysis import Contraction
    from tvm_roialign.schedules.contraction.tiles import choose_tiling

    triple = "aarch64-linux-gnu" if mcpu.startswith("neoverse") else "x86_64-linux-gnu"
    target = tvm.target.Target({"kind": "llvm", "mtriple": triple, "mcpu": mcpu})
    info = cpu_info(target)
    for rows, columns in [(3136, 64), (784, 96), (196, 256), (14, 512), (None, 256), (49, 2048)]:
        c = Contraction(None, "MNR", [rows, columns, 256], 1, 0, 1, 1, 2, "float32")
        tiling = choose_tiling(c, info)
        assert tiling.lanes == min(info.lanes(), 16)
        assert tiling.rows * tiling.cols + tiling.cols + 1 <= info.vector_registers
        assert tiling.rows * tiling.cols * tiling.lanes * 4 < 1024, (rows, columns, tiling)
    # the largest tiles within both bounds: 14 accumulators of 256-bit AVX2, 24 of 128-bit NEON,
    # 15 of 512-bit AVX-512 (the stack's 1023 bytes), where the columns allow
    c = Contraction(None, "MNR", [3136, 256, 256], 1, 0, 1, 1, 2, "float32")
    tiling = choose_tiling(c, info)
    assert tiling.rows * tiling.cols >= {128: 24, 256: 12, 512: 14}[info.vector_bits], tiling
    weight = rng.standard_normal((1, 1, 16, 256)).astype("float32")
    mod = conv_module((1, 14, 14, 16), weight, np.zeros(256, "float32"), 1, 0, 1, 1, "NHWC")
    asm = build(mod, target).executable.mod.imports[0].inspect_source("asm")
    assert "TVMBackendAllocWorkspace" not in asm
