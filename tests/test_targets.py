"""ARM, CUDA and Metal strategies, checked without the hardware (their numerics, run on the host:
the ``arm-on-host`` and ``gpu-unbound`` paths of ``test_roi_family.py``).

* ARM: aarch64 code generation succeeds for both layouts and all dtypes, with vector fused
  multiply-adds.
* CUDA: code generation for both layouts and all dtypes, through TIR and through ``tvm.compile`` of a
  Relax module (dlight must leave our schedule alone); the source compiles with nvcc for sm_80 and
  sm_90 (skipped without nvcc).
* Metal: MSL source for both layouts and float16/float32; float64 raises ValueError.
* Launch structure: blocks x threads cover the output exactly once; the GPU loop nest, left unbound,
  serves the fused multi-level op too.
* Index width: 64-bit indices for a huge shape (built, never allocated), 32-bit for a small one.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess

import numpy as np
import pytest
import tvm
from tvm import te

from tvm_roialign import topi
from tvm_roialign.schedules.roi_align.gpu import RoIAlignCUDA
from tvm_roialign.strategies import select_strategy
from tvm_roialign.strategies.base import LAYOUT_ATTR, mark_scheduled
from tvm_roialign.testing import build_roi_align_module

LAYOUTS = ("NCHW", "NHWC")
DTYPES = ("float16", "float32", "float64")
POOLED = (3, 4)
SCALE = 0.5
from _targets import AARCH64 as ARM
from _targets import GENERIC as HOST

METAL = tvm.target.Target({"kind": "metal"}, host={"kind": "llvm"})
#: 172 images x 1000 rois x 256 channels x 7 x 7 > 2**31 outputs (pytorch/vision#8206)
HUGE = {"n": 172, "c": 256, "h": 50, "w": 68, "k": 172_000, "pooled": (7, 7)}
#: one xdist worker runs this module (`--dist loadgroup`): the sources built once per process
#: below (arm_assembly, cuda_source, metal_source, huge_cuda_source: seconds each) serve several
#: tests, which spread over two workers built each twice
pytestmark = pytest.mark.xdist_group("targets")


def cuda_target(arch="sm_80"):
    return tvm.target.Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})


def data_shape(layout, n, c, h, w):
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def build_prim(target, layout, dtype, sampling_ratio=2, n=2, c=16, h=12, w=10, k=7,
               pooled=POOLED):
    """The PrimFunc that legalization produces for ``target`` (strategy chosen from the target)."""
    strategy, target = select_strategy(target)
    inputs = [
        te.placeholder(data_shape(layout, n, c, h, w), dtype, "data"),
        te.placeholder((k, 5), dtype, "rois"),
    ]

    def compute(data, rois):
        return topi.roi_align(data, rois, pooled, SCALE, "avg", sampling_ratio, False, layout)

    return strategy.build(compute, inputs, target, layout)


def module_of(funcs: dict) -> tvm.IRModule:
    return tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})


def imported_sources(module, kind):
    """Source of every imported runtime module of ``kind`` ("cuda", "metal")."""
    found, stack = [], [module]
    while stack:
        mod = stack.pop()
        if mod.kind == kind:
            found.append(mod.inspect_source(""))
        stack.extend(mod.imports)
    return found


def kernel_bodies(source):
    """``{kernel name: text from its definition to the next kernel}`` of a CUDA/MSL source."""
    pattern = re.compile(r"(?:__global__ void(?: __launch_bounds__\(\d+\))?|kernel void) (\w+)\(")
    starts = list(pattern.finditer(source))
    bodies = {}
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(source)
        text = source[match.start():end]
        if "{" in text:  # skip forward declarations
            bodies[match.group(1)] = text
    return bodies


# ------------------------------------------------------------------------------------------ ARM


def test_arm_target_selects_arm_strategy():
    assert "arm_cpu" in [str(key) for key in ARM.keys]
    assert select_strategy(ARM)[0].name == "arm"
    assert select_strategy(HOST)[0].name != "arm"
    assert select_strategy(cuda_target())[0].name == "cuda"
    assert select_strategy(METAL)[0].name == "metal"


@functools.cache
def arm_assembly():
    """aarch64 assembly of one module holding every layout x dtype, split per PrimFunc."""
    funcs = {f"ra_{layout}_{dtype}".lower(): build_prim(ARM, layout, dtype)
             for layout in LAYOUTS for dtype in DTYPES}
    asm = tvm.compile(module_of(funcs), target=ARM).mod.inspect_source("asm")
    # each PrimFunc is a function "<name>_compute_" followed by its parallel lambda
    sections = re.split(r"^\s*\.type\s+(\S+),@function", asm, flags=re.MULTILINE)
    per_func, owner = {}, None
    for name, text in zip(sections[1::2], sections[2::2]):
        if name.endswith("_compute_"):
            owner = name[: -len("_compute_")]
        elif not name.startswith(".L__tvm_parallel_lambda"):
            owner = None
        if owner is not None:
            per_func[owner] = per_func.get(owner, "") + text
    return per_func


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_arm_codegen_has_vector_fma(layout, dtype):
    asm = arm_assembly()[f"ra_{layout}_{dtype}".lower()]
    arrangement = "2d" if dtype == "float64" else "4s"  # float16 accumulates in float32
    assert re.search(rf"\bfmla\s+v\d+\.{arrangement}", asm), f"no vector fmla for {layout} {dtype}"
    if dtype == "float16":
        assert "fcvtl" in asm  # float16 vectors widened to float32


@pytest.mark.parametrize("sampling_ratio", [2, 0])
def test_relax_compile_for_aarch64(sampling_ratio):
    """The full Relax flow cross-compiles for aarch64 (fixed and adaptive grids)."""
    mod = build_roi_align_module((1, 20, 24, 64), 10, (7, 7), 0.25, sampling_ratio, False, "NHWC",
                                 "avg", "float32")
    executable = tvm.compile(mod, target=ARM)
    (llvm_mod,) = [m for m in walk_modules(executable.mod) if m.kind == "llvm"]
    assert re.search(r"\bfmla\s+v\d+\.4s", llvm_mod.inspect_source("asm"))


def walk_modules(module):
    stack = [module]
    while stack:
        mod = stack.pop()
        yield mod
        stack.extend(mod.imports)


# ----------------------------------------------------------------------------------------- CUDA


@functools.cache
def cuda_source():
    """CUDA source of one module: both layouts x all dtypes, fixed and adaptive sampling grids."""
    funcs = {f"ra_{layout}_{dtype}".lower(): build_prim(cuda_target(), layout, dtype)
             for layout in LAYOUTS for dtype in DTYPES}
    for layout in LAYOUTS:
        funcs[f"ra_{layout}_adaptive".lower()] = build_prim(cuda_target(), layout, "float32", 0)
    executable = tvm.compile(module_of(funcs), target=cuda_target())
    (source,) = imported_sources(executable.mod, "cuda")
    return source


@functools.cache
def relax_cuda_source(layout, dtype):
    """CUDA source from ``tvm.compile`` of a Relax module (torchvision's aligned=True meaning)."""
    shape = data_shape(layout, 1, 32, 20, 24)
    mod = build_roi_align_module(shape, 9, (7, 7), 0.25, 2, True, layout, "avg", dtype,
                                 torchvision_aligned=True)
    executable = tvm.compile(mod, target=cuda_target())
    (source,) = imported_sources(executable.mod, "cuda")
    return source


def nvcc_compile(tmp_path, source, arch):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    path = tmp_path / "kernels.cu"
    path.write_text(source)
    result = subprocess.run(
        [nvcc, "-cubin", f"-arch={arch}", "-o", str(tmp_path / "kernels.cubin"), str(path)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "kernels.cubin").stat().st_size > 0


def test_cuda_codegen_all_layouts_and_dtypes():
    bodies = kernel_bodies(cuda_source())
    for layout in LAYOUTS:
        for variant in (*DTYPES, "adaptive"):
            name = f"ra_{layout}_{variant}_kernel".lower()
            assert name in bodies, f"no CUDA kernel {name}"
            body = bodies[name]
            assert "__launch_bounds__(256)" in body and "threadIdx.x" in body
            # the accumulator lives in a register, and the only loops are the sampling grid's
            # (no grid-stride loop over outputs)
            assert "roi_align_acc_local" in body
            assert body.count("for (") == 2, f"{name}: unexpected loops"
    assert "half" in bodies["ra_nchw_float16_kernel"]
    assert "double" in bodies["ra_nhwc_float64_kernel"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_source_compiles_with_nvcc(tmp_path, arch):
    source = cuda_source()
    # the Relax flow's kernels (float16 needs cuda_fp16.h, which TVM includes) in the same unit
    relax_src = relax_cuda_source("NCHW", "float16")
    assert "#include <cuda_fp16.h>" in relax_src
    relax_kernel = "\n".join(kernel_bodies(relax_src).values())
    nvcc_compile(tmp_path, source + "\n" + relax_kernel, arch)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_relax_compile_for_cuda_keeps_our_schedule(layout):
    """``tvm.compile`` of a Relax module succeeds for CUDA: dlight leaves the scheduled PrimFunc
    alone (stock TVM fails in dlight's Reduction rule); one thread per output, 256 per block."""
    bodies = kernel_bodies(relax_cuda_source(layout, "float32"))
    names = [name for name in bodies if name.startswith("roi_align")]
    assert names, list(bodies)
    body = bodies[names[0]]
    assert "__launch_bounds__(256)" in body
    assert "blockIdx.x" in body and "threadIdx.x" in body
    # output written at blockIdx.x * 256 + threadIdx.x (+ nothing): one element per thread
    assert re.search(r"roi_align_ptr\[\(+\(int\)blockIdx\.x\) \* 256\) \+ \(\(int\)threadIdx\.x\)\)\]",
                     body), "output not indexed by the global thread id"


def test_dlight_leaves_scheduled_func_unchanged():
    from tvm.s_tir import dlight

    func = build_prim(cuda_target(), "NHWC", "float32")
    mod = module_of({"main": func})
    with cuda_target():
        after = dlight.ApplyDefaultSchedule(
            dlight.gpu.Reduction(), dlight.gpu.GeneralReduction(), dlight.gpu.Fallback()
        )(mod)
    tvm.ir.assert_structural_equal(after["main"], mod["main"])


# ---------------------------------------------------------------------------------------- Metal


@functools.cache
def metal_source():
    funcs = {f"ra_{layout}_{dtype}".lower(): build_prim(METAL, layout, dtype)
             for layout in LAYOUTS for dtype in ("float16", "float32")}
    executable = tvm.compile(module_of(funcs), target=METAL)
    return "\n".join(imported_sources(executable.mod, "metal"))


def test_metal_source_generation():
    bodies = kernel_bodies(metal_source())
    for layout in LAYOUTS:
        for dtype in ("float16", "float32"):
            body = bodies[f"ra_{layout}_{dtype}_kernel".lower()]
            assert "threadgroup_position_in_grid" in body
            scalar = "half" if dtype == "float16" else "float"
            assert f"device {scalar}* data" in body
    assert select_strategy(METAL)[0].name == "metal"


def test_metal_threadgroup_at_most_256():
    target = tvm.target.Target({"kind": "metal", "max_num_threads": 1024}, host={"kind": "llvm"})
    func = build_prim(target, "NHWC", "float32")
    assert max(thread_extents(func).get("threadIdx.x", [0])) <= 256


def test_metal_float64_raises():
    with pytest.raises(ValueError, match=r"float64.*metal"):
        build_prim(METAL, "NCHW", "float64")
    mod = build_roi_align_module((1, 4, 8, 8), 3, 2, 1.0, 2, False, "NCHW", "avg", "float64")
    with pytest.raises(ValueError, match=r"float64.*metal"):
        tvm.compile(mod, target=METAL)


# ----------------------------------------------------------------------- launch structure (GPU)


def walk(stmt):
    """Every statement (and SBlock) under ``stmt``, parents first."""
    stack = [stmt]
    while stack:
        node = stack.pop()
        yield node
        for attr in ("body", "block", "then_case", "else_case", "init"):
            child = getattr(node, attr, None)
            if isinstance(child, (tvm.tirx.Stmt, tvm.s_tir.SBlock)):
                stack.append(child)
        if hasattr(node, "seq"):
            stack.extend(node.seq)


def thread_loops(func):
    return [node for node in walk(func.body)
            if isinstance(node, tvm.tirx.For) and node.thread_binding is not None]


def thread_extents(func):
    """``{thread tag: [extents]}`` of the thread-bound loops of a PrimFunc."""
    found = {}
    for loop in thread_loops(func):
        found.setdefault(str(loop.thread_binding.thread_tag), []).append(int(loop.extent))
    return found


def output_binding(func):
    """(thread loop vars -> ranges, {values, predicate, extents} of the ``roi_align`` block)."""
    (realize,) = [node for node in walk(func.body)
                  if hasattr(node, "iter_values") and node.block.name_hint == "roi_align"]
    result = {
        "values": list(realize.iter_values),
        "predicate": realize.predicate,
        "extents": [iv.dom.extent for iv in realize.block.iter_vars],
    }
    return {f.loop_var: tvm.ir.Range(0, f.extent) for f in thread_loops(func)}, result


@pytest.mark.parametrize("target", [cuda_target(), METAL], ids=["cuda", "metal"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_launch_covers_output_exactly_once(target, layout):
    # 7 rois x 16 channels x 3 x 4 = 1344 outputs: not a multiple of 256, so the tail is guarded
    func = build_prim(target, layout, "float32")
    total = 7 * 16 * 3 * 4
    extents = thread_extents(func)
    (blocks,), (threads,) = extents["blockIdx.x"], extents["threadIdx.x"]
    assert threads <= int(target.attrs["max_num_threads"])
    assert blocks * threads >= total > (blocks - 1) * threads
    dom, out = output_binding(func)
    # the map (blockIdx, threadIdx) -> output index, under the tail predicate, is a bijection from
    # the guarded threads onto the output: each element is written by exactly one thread
    extents = [int(e) for e in out["extents"]]
    assert int(np.prod(extents)) == total
    assert iter_map_extents(out["values"], dom, out["predicate"]) == extents
    # control: without the predicate the same bindings run past the rois (k up to blocks * threads
    # / (C * PH * PW) > K): the check rejects it
    assert iter_map_extents(out["values"], dom, True) != extents
    # consecutive threads write consecutive elements: the innermost output index (C in NHWC, so
    # that a warp's loads are contiguous; PW in NCHW) is the one that steps with threadIdx.x
    thread0 = output_index(func, out["values"], block=1, thread=0)
    thread1 = output_index(func, out["values"], block=1, thread=1)
    assert [b - a for a, b in zip(thread0, thread1)] == [0, 0, 0, 1]


def iter_map_extents(values, dom, predicate):
    """The extent of each output index when ``values`` is a bijective affine map of the thread
    loops ``dom`` restricted by ``predicate`` (AssertionError otherwise): every point of the
    product of these extents is then reached by exactly one thread."""
    mapped = tvm.sym.detect_iter_map(values, dom, predicate, "bijective")
    assert len(mapped.indices) == len(values), mapped.errors
    extents = []
    for index in mapped.indices:
        (split,) = index.args
        assert int(split.scale) == 1 and int(split.lower_factor) == 1
        extents.append(int(split.extent))
    return extents


def output_index(func, values, block, thread):
    """The output element ``(i0, i1, i2, i3)`` written by thread ``thread`` of block ``block``."""
    analyzer = tvm.sym.Analyzer()
    for loop in thread_loops(func):
        value = block if str(loop.thread_binding.thread_tag) == "blockIdx.x" else thread
        analyzer.bind(loop.loop_var, tvm.tirx.const(value, str(loop.loop_var.ty.dtype)))
    return [int(analyzer.simplify(value)) for value in values]


# ---------------------------------------------------------------------------------- index width


def loop_and_param_dtypes(func):
    """dtypes of every loop variable of ``func`` and of its parameters' shapes."""
    dtypes = {str(node.loop_var.ty.dtype) for node in walk(func.body) if isinstance(node, tvm.tirx.For)}
    for param in func.params:
        dtypes.update(str(dim.ty.dtype) for dim in param.shape)
    return dtypes


@functools.cache
def huge_prim(target_key, layout="NCHW", dtype="float16"):
    target = {"cuda": cuda_target(), "metal": METAL, "arm": ARM, "host": HOST}[target_key]
    return build_prim(target, layout, dtype, 2, n=HUGE["n"], c=HUGE["c"], h=HUGE["h"],
                      w=HUGE["w"], k=HUGE["k"], pooled=HUGE["pooled"])


def test_huge_output_uses_int64_on_every_target():
    assert HUGE["k"] * HUGE["c"] * 49 > 2**31 - 1  # output only; data and rois are small
    for key in ("cuda", "metal", "arm", "host"):
        assert loop_and_param_dtypes(huge_prim(key)) == {"int64"}, key
    small = build_prim(ARM, "NCHW", "float16")
    assert loop_and_param_dtypes(small) == {"int32"}


@functools.cache
def huge_cuda_source():
    executable = tvm.compile(module_of({"ra_huge": huge_prim("cuda", "NHWC", "float16")}),
                             target=cuda_target())
    (source,) = imported_sources(executable.mod, "cuda")
    return source


def test_cuda_index_width():
    huge = kernel_bodies(huge_cuda_source())["ra_huge_kernel"]
    assert "(int64_t)blockIdx.x" in huge and "(int64_t)threadIdx.x" in huge
    # the global thread id is formed in 64 bits, never as a 32-bit product widened afterwards
    assert not re.search(r"\(int\)blockIdx\.x", huge)
    small = kernel_bodies(cuda_source())["ra_nhwc_float16_kernel"]
    assert "int64_t" not in small and "(int)blockIdx.x" in small


def test_metal_index_width():
    executable = tvm.compile(module_of({"ra_huge": huge_prim("metal", "NHWC", "float16")}),
                             target=METAL)
    (source,) = imported_sources(executable.mod, "metal")
    huge = kernel_bodies(source)["ra_huge_kernel"]
    assert "(long)blockIdx" in huge and "(long)threadIdx" in huge
    small = kernel_bodies(metal_source())["ra_nhwc_float16_kernel"]
    assert not re.search(r"\blong\b", small) and "(int)blockIdx" in small


@pytest.mark.parametrize("arch", ["sm_90"])
def test_huge_cuda_source_compiles_with_nvcc(tmp_path, arch):
    nvcc_compile(tmp_path, huge_cuda_source(), arch)


def test_output_beyond_one_launch_raises():
    """Over 2**31 - 1 blocks of 256 threads (1.6e12 outputs): a clear ValueError, not a bad launch."""
    with pytest.raises(ValueError, match="more than 2147483647 blocks"):
        build_prim(cuda_target(), "NHWC", "float16", 2, n=1, c=4096, h=64, w=64, k=2_000_000,
                   pooled=(14, 14))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_loop_nest_serves_multiscale_roi_align(rng, layout, tol):
    """The same GPU rule schedules the fused multi-level RoIAlign (FPN levels chosen in-kernel);
    unbound, on the host, it agrees exactly with the host strategy's PrimFunc."""
    from tvm_roialign.topi import multiscale_roi_align

    sizes = [(32, 40), (16, 20), (8, 10), (4, 5)]
    scales = [1 / 4, 1 / 8, 1 / 16, 1 / 32]
    feats = [te.placeholder(data_shape(layout, 2, 16, h, w), "float32", f"f{i}")
             for i, (h, w) in enumerate(sizes)]
    rois_t = te.placeholder((9, 5), "float32", "rois")

    def compute(*args):
        return multiscale_roi_align(list(args[:-1]), args[-1], 7, scales, 2, False, layout)

    out_t = compute(*feats, rois_t)
    func = te.create_prim_func([*feats, rois_t, out_t]).with_attr(LAYOUT_ATTR, layout)
    sch = RoIAlignCUDA(bind_threads=False).apply(func, cuda_target())
    gpu_func = mark_scheduled(sch.mod["main"])
    strategy, target = select_strategy(HOST)
    host_func = strategy.build(compute, [*feats, rois_t], target, layout)
    arrays = [rng.standard_normal([int(d) for d in f.shape]).astype("float32") for f in feats]
    corners = rng.uniform(0, 160, (9, 4))
    rois = np.concatenate([rng.integers(0, 2, (9, 1)), np.minimum(corners[:, :2], corners[:, 2:]),
                           np.maximum(corners[:, :2], corners[:, 2:])], axis=1).astype("float32")
    results = []
    for f in (gpu_func, host_func):
        lib = tvm.compile(tvm.IRModule({"main": f}), target=HOST)
        out = tvm.runtime.tensor(np.full([int(d) for d in out_t.shape], np.nan, "float32"))
        lib["main"](*[tvm.runtime.tensor(a) for a in arrays], tvm.runtime.tensor(rois), out)
        results.append(out.numpy())
    assert not np.isnan(results[0]).any()
    np.testing.assert_allclose(results[0], results[1], rtol=tol["float32"], atol=tol["float32"])
