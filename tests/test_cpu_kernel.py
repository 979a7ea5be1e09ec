"""The hand-scheduled CPU kernel (tvm_roialign.strategies.cpu_kernel).

It is used by the x86 and ARM strategies for RoIAlign (any grid) and the RoI family's adaptive
grids; these tests check that the
legalized PrimFunc is that kernel (not the TE compute), that it equals the TE compute bit for bit
on the generic llvm target, its vector width and channel blocks, and symbolic sizes. Its numerics
against torchvision and the float64 reference (every mode and dtype, degenerate boxes) are the
``x86-kernel`` and ``arm-on-host`` paths of ``test_roi_family.py``.

Channels: 12 (vectorized by 4 lanes in 3 groups on x86, whatever its width) and 3 (scalar).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tvm
from _degenerate import DEGENERATE_ROIS
from _targets import AARCH64
from _targets import GENERIC as HOST
from tvm import relax, te

import tvm_roialign
from tvm_roialign import testing
from tvm_roialign.ops.roi_align import RoiAlignAttrs
from tvm_roialign.schedules.base import largest_divisor_lanes
from tvm_roialign.schedules.roi_align.cpu import vector_lanes
from tvm_roialign.schedules.roi_align.kernel import roi_align_adaptive_cpu
from tvm_roialign.schedules.roi_align.kernel_constants import MAX_ACC_BYTES, channel_block_for
from tvm_roialign.schedules.target_info import cpu_info
from tvm_roialign.strategies import STRATEGIES
from tvm_roialign.strategies.cpu_kernel import cpu_adaptive_kernel
from tvm_roialign.testing import (
    build_roi_align_module,
    roi_align_ref,
    run_roi_align_vm,
    single_op_module,
)
from tvm_roialign.topi._sampling import MODES

N, H, W = 2, 11, 13
LAYOUTS = ["NCHW", "NHWC"]
INF = float("inf")


def _shape(layout, channels):
    return (N, channels, H, W) if layout == "NCHW" else (N, H, W, channels)


_run = run_roi_align_vm


def smooth_data(channels, dtype):
    return testing.smooth_data((N, channels, H, W), dtype)


def _vm(mod):
    return relax.VirtualMachine(tvm.compile(mod, target=HOST), tvm.cpu())


def random_rois(num, scale, dtype, seed=0):
    """Boxes in feature-map units (inside, straddling the border, tiny and large) in image pixels,
    so that adaptive grids of 1 to 9 samples per side occur."""
    rng = np.random.default_rng(seed)
    starts = rng.uniform(-3.0, 11.0, (num, 2))
    sizes = rng.uniform(0.1, 16.0, (num, 2))
    boxes = np.concatenate([starts, starts + sizes], axis=1) / scale
    batch = rng.integers(0, N, (num, 1))
    return np.concatenate([batch, boxes], axis=1).astype(dtype)


def _legalized_primfuncs(mod):
    with HOST:
        legalized = relax.transform.LegalizeOps()(mod)
    return [f for f in legalized.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]


# --- the kernel is what the x86 strategy builds for adaptive grids, and only for them ---------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sampling_ratio", [-1, 0, 2])
def test_strategy_uses_kernel_for_adaptive_grids_and_nhwc(layout, sampling_ratio):
    mod = build_roi_align_module(_shape(layout, 12), 4, (3, 3), 0.5, sampling_ratio, False, layout)
    (func,) = _legalized_primfuncs(mod)
    script = func.script()
    kernel = sampling_ratio <= 0 or layout == "NHWC"
    assert ('sblock("roi_align_adaptive")' in script) == kernel
    assert ('sblock("roi_align_acc' in script) == (not kernel)
    assert func.attrs["tirx.is_scheduled"]
    if kernel:
        assert "T.vectorized(4)" in script  # 12 channels: 3 groups of 4 lanes


def test_kernel_not_applicable():
    data = te.placeholder((1, 8, 5, 5), "float32", "data")
    rois = te.placeholder((3, 5), "float32", "rois")
    attrs = RoiAlignAttrs((2, 2), 1.0, -1, False, "NCHW", "avg")
    assert cpu_adaptive_kernel([data, rois], attrs, HOST) is not None
    # a static grid: the kernel in NHWC (sample rows in the map's row order), the TE path in NCHW
    static = RoiAlignAttrs((2, 2), 1.0, 2, False, "NCHW", "avg")
    assert cpu_adaptive_kernel([data, rois], static, HOST) is None
    nhwc = te.placeholder((1, 5, 5, 8), "float32", "data")
    static_nhwc = RoiAlignAttrs((2, 2), 1.0, 2, False, "NHWC", "avg")
    assert cpu_adaptive_kernel([nhwc, rois], static_nhwc, HOST) is not None
    # a symbolic channel count: no accumulator size; the TE compute is used
    sym = te.placeholder((1, tvm.tirx.Var("c", "int64"), 5, 5), "float32", "data")
    assert cpu_adaptive_kernel([sym, rois], attrs, HOST) is None
    # bad arguments: the TE compute raises its own error
    bad = RoiAlignAttrs((2, 2), 1.0, -1, False, "CHWN", "avg")
    assert cpu_adaptive_kernel([data, rois], bad, HOST) is None
    assert cpu_adaptive_kernel([data, rois], RoiAlignAttrs((2, 2), 0.0, -1, False, "NCHW", "avg"),
                               HOST) is None


#: CPUs of known vector width (their ISA manuals): SSE2 baseline 128 bits, AVX2 256, AVX-512 512;
#: AArch64 NEON 128, with SVE too (its width is not known at compile time: scheduled as NEON).
KNOWN_CPUS = [
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu"}, 128),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"}, 128),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}, 256),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3"}, 256),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"}, 512),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5"}, 512),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, 128),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"}, 128),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v1", "mattr": ["+sve"]}, 128),
]


@pytest.mark.parametrize(
    "config, bits", KNOWN_CPUS, ids=[str(c.get("mcpu", c["mtriple"])) for c, _ in KNOWN_CPUS]
)
def test_vector_lanes_one_policy_on_known_cpus(config, bits):
    """One vector-width answer per (target, dtype): RoIAlign's strategies and the conv/matmul rules
    (cpu_info) give the width the CPU has; lanes count data elements of one register."""
    target = tvm.target.Target(config)
    assert cpu_info(target).vector_bits == bits
    for dtype, width in (("float16", 16), ("float32", 32), ("float64", 64)):
        assert vector_lanes(target, dtype) == cpu_info(target).lanes(dtype) == bits // width


def test_channel_loop_takes_the_largest_power_of_two_dividing_c():
    arm = AARCH64
    assert largest_divisor_lanes(256, vector_lanes(arm, "float32")) == 4
    assert largest_divisor_lanes(6, vector_lanes(arm, "float32")) == 2
    assert largest_divisor_lanes(3, vector_lanes(arm, "float32")) == 1


def test_channel_block_for():
    assert channel_block_for(256, 16, "float32") == 256
    limit = MAX_ACC_BYTES // 4
    assert channel_block_for(4 * limit, 16, "float32") == limit
    assert channel_block_for(3 * limit // 2, 16, "float32") == 3 * limit // 4
    assert channel_block_for(2 * limit + 4, 4, "float32") % 4 == 0
    assert channel_block_for(limit, 8, "float64") == limit // 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_channel_blocks_equal_one_block(layout, tol):
    """Channels in blocks (the path for very many channels) give the same bits as one block."""
    data_np = np.random.default_rng(6).standard_normal((N, 12, H, W)).astype("float32")
    rois_np = random_rois(9, 0.5, "float32", seed=6)
    x = data_np if layout == "NCHW" else np.ascontiguousarray(data_np.transpose(0, 2, 3, 1))
    outs = []
    for block in (12, 4):
        data = te.placeholder(_shape(layout, 12), "float32", "data")
        rois = te.placeholder(rois_np.shape, "float32", "rois")
        func = roi_align_adaptive_cpu(data, rois, (3, 2), 0.5, "avg", False, layout, 4, block)
        out_t = te.extern_primfunc([data, rois], func, name="roi_align_adaptive")
        lib = tvm.compile(
            tvm.IRModule({"main": te.create_prim_func([data, rois, out_t])}), target=HOST
        )
        out = tvm.runtime.tensor(np.zeros([int(d) for d in out_t.shape], "float32"))
        lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(rois_np), out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    expected = roi_align_ref(x, rois_np, (3, 2), 0.5, -1, False, layout, "avg")
    np.testing.assert_allclose(outs[1], expected, rtol=tol["float32"], atol=tol["float32"])


# --- bit-for-bit the TE compute ---------------------------------------------------------------


def _built(layout, mode, aligned, channels, num_rois, use_kernel, sampling_ratio=-1):
    data = te.placeholder(_shape(layout, channels), "float32", "data")
    rois = te.placeholder((num_rois, 5), "float32", "rois")
    attrs = RoiAlignAttrs((3, 2), 0.5, sampling_ratio, aligned, layout, mode)

    def compute(d, r):
        return tvm_roialign.topi.roi_align(d, r, (3, 2), 0.5, mode, sampling_ratio, aligned,
                                           layout)

    func = STRATEGIES["x86"].build(
        compute, [data, rois], HOST, layout, attrs if use_kernel else None
    )
    assert ('sblock("roi_align_adaptive")' in func.script()) == use_kernel
    return tvm.compile(tvm.IRModule({"main": func}), target=HOST)


@pytest.mark.parametrize(
    "layout, mode, aligned, sampling_ratio",
    [(*p, -1) for p in itertools.product(LAYOUTS, MODES, [False, True])]
    + [("NHWC", mode, aligned, 2) for mode, aligned in itertools.product(MODES, [False, True])],
)
def test_bitwise_equal_to_te_compute(layout, mode, aligned, sampling_ratio):
    """Random data with infinities, random and degenerate boxes (negative sizes with ``aligned``):
    the same bits as the TE path, adaptive grids by bin rows, static grids by sample rows."""
    channels = 12 if aligned else 3
    rng = np.random.default_rng(1)
    data = rng.standard_normal((N, channels, H, W)).astype("float32")
    data[0, 1 % channels, 4, 5] = INF
    data[1, 2 % channels, 7, 2] = -INF
    rois = np.concatenate([random_rois(20, 0.5, "float32"), DEGENERATE_ROIS * [1, 2, 2, 2, 2]])
    rois = rois.astype("float32")
    outs = []
    for use_kernel in (True, False):
        lib = _built(layout, mode, aligned, channels, len(rois), use_kernel, sampling_ratio)
        x = data if layout == "NCHW" else np.ascontiguousarray(data.transpose(0, 2, 3, 1))
        out_shape = (len(rois), channels, 3, 2) if layout == "NCHW" else (len(rois), 3, 2, channels)
        out = tvm.runtime.tensor(np.full(out_shape, 7.0, "float32"))
        lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(rois), out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])  # NaN where NaN
    assert np.isfinite(outs[0][len(rois) - len(DEGENERATE_ROIS):]).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_symbolic_number_of_rois(layout, tol):
    """rois ``[k, 5]`` with a symbolic k: one compiled function, run with two different k."""
    k = tvm.tirx.Var("k", "int64")
    mod = single_op_module(
        lambda d, r: relax.op.vision.roi_align(d, r, (3, 3), 0.5, -1, False, layout, "avg"),
        data=(_shape(layout, 12), "float32"), rois=([k, 5], "float32"))
    (func,) = _legalized_primfuncs(mod)
    assert 'sblock("roi_align_adaptive")' in func.script()
    vm = _vm(mod)
    values = smooth_data(12, "float32")
    for num in (3, 17):
        boxes = random_rois(num, 0.5, "float32", seed=num)
        out = _run(vm, values, boxes, layout)
        assert out.shape[0] == num
        expected = roi_align_ref(values, boxes, (3, 3), 0.5, -1, False, "NCHW", "avg")
        np.testing.assert_allclose(out, expected, rtol=tol["float32"], atol=tol["float32"])


def test_symbolic_feature_map_size(tol):
    """NCHW with symbolic N, H, W and K (int64 indices, a channels-last workspace of dynamic size),
    max mode, aligned, sampling_ratio 0: two runs of different sizes, one of them without rois."""
    n, h, w, k = (tvm.tirx.Var(name, "int64") for name in "nhwk")
    vm = _vm(single_op_module(
        lambda d, r: relax.op.vision.roi_align(d, r, (3, 3), 0.5, 0, True, "NCHW", "max"),
        data=([n, 8, h, w], "float32"), rois=([k, 5], "float32")))
    rng = np.random.default_rng(7)
    for num_batch, height, width, num in [(2, 11, 13, 5), (1, 7, 20, 0)]:
        values = rng.standard_normal((num_batch, 8, height, width)).astype("float32")
        boxes = random_rois(num, 0.5, "float32", seed=num) * [0, 1, 1, 1, 1]
        boxes = boxes.astype("float32")
        out = _run(vm, values, boxes, "NCHW")
        assert out.shape == (num, 8, 3, 3)
        expected = roi_align_ref(values, boxes, (3, 3), 0.5, 0, True, "NCHW", "max")
        np.testing.assert_allclose(out, expected, rtol=tol["float32"], atol=tol["float32"])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_builds_for_aarch64(layout, dtype):
    """The ARM strategy uses the kernel too; it compiles for aarch64 (not run here)."""
    arm = AARCH64
    mod = build_roi_align_module(_shape(layout, 16), 4, (7, 7), 0.25, -1, False, layout, "avg",
                                 dtype)
    with arm:
        legalized = relax.transform.LegalizeOps()(mod)
    funcs = [f for f in legalized.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert 'sblock("roi_align_adaptive")' in funcs[0].script()
    # one NEON register of data: 4 float32 or 8 float16 (widened into two float32 registers)
    lanes = 8 if dtype == "float16" else 4
    assert f"T.vectorized({lanes})" in funcs[0].script()
    tvm.compile(mod, target=arm)
