"""Exactness found by outside suites (issue 9): the explicit-legalize flows on every target, torchvision's
``aligned`` at any ``spatial_scale`` (also under fused multiply-add), and a non-finite roi giving a
row of zeros without reading outside the feature map on every code path.

(Plain ``torch.export`` of ``MultiScaleRoIAlign`` is tested in ``test_frontend_torch.py``.)
"""

from __future__ import annotations

import functools
import itertools
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
import torchvision
import tvm
from _roi_tester import PRIM_PATHS
from _targets import AARCH64, CUDA
from _targets import GENERIC as HOST
from _targets import NATIVE as FMA_HOST
from tvm import relax, te

import tvm_roialign
from tvm_roialign import topi
from tvm_roialign.ops.roi_align import RoiAlignAttrs
from tvm_roialign.testing import (
    build_roi_align_module,
    compile_and_run,
    guarded_array,
    roi_align_ref,
)
from tvm_roialign.topi.multiscale_roi_align import level_range

METAL = tvm.target.Target({"kind": "metal"}, host={"kind": "llvm"})
#: targets this machine runs, and targets it only compiles for
RUN_TARGETS = {"llvm": HOST, "llvm-mcpu": FMA_HOST}
COMPILE_TARGETS = {"aarch64": AARCH64, "cuda": CUDA, "metal": METAL}
LAYOUTS = ("NCHW", "NHWC")
NAN, INF = float("nan"), float("inf")


def _nhwc(x):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


# --- 1. explicit legalization, then tvm.compile ----------------------------------------------

FEATURES = [(2, 8, 16, 20), (2, 8, 8, 10)]
SCALES = [0.5, 0.25]


#: (layout, sampling_ratio, torchvision's aligned) of the calls: each op gets both layouts, both
#: kinds of grid and both meanings of aligned
CALLS = [("NCHW", 2, False), ("NHWC", -1, True)]


@functools.cache
def _all_calls_module():
    """``main(f0_nchw, f1_nchw, f0_nhwc, f1_nhwc, rois)``: roi_align and multiscale_roi_align for
    each of :data:`CALLS`, and the other way round for the fused op: 4 outputs."""
    bb = relax.BlockBuilder()
    nchw = [relax.Var(f"f{i}", relax.TensorType(list(s), "float32")) for i, s in enumerate(FEATURES)]
    nhwc = [relax.Var(f"g{i}", relax.TensorType([n, h, w, c], "float32"))
            for i, (n, c, h, w) in enumerate(FEATURES)]
    rois = relax.Var("rois", relax.TensorType([6, 5], "float32"))
    with bb.function("main", [*nchw, *nhwc, rois]):
        with bb.dataflow():
            outs = []
            for (layout, sr, aligned), (other, _, _) in zip(CALLS, reversed(CALLS)):
                feats = nchw if layout == "NCHW" else nhwc
                outs.append(bb.emit(tvm_roialign.roi_align(
                    feats[0], rois, (3, 2), spatial_scale=SCALES[0], sampling_ratio=sr,
                    aligned=aligned, layout=layout)))
                feats = nchw if other == "NCHW" else nhwc
                outs.append(bb.emit(tvm_roialign.multiscale_roi_align(
                    feats, rois, (3, 2), SCALES, sampling_ratio=sr, aligned=aligned, layout=other)))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def _all_calls_inputs():
    rng = np.random.default_rng(0)
    feats = [rng.standard_normal(s).astype("float32") for s in FEATURES]
    boxes = np.array([[1, 2, 30, 25], [0, 0, 39, 31], [5.5, 3.2, 12.1, 9.9], [10, 4, 11, 5],
                      [-6, -4, 50, 40], [20, 20, 400, 300]], "float32")
    rois = np.concatenate([[[0], [1], [0], [1], [0], [1]], boxes], axis=1).astype("float32")
    return feats, rois


def _all_calls_expected(feats, rois):
    from torchvision.ops import poolers

    expected = []
    mapper = poolers.initLevelMapper(1, 2)
    levels = mapper([torch.from_numpy(rois[:, 1:])]).numpy()
    for _layout, sr, aligned in CALLS:
        single = torchvision.ops.roi_align(
            torch.from_numpy(feats[0]), torch.from_numpy(rois), (3, 2), SCALES[0], sr, aligned
        ).numpy()
        multi = np.zeros_like(single)
        for level, scale in enumerate(SCALES):
            index = np.nonzero(levels == level)[0]
            multi[index] = torchvision.ops.roi_align(
                torch.from_numpy(feats[level]), torch.from_numpy(rois[index]), (3, 2), scale, sr,
                aligned).numpy()
        expected += [single, multi]
    return expected


def _legalize_then_compile(mod, target):
    with target:
        legalized = relax.transform.LegalizeOps()(mod)
    assert not [f for f in legalized.functions.values()
                if isinstance(f, relax.Function) and "vision" in f.script()]
    return tvm.compile(legalized, target=target)


@pytest.mark.parametrize("name", sorted(RUN_TARGETS))
def test_explicit_legalize_runs_and_matches(name, tol):
    """``LegalizeOps()`` then ``tvm.compile`` (stock TVM's flow; it failed with a duplicate
    ``main`` symbol): both ops in both layouts, fixed and adaptive grids, vs torchvision."""
    executable = _legalize_then_compile(_all_calls_module(), RUN_TARGETS[name])
    feats, rois = _all_calls_inputs()
    vm = relax.VirtualMachine(executable, tvm.cpu())
    args = [*feats, *(_nhwc(f) for f in feats), rois]
    outs = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    expected = _all_calls_expected(feats, rois)
    layouts = [layout for (layout, _, _), (other, _, _) in zip(CALLS, reversed(CALLS))
               for layout in (layout, other)]
    assert len(outs) == len(expected) == len(layouts) == 4
    for i, (out, want, layout) in enumerate(zip(outs, expected, layouts)):
        got = out.numpy()
        if layout == "NHWC":
            got = got.transpose(0, 3, 1, 2)
        np.testing.assert_allclose(got, want, rtol=0, atol=tol["float32"], err_msg=f"output {i}")


@pytest.mark.parametrize("name", sorted(COMPILE_TARGETS))
def test_explicit_legalize_compiles(name):
    """The same module for the targets this machine cannot run: it compiles."""
    _legalize_then_compile(_all_calls_module(), COMPILE_TARGETS[name])


class _Pooling(torch.nn.Module):
    """torchvision roi_align (aligned, a non-power-of-two scale) and a MultiScaleRoIAlign."""

    def __init__(self):
        super().__init__()
        self.pool = torchvision.ops.MultiScaleRoIAlign(["0", "1"], (3, 3), 2)

    def forward(self, f0, f1, boxes):
        rois = torch.cat([torch.zeros_like(boxes[:, :1]), boxes], dim=1)
        single = torchvision.ops.roi_align(f0, rois, (2, 2), 0.6, -1, True)
        multi = self.pool({"0": f0, "1": f1}, [boxes], [(32, 40)])
        return torch.relu(single), multi


@functools.cache
def _imported_pooling():
    from tvm_roialign.frontend import from_exported_program

    g = torch.Generator().manual_seed(3)
    args = (torch.randn(1, 4, 16, 20, generator=g), torch.randn(1, 4, 8, 10, generator=g),
            torch.tensor([[0, 0, 30, 25], [3, 4, 9, 11], [10, 2, 39, 31.0]]))
    model = _Pooling().eval()
    mod = from_exported_program(torch.export.export(model, args))
    mod = relax.transform.DecomposeOpsForInference()(mod)
    return mod, args, model(*args)


@pytest.mark.parametrize("name", sorted({**RUN_TARGETS, **COMPILE_TARGETS}))
def test_import_decompose_legalize_compile(name, tol):
    """TVM's check_correctness flow: import -> DecomposeOpsForInference -> LegalizeOps -> compile
    (a plain torch.export of torchvision ops); run and compared with eager where it runs here."""
    mod, args, expected = _imported_pooling()
    target = {**RUN_TARGETS, **COMPILE_TARGETS}[name]
    executable = _legalize_then_compile(mod, target)
    if name not in RUN_TARGETS:
        return
    vm = relax.VirtualMachine(executable, tvm.cpu())
    outs = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
    for out, want in zip(outs, expected):
        np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=0, atol=tol["float32"])


# --- 2. torchvision's aligned at any spatial_scale -------------------------------------------

EXACT_SCALES = (0.3, 0.6, 0.7, 1 / 3)


def _integer_boxes(count, seed):
    rng = np.random.default_rng(seed)
    xy = rng.integers(0, 60, (count, 2))
    wh = rng.integers(1, 40, (count, 2))
    batch = rng.integers(0, 2, (count, 1))
    return np.concatenate([batch, xy, xy + wh], axis=1).astype("float32")


@functools.cache
def _exact_case():
    data = np.random.default_rng(5).standard_normal((2, 8, 40, 48)).astype("float32")
    return data, _integer_boxes(600, 6)


def _boxes_over(got, want, limit):
    """How many rois have an output element more than ``limit`` away (the issue counts boxes)."""
    err = np.abs(got - want).reshape(len(got), -1).max(axis=1)
    return int((err > limit).sum())


@pytest.mark.parametrize("target", ["llvm", "llvm-mcpu"])
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
@pytest.mark.parametrize("scale", EXACT_SCALES, ids=lambda s: f"{s:.4f}")
def test_aligned_any_scale_vs_torchvision(scale, sampling_ratio, target, tol):
    """Integer boxes, aligned=True: 0 boxes over 1e-5 (with llvm-mcpu LLVM fuses multiply-adds:
    the geometry is fenced, only the value sums differ by float32 rounding)."""
    data, rois = _exact_case()
    want = torchvision.ops.roi_align(
        torch.from_numpy(data), torch.from_numpy(rois), (7, 7), scale, sampling_ratio, True
    ).numpy()
    for layout in LAYOUTS:
        mod = build_roi_align_module(
            data.shape if layout == "NCHW" else _nhwc(data).shape, len(rois), (7, 7), scale,
            sampling_ratio, True, layout, torchvision_aligned=True)
        got = compile_and_run(mod, [data if layout == "NCHW" else _nhwc(data), rois],
                              target=RUN_TARGETS[target])
        if layout == "NHWC":
            got = got.transpose(0, 3, 1, 2)
        assert _boxes_over(got, want, tol["float32"]) == 0, (layout, scale, sampling_ratio)


def test_issue_repro_scale_0_6(tol):
    """arange(256) 16x16, roi (0, 0, 10, 10), 3x3, scale 0.6, adaptive: torchvision's first row
    is 8.5, 10.5, 12.5 (the shift before scaling gave 9.444, 11.389, 13.389)."""
    x = np.arange(256, dtype="float32").reshape(1, 1, 16, 16)
    rois = np.array([[0, 0, 0, 10, 10]], "float32")
    mod = build_roi_align_module(x.shape, 1, (3, 3), 0.6, -1, True, torchvision_aligned=True)
    got = compile_and_run(mod, [x, rois])
    np.testing.assert_allclose(got[0, 0, 0], [8.5, 10.5, 12.5], rtol=0, atol=tol["float32"])


@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_onnx_half_pixel_any_scale_vs_onnxruntime(sampling_ratio, tol):
    """ONNX opset 16 half_pixel and opset 10 output_half_pixel at the four scales, vs onnxruntime."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from tvm_roialign.frontend import from_onnx

    data, rois5 = _exact_case()
    rois, batch = rois5[:, 1:], rois5[:, 0].astype("int64")
    for opset in (10, 16):
        nodes = [helper.make_node("RoiAlign", ["X", "rois", "batch"], [f"Y{i}"],
                                  output_height=7, output_width=7, sampling_ratio=sampling_ratio,
                                  spatial_scale=scale)
                 for i, scale in enumerate(EXACT_SCALES)]
        graph = helper.make_graph(
            nodes, "g",
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(data.shape)),
             helper.make_tensor_value_info("rois", TensorProto.FLOAT, list(rois.shape)),
             helper.make_tensor_value_info("batch", TensorProto.INT64, [len(batch)])],
            [helper.make_tensor_value_info(f"Y{i}", TensorProto.FLOAT, None)
             for i in range(len(nodes))])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="tvm-roialign-tests")
        model.ir_version = 8
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        want = session.run(None, {"X": data, "rois": rois, "batch": batch})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # onnx's checker on the unshaped outputs
            got = compile_and_run(from_onnx(onnx.load_from_string(model.SerializeToString())),
                                  [data, rois, batch])
        for scale, g, w in zip(EXACT_SCALES, got, want):
            assert _boxes_over(g, w, tol["float32"]) == 0, (opset, scale)


@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_torch_export_aligned_any_scale_vs_eager(sampling_ratio, tol):
    from tvm_roialign.frontend import from_exported_program

    class Model(torch.nn.Module):
        def forward(self, x, rois):
            return tuple(torchvision.ops.roi_align(x, rois, (7, 7), s, sampling_ratio, True)
                         for s in EXACT_SCALES)

    data, rois = (torch.from_numpy(a) for a in _exact_case())
    want = Model()(data, rois)
    got = compile_and_run(from_exported_program(torch.export.export(Model(), (data, rois))),
                          [data.numpy(), rois.numpy()])
    for scale, g, w in zip(EXACT_SCALES, got, want):
        assert _boxes_over(g, w.numpy(), tol["float32"]) == 0, scale


@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_multiscale_aligned_per_level_scales(sampling_ratio, tol):
    """The fused op with torchvision's aligned and non-power-of-two per-level scales: each roi is
    torchvision's roi_align(aligned=True) on its level (0 boxes over 1e-5)."""
    from torchvision.ops import poolers

    rng = np.random.default_rng(8)
    scales = [0.6, 0.3]
    feats = [rng.standard_normal((2, 8, 40, 48)).astype("float32"),
             rng.standard_normal((2, 8, 20, 24)).astype("float32")]
    rois = _integer_boxes(300, 9) * [1, 1.5, 1.5, 1.5, 1.5]
    rois = rois.astype("float32")
    k_min, k_max = level_range(scales)
    levels = poolers.initLevelMapper(k_min, k_max)([torch.from_numpy(rois[:, 1:])]).numpy()
    assert set(levels.tolist()) == {0, 1}
    want = np.zeros((len(rois), 8, 7, 7), "float32")
    for level, scale in enumerate(scales):
        index = np.nonzero(levels == level)[0]
        want[index] = torchvision.ops.roi_align(
            torch.from_numpy(feats[level]), torch.from_numpy(rois[index]), (7, 7), scale,
            sampling_ratio, True).numpy()
    bb = relax.BlockBuilder()
    params = [relax.Var(f"f{i}", relax.TensorType(list(f.shape), "float32"))
              for i, f in enumerate(feats)]
    r = relax.Var("rois", relax.TensorType(list(rois.shape), "float32"))
    with bb.function("main", [*params, r]):
        out = bb.emit(tvm_roialign.multiscale_roi_align(
            params, r, 7, scales, sampling_ratio=sampling_ratio, aligned=True))
        bb.emit_func_output(out)
    for target in RUN_TARGETS.values():
        got = compile_and_run(bb.get(), [*feats, rois], target=target)
        assert _boxes_over(got, want, tol["float32"]) == 0


def test_stock_attribute_meaning_unchanged(tol):
    """A call built by a stock importer (typed attributes, aligned=True) still means: no >= 1
    clamp and no shift."""
    data = np.random.default_rng(1).standard_normal((1, 4, 12, 12)).astype("float32")
    rois = np.array([[0, 1, 2, 9, 7], [0, 3, 3, 3.5, 3.2]], "float32")
    mod = build_roi_align_module(data.shape, 2, (2, 2), 0.7, -1, True)
    call = mod["main"].body.blocks[0].bindings[0].value
    assert not isinstance(call.attrs, tvm.ir.DictAttrs)
    assert RoiAlignAttrs.from_call(call).half_pixel is False
    got = compile_and_run(mod, [data, rois])
    want = roi_align_ref(data, rois, (2, 2), 0.7, -1, True, half_pixel=False)
    np.testing.assert_allclose(got, want, rtol=tol["float32"], atol=tol["float32"])


# --- 3. a non-finite roi: a row of zeros, nothing read out of bounds --------------------------


def _non_finite_rois(num_batch=2):
    """Every coordinate position (batch index, x1, y1, x2, y2) x {NaN, +inf, -inf} on an ordinary
    box, then the ordinary box itself (the control: non-zero)."""
    good = [1.0, 2.0, 3.0, 13.0, 9.0]
    rows = []
    for position, value in itertools.product(range(5), (NAN, INF, -INF)):
        row = list(good)
        row[position] = value
        rows.append(row)
    rows.append(good)
    return np.array(rows, "float32")


SHAPES = {"NCHW": [(2, 16, 12, 14), (2, 16, 6, 7)], "NHWC": [(2, 12, 14, 16), (2, 6, 7, 16)]}


#: the code paths that compute RoIAlign (tests/_roi_tester.py's registry), as ``(name, path, maps)``
#: of the single-map op and the fused multi-level op
_GUARDED_PATHS = (("x86", "x86-kernel", 1), ("generic_llvm", "generic-llvm", 1),
                  ("multiscale_x86", "x86-te", 2), ("gpu_unbound", "gpu-unbound", 1),
                  ("multiscale_gpu_unbound", "gpu-unbound", 2))


def _path_funcs(layout, sampling_ratio, aligned, mode):
    """``{name: (PrimFunc, number of feature maps)}``: every code path that computes RoIAlign."""
    rois_t = te.placeholder((16, 5), "float32", "rois")
    maps = [te.placeholder(s, "float32", f"data{i}") for i, s in enumerate(SHAPES[layout])]
    attrs = RoiAlignAttrs((3, 2), 0.5, sampling_ratio, aligned, layout, mode, aligned)

    def single(d, r):
        return topi.roi_align(d, r, (3, 2), 0.5, mode, sampling_ratio, aligned, layout, aligned)

    def multi(d0, d1, r):
        return topi.multiscale_roi_align([d0, d1], r, (3, 2), [0.5, 0.25], sampling_ratio,
                                         aligned, layout, mode=mode, half_pixel=aligned)

    funcs = {}
    for name, path, count in _GUARDED_PATHS:
        func, _ = PRIM_PATHS[path](single if count == 1 else multi, [*maps[:count], rois_t],
                                   layout, attrs if count == 1 else None)
        funcs[name] = (func, count)
    return funcs


@pytest.mark.parametrize(
    "layout, sampling_ratio, aligned, mode",
    [("NCHW", 2, False, "avg"), ("NHWC", 2, True, "max"), ("NCHW", -1, True, "onnx_max"),
     ("NHWC", -1, False, "avg")],
)
def test_non_finite_roi_gives_zeros_on_every_path(layout, sampling_ratio, aligned, mode):
    """Each coordinate position x NaN/+inf/-inf: a row of zeros on every code path (TE compute
    with the x86 and generic schedules, the CPU adaptive kernel, the GPU loop nest unbound on the
    host, the fused multi-level op), each layout with fixed and adaptive grids and either meaning
    of aligned, while every feature map lies next to an inaccessible page (a read past its end or
    before its start crashes; see the control below)."""
    funcs = _path_funcs(layout, sampling_ratio, aligned, mode)
    lib = tvm.compile(tvm.IRModule({name: f.with_attr("global_symbol", name)
                                    for name, (f, _) in funcs.items()}), target=HOST)
    rng = np.random.default_rng(4)
    values = [rng.uniform(0.5, 1.5, s).astype("float32") for s in SHAPES[layout]]
    rois = _non_finite_rois()
    out_shape = (16, 16, 3, 2) if layout == "NCHW" else (16, 3, 2, 16)
    for name, (_, count) in funcs.items():
        for guard in ("after", "before"):
            guarded = [guarded_array(v, guard) for v in values[:count]]
            out = tvm.runtime.tensor(np.full(out_shape, 7.0, "float32"))
            maps = [tvm.runtime.from_dlpack(array) for array, _ in guarded]
            lib[name](*maps, tvm.runtime.tensor(rois), out)
            got = out.numpy()
            assert not got[:15].any(), (name, np.nonzero(got[:15].reshape(15, -1).any(axis=1)))
            assert np.isfinite(got[15]).all() and got[15].any(), name


def test_guard_pages_catch_a_read_past_the_end():
    """The control of the test above: a kernel that reads one element past the end of a guarded
    array crashes (in a subprocess)."""
    script = textwrap.dedent("""
        import numpy as np, tvm
        from tvm import te
        from tvm_roialign.testing import guarded_array
        a = te.placeholder((64,), "float32", "a")
        i = te.placeholder((1,), "int32", "i")
        f = te.create_prim_func([a, i, te.compute((1,), lambda k: a[i[k]], name="o")])
        lib = tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), "llvm")
        data, keep = guarded_array(np.arange(64, dtype="float32"), "after")
        out = tvm.runtime.tensor(np.zeros(1, "float32"))
        idx = tvm.runtime.tensor(np.array([63], "int32"))
        lib["main"](tvm.runtime.from_dlpack(data), idx, out)
        print("inside", out.numpy()[0], flush=True)
        lib["main"](tvm.runtime.from_dlpack(data), tvm.runtime.tensor(np.array([64], "int32")), out)
        print("outside read did not crash", flush=True)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, check=False)
    assert "inside 63.0" in result.stdout, result.stderr[-2000:]
    assert "did not crash" not in result.stdout
    assert result.returncode != 0
