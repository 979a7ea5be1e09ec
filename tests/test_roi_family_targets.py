"""The RoI family (``roi_align_rotated``, ``ps_roi_align``) through ``ConvertLayout`` and on the
other targets, without the hardware:

* ConvertLayout in a conv -> op -> conv model moves both ops to NHWC with the convolutions and leaves
  no ``permute_dims`` next to either op; the converted model computes what the original does;
* the strategies: the x86 schedule is parallel over rois and vectorized over channels in NHWC; ARM
  cross-compiles with vector multiply-adds; CUDA and Metal build through ``tvm.compile`` to source
  with one thread per output element (and no loop but the sampling grid's), int64 indices past
  2**31 elements.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from _targets import AARCH64 as ARM
from _targets import CUDA
from tvm import relax, te

import tvm_roialign
from tvm_roialign import topi
from tvm_roialign.passes import ConvertLayout
from tvm_roialign.strategies import select_strategy
from tvm_roialign.strategies.base import GATHERED_CHANNELS_ATTR
from tvm_roialign.testing import compile_and_run, op_calls, single_op_module

METAL = tvm.target.Target({"kind": "metal"}, host={"kind": "llvm"})
ROTATED, PS = "relax.vision.roi_align_rotated", "relax.vision.ps_roi_align"
DESIRED = {
    "vision.roi_align_rotated": ["NHWC", "default"],
    "vision.ps_roi_align": ["NHWC", "default"],
    "relax.nn.conv2d": ["NHWC", "default"],
}


def _conv_op_conv(op):
    """conv2d -> op -> conv2d (NCHW), ``op`` in (ROTATED, PS)."""
    pooled_channels = 24 if op == PS else 8
    rois_cols = 6 if op == ROTATED else 5

    def build(x, w1, rois, w2):
        bb = relax.BlockBuilder.current()
        feats = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w1, padding=1)))
        if op == ROTATED:
            pooled = tvm_roialign.roi_align_rotated(feats, rois, (3, 4), spatial_scale=0.5,
                                                     sampling_ratio=2)
        else:
            pooled = tvm_roialign.ps_roi_align(feats, rois, (3, 2), spatial_scale=0.5, sampling_ratio=2)
        return relax.op.nn.conv2d(bb.emit(pooled), w2, padding=1)

    return single_op_module(
        build,
        x=((1, 4, 16, 16), "float32"),
        w1=((pooled_channels, 4, 3, 3), "float32"),
        rois=((5, rois_cols), "float32"),
        w2=((6, 8 if op == ROTATED else 4, 3, 3), "float32"),
    )


def _neighbours_of(mod, call):
    """The values bound to ``call``'s data argument and to every binding that reads its output."""
    bindings = [b for block in mod["main"].body.blocks for b in block.bindings]
    (var,) = [b.var for b in bindings if b.value.same_as(call)]
    producer = [b.value for b in bindings if b.var.same_as(call.args[0])]
    consumers = [b.value for b in bindings if isinstance(b.value, relax.Call)
                 and any(a.same_as(var) for a in b.value.args)]
    return producer + consumers


@pytest.mark.parametrize("op", [ROTATED, PS])
def test_convert_layout_leaves_no_transpose_next_to_the_op(rng, op, tol):
    before = _conv_op_conv(op)
    after = ConvertLayout(DESIRED)(before)
    (call,) = op_calls(after, op)
    assert str(call.attrs["layout"]) == "NHWC"
    assert {str(c.attrs.data_layout) for c in op_calls(after, "relax.nn.conv2d")} == {"NHWC"}
    names = [getattr(v.op, "name", "") for v in _neighbours_of(after, call)]
    assert names and "relax.permute_dims" not in names, names
    # the only transposes left read the parameters or produce the output
    assert len(op_calls(after, "relax.permute_dims")) <= 4
    inputs = [rng.standard_normal(tuple(int(d) for d in p.ty.shape)).astype("float32")
              for p in before["main"].params]
    rois = inputs[2]
    rois[:, 0] = [0, 0, 0, 0, 0]
    rois[:, 1:] = np.abs(rois[:, 1:]) * 8
    np.testing.assert_allclose(compile_and_run(after, inputs), compile_and_run(before, inputs),
                               rtol=tol["float32"], atol=tol["float32"])


def _prim(op, target, layout, dtype="float32", sampling_ratio=2, n=2, c=24, h=12, w=10, k=7,
          pooled=(3, 2)):
    strategy, target = select_strategy(target)
    shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    inputs = [te.placeholder(shape, dtype, "data"),
              te.placeholder((k, 6 if op == ROTATED else 5), dtype, "rois")]
    if op == ROTATED:
        def compute(data, rois):
            return topi.roi_align_rotated(data, rois, pooled, 0.5, sampling_ratio, layout=layout)
        extra = None
    else:
        def compute(data, rois):
            return topi.ps_roi_align(data, rois, pooled, 0.5, sampling_ratio, layout)
        extra = {GATHERED_CHANNELS_ATTR: True}
    return strategy.build(compute, inputs, target, layout, None, extra)


def _module(funcs):
    return tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})


def _sources(module, kind):
    found, stack = [], [module]
    while stack:
        mod = stack.pop()
        if mod.kind == kind:
            found.append(mod.inspect_source("" if kind != "llvm" else "asm"))
        stack.extend(mod.imports)
    return "\n".join(found)


def _kernels(source):
    pattern = re.compile(r"(?:__global__ void(?: __launch_bounds__\(\d+\))?|kernel void) (\w+)\(")
    starts = list(pattern.finditer(source))
    bodies = {}
    for i, match in enumerate(starts):
        text = source[match.start(): starts[i + 1].start() if i + 1 < len(starts) else None]
        if "{" in text:
            bodies[match.group(1)] = text
    return bodies


def _gpu_funcs(target, cases):
    """Every op with each ``(layout, dtype, sampling_ratio)`` of ``cases``; 64 rois (more outputs
    than one block of threads)."""
    return {f"{op.rsplit('.', 1)[-1]}_{layout}_{dtype}_{sr}".lower():
            _prim(op, target, layout, dtype, sr, k=64)
            for op in (ROTATED, PS) for layout, dtype, sr in cases}


#: both layouts with a static grid (float16), an adaptive grid (float32), float64 once
GPU_CASES = (("NCHW", "float16", 2), ("NHWC", "float16", 2), ("NCHW", "float32", 0),
             ("NHWC", "float32", 0))


def test_cuda_one_thread_per_output():
    funcs = _gpu_funcs(CUDA, (*GPU_CASES, ("NHWC", "float64", 2)))
    bodies = _kernels(_sources(tvm.compile(_module(funcs), target=CUDA).mod, "cuda"))
    for name in funcs:
        body = bodies[f"{name}_kernel"]
        assert "__launch_bounds__(" in body and "threadIdx.x" in body and "blockIdx.x" in body
        assert "roi_align_acc_local" in body  # the accumulator in a register
        assert body.count("for (") == 2, f"{name}: a loop beside the sampling grid's"
        assert "int64_t" not in body


def test_metal_builds_float16_and_float32_and_refuses_float64():
    funcs = _gpu_funcs(METAL, GPU_CASES[1:3])
    bodies = _kernels(_sources(tvm.compile(_module(funcs), target=METAL).mod, "metal"))
    for name in funcs:
        assert "thread_position_in_grid" in bodies[f"{name}_kernel"] or \
            "threadgroup_position_in_grid" in bodies[f"{name}_kernel"]
    for op in (ROTATED, PS):
        with pytest.raises(ValueError, match="float64 is not supported"):
            _prim(op, METAL, "NHWC", "float64")


@pytest.mark.parametrize("op", [ROTATED, PS])
def test_huge_output_uses_int64(op):
    """172 000 rois x 256 channels x 7 x 7 > 2**31 output elements (built, never allocated)."""
    pooled = (7, 7)
    channels = 256 * (49 if op == PS else 1)
    func = _prim(op, CUDA, "NHWC", "float16", 2, n=2, c=channels, h=50, w=68, k=172_000,
                 pooled=pooled)
    source = _sources(tvm.compile(_module({"huge": func}), target=CUDA).mod, "cuda")
    body = _kernels(source)["huge_kernel"]
    assert "(int64_t)blockIdx.x" in body and "(int64_t)threadIdx.x" in body
    assert not re.search(r"\(int\)blockIdx\.x", body)


@pytest.mark.parametrize("op", [ROTATED, PS])
def test_x86_schedule_is_parallel_and_vectorized_in_nhwc(op):
    func = _prim(op, tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"}), "NHWC",
                 c=96 if op == PS else 32, pooled=(2, 2) if op == PS else (3, 2))
    script = func.script()
    assert "T.parallel" in script and "T.vectorized" in script


@pytest.mark.parametrize("op", [ROTATED, PS])
def test_arm_cross_compiles_with_vector_fma(op):
    func = _prim(op, ARM, "NHWC", c=96 if op == PS else 32, pooled=(2, 2) if op == PS else (3, 2))
    asm = _sources(tvm.compile(_module({"f": func}), target=ARM).mod, "llvm")
    assert re.search(r"\bfml[as]\s+v\d+\.4s", asm)


def test_relax_compile_for_cuda_keeps_our_schedule():
    mods = [
        single_op_module(lambda d, r: tvm_roialign.roi_align_rotated(d, r, 7, spatial_scale=0.25,
                                                                     sampling_ratio=2, layout="NHWC"),
                         data=((1, 20, 24, 32), "float32"), rois=((9, 6), "float32")),
        single_op_module(lambda d, r: tvm_roialign.ps_roi_align(d, r, 2, spatial_scale=0.25,
                                                              sampling_ratio=2, layout="NHWC"),
                         data=((1, 20, 24, 32), "float32"), rois=((9, 5), "float32")),
    ]
    for mod in mods:
        source = _sources(tvm.compile(mod, target=CUDA).mod, "cuda")
        (body,) = [b for name, b in _kernels(source).items() if "roi_align" in name]
        assert "__launch_bounds__(256)" in body
        assert re.search(r"roi_align_ptr\[\(+\(int\)blockIdx\.x\) \* 256\) \+ "
                         r"\(\(int\)threadIdx\.x\)\)\]", body), body[:2000]


@pytest.mark.parametrize("op", [ROTATED, PS])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_x86_uses_the_adaptive_kernel_for_adaptive_grids_only(op, sampling_ratio):
    """Adaptive grids on x86 / ARM take the hand-scheduled kernel of ``strategies.cpu_kernel``
    (weights shared across channels, channel loop vectorized); static grids the TE schedule."""
    if op == ROTATED:
        mod = single_op_module(
            lambda d, r: tvm_roialign.roi_align_rotated(d, r, (3, 2), spatial_scale=0.5,
                                                        sampling_ratio=sampling_ratio, layout="NHWC"),
            data=((1, 9, 9, 32), "float32"), rois=((4, 6), "float32"))
    else:
        mod = single_op_module(
            lambda d, r: tvm_roialign.ps_roi_align(d, r, (3, 2), spatial_scale=0.5,
                                                sampling_ratio=sampling_ratio, layout="NHWC"),
            data=((1, 9, 9, 96), "float32"), rois=((4, 5), "float32"))
    with tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"}):
        legalized = relax.transform.LegalizeOps()(mod)
    (func,) = [f for f in legalized.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    script = func.script()
    assert ('sblock("roi_align_adaptive")' in script) == (sampling_ratio <= 0)
    assert "T.parallel" in script and "T.vectorized(16)" in script


@pytest.mark.parametrize("op", [ROTATED, PS])
def test_arm_adaptive_kernel_cross_compiles(op):
    if op == ROTATED:
        mod = single_op_module(
            lambda d, r: tvm_roialign.roi_align_rotated(d, r, (3, 2), spatial_scale=0.5, sampling_ratio=0,
                                                        layout="NCHW"),
            data=((1, 32, 9, 9), "float16"), rois=((4, 6), "float16"))
    else:
        mod = single_op_module(
            lambda d, r: tvm_roialign.ps_roi_align(d, r, (3, 2), spatial_scale=0.5, sampling_ratio=0,
                                                layout="NHWC"),
            data=((1, 9, 9, 96), "float32"), rois=((4, 5), "float32"))
    asm = _sources(tvm.compile(mod, target=ARM).mod, "llvm")
    assert re.search(r"\bfml[as]\s+v\d+\.4s", asm)


@pytest.mark.parametrize("op", [ROTATED, PS])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_products_are_fenced_against_fma_contraction(op, sampling_ratio):
    """The exact-product rule of roi_align: scaled coordinates (and the rotation's products) are
    rounded on their own, in the TE path and in the adaptive-grid kernel alike."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    script = _prim(op, target, "NHWC", "float32", sampling_ratio, c=96 if op == PS else 32,
                   pooled=(2, 2) if op == PS else (3, 2)).script()
    if sampling_ratio <= 0:  # the strategy's kernel is only built from the op's attributes
        mod = single_op_module(
            (lambda d, r: tvm_roialign.roi_align_rotated(d, r, (3, 2), spatial_scale=0.5, sampling_ratio=0,
                                                         layout="NHWC"))
            if op == ROTATED else
            (lambda d, r: tvm_roialign.ps_roi_align(d, r, (2, 2), spatial_scale=0.5, sampling_ratio=0,
                                                  layout="NHWC")),
            data=((1, 9, 9, 32), "float32"), rois=((4, 6 if op == ROTATED else 5), "float32"))
        with target:
            legalized = relax.transform.LegalizeOps()(mod)
        (func,) = [f for f in legalized.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
        script = func.script()
    assert "llvm.arithmetic.fence" in script


@pytest.mark.parametrize("target", [CUDA, METAL], ids=["cuda", "metal"])
def test_bfloat16_builds_with_a_float32_accumulator(target):
    """bfloat16 data with float32 rois: CUDA's kernel reads ``__nv_bfloat16``, Metal's (TVM 0.27
    legalizes bfloat16 to ``ushort`` storage there) ``ushort``; both accumulate in a float32
    register."""
    kind = target.kind.name
    mod = single_op_module(
        lambda d, r: relax.op.vision.roi_align(d, r, (2, 2), 1.0, 2, layout="NHWC"),
        data=([1, 6, 6, 8], "bfloat16"), rois=([3, 5], "float32"))
    body = _kernels(_sources(tvm.compile(mod, target=target).mod, kind))["roi_align_nhwc_kernel"]
    assert ("nv_bfloat16" if kind == "cuda" else "device ushort* data") in body
    assert "float roi_align_acc_local" in body


@pytest.mark.parametrize("sampling_ratio", [2, -1])
def test_bfloat16_nhwc_x86_loads_register_wide_channel_vectors(sampling_ratio):
    """bfloat16 NHWC on an AVX2 CPU: the x86 strategy's kernel (static and adaptive grids) takes 16
    channels (one 256-bit register of bfloat16) per vector, as float16 does."""
    from tvm_roialign.ops.roi_align import RoiAlignAttrs
    from tvm_roialign.strategies import STRATEGIES

    inputs = [te.placeholder((1, 11, 13, 64), "bfloat16", "data"),
              te.placeholder((7, 5), "float32", "rois")]
    attrs = RoiAlignAttrs((3, 2), 1.0, sampling_ratio, True, "NHWC", "avg", True)
    func = STRATEGIES["x86"].build(
        lambda d, r: topi.roi_align(d, r, (3, 2), 1.0, "avg", sampling_ratio, True, "NHWC", True),
        inputs, tvm.target.Target({"kind": "llvm", "mcpu": "znver3"}), "NHWC", attrs)
    assert set(re.findall(r"T\.vectorized\((\d+)\)", func.script())) == {"16"}
