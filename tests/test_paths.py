"""One tester for every code path that computes RoIAlign, in the manner of torchvision's tests, and
the RoI family's tester (ps_roi_align, roi_align_rotated: :class:`RoIFamilyTester`, at the end).

Every path (:data:`PATHS`) runs the shared case tables (:data:`CASES`, :data:`DEGENERATE_CASES`)
and is compared with the independent float64 reference (:func:`tvm_roialign.testing.roi_align_ref`,
its geometry rounded in the accumulate dtype as the kernels') and, for torchvision's own meaning
(``avg``, ``half_pixel == aligned``), with torchvision; tolerances come from ``conftest.TOLERANCE``.
Outputs start filled with NaN, so an element that a path does not write fails.

Paths: the op through Relax on this machine (``relax``: FInferType, legalization, the x86 strategy);
the x86 schedule of the TE compute (``x86-te``); the hand-scheduled CPU kernel for adaptive grids
(``x86-kernel``); the plain schedule of other llvm targets (``generic-llvm``); the ARM strategy,
schedule and kernel, built for aarch64 and run here (``arm-on-host``: its logic does not depend on
the ISA); the GPU schedule's loop nest left unbound (``gpu-unbound``); CUDA (``cuda``, on a machine
with a CUDA GPU).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import numpy as np
import pytest
import torch
import torchvision
import tvm
from _degenerate import DEGENERATE_ROIS, SAMPLED_ROWS, ZERO_ROWS
from _peers import openvino_roi_align_rotated
from _targets import AARCH64 as ARM
from _targets import CUDA, NATIVE
from _targets import GENERIC as HOST
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax, te

import tvm_roialign
from tvm_roialign import topi
from tvm_roialign.ops.roi_align import RoiAlignAttrs
from tvm_roialign.schedules.roi_align_gpu import RoIAlignCUDA
from tvm_roialign.strategies import STRATEGIES
from tvm_roialign.strategies.base import LAYOUT_ATTR, mark_scheduled
from tvm_roialign.testing import (
    build_roi_align_module,
    ps_roi_align_ref,
    roi_align_ref,
    roi_align_rotated_ref,
    single_op_module,
    smooth_data,
)
from tvm_roialign.topi._sampling import accumulate_dtype

N, C, H, W = 2, 12, 11, 13


class Case(NamedTuple):
    layout: str
    mode: str
    aligned: bool  # stock meaning: no >= 1 clamp
    half_pixel: bool  # subtract 0.5 after scaling (torchvision's aligned: both)
    sampling_ratio: int
    scale: float
    pooled: tuple
    dtype: str

    @property
    def torchvision_meaning(self) -> bool:
        return self.mode == "avg" and self.aligned == self.half_pixel and self.dtype != "float16"

    def id(self) -> str:
        return (f"{self.layout}-{self.mode}-a{int(self.aligned)}h{int(self.half_pixel)}-"
                f"sr{self.sampling_ratio}-s{self.scale:g}-{self.pooled[0]}x{self.pooled[1]}-"
                f"{self.dtype}")


def _cases():
    """Every layout x mode x aligned x fixed/adaptive grid; the sampling ratio, scale, pooled size,
    dtype and (for aligned) torchvision's or stock TVM's meaning rotate through their values."""
    scales = (1.0, 0.25, 0.0625, 0.6, 1 / 3)
    pooled = ((7, 7), (2, 3), (14, 14))
    dtypes = ("float32", "float16", "float64")
    combos = itertools.product(("NCHW", "NHWC"), ("avg", "max", "onnx_max"), (False, True),
                               (True, False))
    for i, (layout, mode, aligned, adaptive) in enumerate(combos):
        sampling_ratio = ((-1, 0) if adaptive else (2, 1))[(i // 2) % 2]
        half_pixel = aligned and i % 8 != 5  # half_pixel implies aligned (as in every importer)
        yield Case(layout, mode, aligned, half_pixel, sampling_ratio, scales[i % 5],
                   pooled[i % 3], dtypes[(i // 2) % 3])


CASES = list(_cases())
#: The degenerate boxes (``_degenerate.DEGENERATE_ROIS``: zero size, inverted, outside, non-finite,
#: huge, out-of-range batch) under each layout, both meanings of aligned, fixed and adaptive grids,
#: every mode
DEGENERATE_CASES = [
    Case("NCHW", "avg", False, False, 2, 1.0, (2, 2), "float32"),
    Case("NHWC", "max", True, True, -1, 1.0, (2, 2), "float32"),
    Case("NCHW", "onnx_max", True, True, 0, 0.5, (3, 2), "float32"),
    Case("NHWC", "avg", False, False, -1, 0.5, (3, 2), "float32"),
]
# --- the paths ---------------------------------------------------------------------------------


def _shape(case):
    return (N, C, H, W) if case.layout == "NCHW" else (N, H, W, C)


def _out_shape(case, num_rois):
    ph, pw = case.pooled
    return (num_rois, C, ph, pw) if case.layout == "NCHW" else (num_rois, ph, pw, C)


def _compute(case):
    return lambda d, r: topi.roi_align(d, r, case.pooled, case.scale, case.mode,
                                       case.sampling_ratio, case.aligned, case.layout,
                                       case.half_pixel)


def _placeholders(case, num_rois):
    return [te.placeholder(_shape(case), case.dtype, "data"),
            te.placeholder((num_rois, 5), case.dtype, "rois")]


def _attrs(case):
    return RoiAlignAttrs(case.pooled, case.scale, case.sampling_ratio, case.aligned, case.layout,
                         case.mode, case.half_pixel)


def _runner(func, target=HOST, device=None):
    """``run(data, rois, out_shape)`` of a PrimFunc ``(data, rois, out)``."""
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                      target=target)
    device = device or tvm.cpu()

    def run(data, rois, out_shape):
        out = tvm.runtime.tensor(np.full(out_shape, np.nan, data.dtype), device)
        args = [tvm.runtime.tensor(a, device) for a in (data, rois)]
        lib["main"](*args, out)
        return out.numpy()

    return run


def _strategy_path(name, target, kernel):
    def build(case, num_rois):
        attrs = _attrs(case) if kernel else None
        func = STRATEGIES[name].build(_compute(case), _placeholders(case, num_rois), target,
                                      case.layout, attrs)
        return _runner(func)

    return build


def _gpu_unbound(case, num_rois):
    inputs = _placeholders(case, num_rois)
    func = te.create_prim_func([*inputs, _compute(case)(*inputs)]).with_attr(LAYOUT_ATTR,
                                                                             case.layout)
    sch = RoIAlignCUDA(bind_threads=False).apply(func, CUDA)
    return _runner(mark_scheduled(sch.mod["main"]))


def _relax(case, num_rois):
    """The op through Relax: ``tvm_roialign.roi_align`` (DictAttrs, half_pixel) for torchvision's
    meaning, the stock call otherwise."""
    mod = build_roi_align_module(_shape(case), num_rois, case.pooled, case.scale,
                                 case.sampling_ratio, case.aligned, case.layout, case.mode,
                                 case.dtype, torchvision_aligned=case.half_pixel)
    vm = relax.VirtualMachine(tvm.compile(mod, target=HOST), tvm.cpu())
    return lambda data, rois, out_shape: vm["main"](tvm.runtime.tensor(data),
                                                     tvm.runtime.tensor(rois)).numpy()


def _cuda(case, num_rois):
    func = STRATEGIES["cuda"].build(_compute(case), _placeholders(case, num_rois), CUDA,
                                    case.layout)
    return _runner(func, CUDA, tvm.cuda(0))


PATHS = {
    "relax": _relax,
    "x86-te": _strategy_path("x86", HOST, kernel=False),
    "x86-kernel": _strategy_path("x86", HOST, kernel=True),
    "generic-llvm": _strategy_path("llvm", HOST, kernel=False),
    "arm-on-host": _strategy_path("arm", ARM, kernel=True),
    "gpu-unbound": _gpu_unbound,
    "cuda": _cuda,
}


def _params(cases):
    """(path, case) pairs; the kernel path only has adaptive grids (it is not used otherwise)."""
    for name, case in itertools.product(PATHS, cases):
        if name == "x86-kernel" and case.sampling_ratio > 0:
            continue
        marks = [pytest.mark.cuda] if name == "cuda" else []
        yield pytest.param(name, case, id=f"{name}-{case.id()}", marks=marks)


@functools.cache
def _built(name, case, num_rois):
    return PATHS[name](case, num_rois)


# --- inputs and expectations -------------------------------------------------------------------


def _data(case, seed=0):
    """N(0, 1) data (NCHW) in the case's dtype."""
    return np.random.default_rng(seed).standard_normal((N, C, H, W)).astype(case.dtype)


def _rois(case):
    """Boxes in feature-map units (inside, straddling the border, tiny, large; integer and
    fractional corners) divided by the scale: image pixels."""
    rng = np.random.default_rng(3)
    starts = np.concatenate([rng.uniform(-2, 10, (6, 2)), rng.integers(-1, 9, (4, 2))])
    sizes = np.concatenate([rng.uniform(0.2, 9, (6, 2)), rng.integers(1, 8, (4, 2))])
    boxes = np.concatenate([starts, starts + sizes], axis=1) / case.scale
    batch = np.arange(len(boxes)) % N
    return np.concatenate([batch[:, None], boxes], axis=1).astype(case.dtype)


def _run(name, case, data_nchw, rois):
    run = _built(name, case, len(rois))
    data = data_nchw if case.layout == "NCHW" else data_nchw.transpose(0, 2, 3, 1)
    out = run(np.ascontiguousarray(data), rois, _out_shape(case, len(rois)))
    assert out.dtype == np.dtype(case.dtype)
    return out if case.layout == "NCHW" else out.transpose(0, 3, 1, 2)


def _expected(case, data, rois):
    with np.errstate(invalid="ignore", over="ignore"):
        return roi_align_ref(data, rois, case.pooled, case.scale, case.sampling_ratio,
                             case.aligned, "NCHW", case.mode, half_pixel=case.half_pixel,
                             coord_dtype=accumulate_dtype(case.dtype))


# --- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name, case", list(_params(CASES)))
def test_path_matches_reference(name, case, tol):
    data, rois = _data(case), _rois(case)
    got = _run(name, case, data, rois).astype(np.float64)
    np.testing.assert_allclose(got, _expected(case, data, rois), rtol=tol[case.dtype],
                               atol=tol[case.dtype])
    if case.torchvision_meaning:
        theirs = torchvision.ops.roi_align(torch.from_numpy(data), torch.from_numpy(rois),
                                           case.pooled, case.scale, case.sampling_ratio,
                                           case.aligned).numpy()
        np.testing.assert_allclose(got, theirs, rtol=tol[case.dtype], atol=tol[case.dtype])


@pytest.mark.parametrize("name, case", list(_params(DEGENERATE_CASES)))
def test_path_degenerate_boxes(name, case, tol):
    """Finite, deterministic (a call with other data in between changes nothing), equal to the
    reference, 0 where no sample is valid, non-zero for the ordinary boxes."""
    data = _data(case, seed=2)
    rois = (DEGENERATE_ROIS * np.array([1, *[1 / case.scale] * 4], "float32")).astype("float32")
    first = _run(name, case, data, rois)
    _run(name, case, data * 100.0, rois)
    second = _run(name, case, data, rois)
    assert np.isfinite(first).all()
    np.testing.assert_array_equal(first, second)
    assert not first[ZERO_ROWS].any()
    np.testing.assert_allclose(first, _expected(case, data, rois), rtol=tol["float32"],
                               atol=tol["float32"])
    assert all(first[row].any() for row in SAMPLED_ROWS)


# === the RoI family: one tester, an op per subclass ============================================
#
# ``relax.vision.ps_roi_align`` and ``relax.vision.roi_align_rotated`` through Relax on the CPU
# (the generic llvm target's TE schedule and the native target's hand-scheduled adaptive-grid
# kernel), both layouts, static and adaptive grids, float16 / float32 / float64, against the op's
# naive float64 ``expected_fn`` and its peer (torchvision's ps_roi_align; OpenVINO's
# ROIAlignRotated, opset 15). Their non-numeric tests (types, errors, registration) stay in
# tests/test_ps_roi_align.py and tests/test_roi_align_rotated.py.

#: The RoI family's tolerances, rtol 0: ``reference`` on a smooth map (:func:`smooth_data`: a
#: coordinate's ulp moves a sample by less), ``peer`` on N(0, 1) data (float32 sums in another
#: order); float16 and float64 against the reference: the suite's ``TOLERANCE``.
FAMILY_TOL = {"reference": 1e-6, "peer": 1e-5}
FAMILY_TARGETS = {"native": NATIVE, "llvm": HOST}


class RoIFamilyTester:
    """One op of the RoI family, torchvision-style: a subclass gives the op (:meth:`make_op`), its
    naive float64 :meth:`expected_fn`, its peer (:meth:`peer_fn`), its boxes and its case tables;
    the tests here run them. ``attrs`` are the op's keyword attributes as a tuple of pairs."""

    N = C_IN = C_OUT = H = W = K = 0
    POOLED: tuple = ()
    SCALE = 0.25
    ROI_WIDTH = 5
    #: (layout, sampling_ratio, target, attrs) compared with the peer on N(0, 1) data
    PEER_CASES: tuple = ()
    #: (layout, sampling_ratio, attrs, degrees) compared with the reference on a smooth map
    REFERENCE_CASES: tuple = ()
    #: (layout, sampling_ratio, attrs, degrees) in float64 / float16
    FLOAT64_CASES: tuple = ()
    FLOAT16_CASES: tuple = ()
    #: (layout, sampling_ratio) of the degenerate boxes
    DEGENERATE_CASES: tuple = ()

    # --- what a subclass gives ------------------------------------------------------------------
    def make_op(self, data, rois, layout, sampling_ratio, attrs):
        raise NotImplementedError

    def expected_fn(self, data, rois, sampling_ratio, attrs):
        raise NotImplementedError

    def peer_fn(self, data, rois, sampling_ratio, attrs):
        raise NotImplementedError

    def random_rois(self, rng, degrees=False, count=None, dtype="float32"):
        raise NotImplementedError

    def degenerate(self, rois, sampling_ratio):
        """``rois`` made degenerate in place; ``(rows that must be 0, rows the peer defines)``."""
        raise NotImplementedError

    def fuzz_cases(self):
        """A hypothesis strategy of ``(layout, sampling_ratio, attrs, rois)``."""
        raise NotImplementedError

    def peer_defines(self, roi, sampling_ratio) -> bool:
        raise NotImplementedError

    # --- the scaffold ---------------------------------------------------------------------------
    def run(self, data_nchw, rois, layout, sampling_ratio, attrs=(), target="native"):
        vm = _family_vm(type(self), layout, sampling_ratio, attrs, target, str(data_nchw.dtype),
                        len(rois))
        data = data_nchw if layout == "NCHW" else data_nchw.transpose(0, 2, 3, 1)
        out = vm["main"](tvm.runtime.tensor(np.ascontiguousarray(data)), tvm.runtime.tensor(rois))
        out = out.numpy()
        return out if layout == "NCHW" else out.transpose(0, 3, 1, 2)

    def shape(self):
        return (self.N, self.C_IN, self.H, self.W)

    def check_reference(self, out, data, rois, sampling_ratio, attrs, atol):
        expected = self.expected_fn(data, rois, sampling_ratio, dict(attrs))
        np.testing.assert_allclose(out, expected, rtol=0, atol=atol)

    def check_peer(self, out, data, rois, sampling_ratio, attrs, rows=None):
        rows = list(range(len(rois))) if rows is None else list(rows)
        if rows:
            theirs = self.peer_fn(data, rois[rows], sampling_ratio, dict(attrs))
            np.testing.assert_allclose(out[rows], theirs, rtol=0, atol=FAMILY_TOL["peer"])

    # --- the tests ------------------------------------------------------------------------------
    def test_matches_peer(self, peer_case, rng):
        """Every CPU path against the peer: the TE schedule and the native adaptive-grid kernel."""
        layout, sampling_ratio, target, attrs = peer_case
        data = rng.standard_normal(self.shape()).astype("float32")
        rois = self.random_rois(rng)
        out = self.run(data, rois, layout, sampling_ratio, attrs, target)
        assert out.shape == (self.K, self.C_OUT, *self.POOLED)
        self.check_peer(out, data, rois, sampling_ratio, attrs)

    def test_matches_float64_reference(self, reference_case, rng):
        layout, sampling_ratio, attrs, degrees = reference_case
        data = smooth_data(self.shape())
        rois = self.reference_rois(rng, degrees)
        out = self.run(data, rois, layout, sampling_ratio, attrs)
        self.check_reference(out, data, rois, sampling_ratio, attrs, FAMILY_TOL["reference"])

    def reference_rois(self, rng, degrees):
        return self.random_rois(rng, degrees=degrees)

    def test_float64_matches_reference(self, float64_case, rng, tol):
        layout, sampling_ratio, attrs, degrees = float64_case
        data = rng.standard_normal(self.shape())
        rois = self.random_rois(rng, degrees=degrees, dtype="float64")
        out = self.run(data, rois, layout, sampling_ratio, attrs)
        self.check_reference(out, data, rois, sampling_ratio, attrs, tol["float64"])

    def test_float16_keeps_dtype(self, float16_case, rng, tol):
        layout, sampling_ratio, attrs, degrees = float16_case
        data = smooth_data(self.shape()).astype("float16")
        rois = self.random_rois(rng, degrees=degrees).astype("float16")
        out = self.run(data, rois, layout, sampling_ratio, attrs)
        assert out.dtype == np.float16
        self.check_reference(out, data, rois, sampling_ratio, attrs, tol["float16"])

    def test_degenerate_nan_and_bad_batch_boxes(self, degenerate_case, rng):
        """Finite, 0 where no sample is valid, the reference everywhere, the peer where it is
        defined."""
        layout, sampling_ratio = degenerate_case
        data = smooth_data(self.shape())
        rois = self.random_rois(rng)
        zero_rows, peer_rows = self.degenerate(rois, sampling_ratio)
        out = self.run(data, rois, layout, sampling_ratio)
        assert np.isfinite(out).all()
        assert not out[zero_rows].any()
        self.check_reference(out, data, rois, sampling_ratio, (), FAMILY_TOL["reference"])
        self.check_peer(out, data, rois, sampling_ratio, (), peer_rows)

    def test_fuzz(self):
        """Bounded fuzz (30 derandomized examples): finite, the reference, the peer where defined."""

        @settings(max_examples=30, deadline=None, derandomize=True)
        @given(case=self.fuzz_cases())
        def check(case):
            layout, sampling_ratio, attrs, rois = case
            data = smooth_data(self.shape())
            out = self.run(data, rois, layout, sampling_ratio, attrs)
            assert np.isfinite(out).all()
            self.check_reference(out, data, rois, sampling_ratio, attrs, FAMILY_TOL["reference"])
            defined = [k for k, roi in enumerate(rois) if self.peer_defines(roi, sampling_ratio)]
            self.check_peer(out, data, rois, sampling_ratio, attrs, defined)

        check()


@functools.cache
def _family_vm(tester, layout, sampling_ratio, attrs, target, dtype, num_rois):
    self = tester()
    n, c, h, w = self.shape()
    shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    mod = single_op_module(
        lambda d, r: self.make_op(d, r, layout, sampling_ratio, dict(attrs)),
        data=(shape, dtype),
        rois=((num_rois, self.ROI_WIDTH), dtype),
    )
    return relax.VirtualMachine(tvm.compile(mod, target=FAMILY_TARGETS[target]), tvm.cpu())


_FAMILY_TABLES = {
    "peer_case": "PEER_CASES",
    "reference_case": "REFERENCE_CASES",
    "float64_case": "FLOAT64_CASES",
    "float16_case": "FLOAT16_CASES",
    "degenerate_case": "DEGENERATE_CASES",
}


def _case_id(case) -> str:
    parts = []
    for item in case:
        if isinstance(item, tuple):  # attrs
            parts.extend(f"{k}={v}" for k, v in item)
        elif isinstance(item, bool):
            parts.append("degrees" if item else "radians")
        else:
            parts.append(f"sr{item}" if isinstance(item, int) else str(item))
    return "-".join(parts)


def pytest_generate_tests(metafunc):
    """A family tester's case arguments from its subclass's tables."""
    if metafunc.cls is None or not issubclass(metafunc.cls, RoIFamilyTester):
        return
    for argument, table in _FAMILY_TABLES.items():
        if argument in metafunc.fixturenames:
            cases = getattr(metafunc.cls, table)
            metafunc.parametrize(argument, cases, ids=[_case_id(c) for c in cases])


def _product(*axes):
    return [tuple(c) for c in itertools.product(*axes)]


LAYOUTS = ("NCHW", "NHWC")


class TestPSRoIAlign(RoIFamilyTester):
    """``relax.vision.ps_roi_align`` against torchvision's ``ps_roi_align`` and
    :func:`tvm_roialign.testing.ps_roi_align_ref`.

    torchvision divides by the grid size without ``max(., 1)``: an empty adaptive grid (a
    zero-size or inverted box) gives NaN there and 0 here (RoIAlign's contract), so such boxes are
    compared with the reference only."""

    N, C_OUT, H, W = 2, 4, 14, 18
    POOLED = (3, 2)
    C_IN = C_OUT * POOLED[0] * POOLED[1]
    K = 12
    PEER_CASES = _product(LAYOUTS, (2, -1), ("native", "llvm"), [()])
    REFERENCE_CASES = _product(LAYOUTS, (2, 0), [()], [False])
    FLOAT64_CASES = _product(LAYOUTS, (-1,), [()], [False])
    FLOAT16_CASES = _product(LAYOUTS, (2,), [()], [False])
    DEGENERATE_CASES = _product(LAYOUTS, (2, -1))

    def make_op(self, data, rois, layout, sampling_ratio, attrs):
        return tvm_roialign.ps_roi_align(
            data, rois, self.POOLED, spatial_scale=self.SCALE, sampling_ratio=sampling_ratio, layout=layout
        )

    def expected_fn(self, data, rois, sampling_ratio, attrs):
        return ps_roi_align_ref(data, rois, self.POOLED, self.SCALE, sampling_ratio)

    def peer_fn(self, data, rois, sampling_ratio, attrs):
        return torchvision.ops.ps_roi_align(torch.from_numpy(data), torch.from_numpy(rois),
                                            self.POOLED, self.SCALE, sampling_ratio).numpy()

    def random_rois(self, rng, degrees=False, count=None, dtype="float32"):
        """Boxes in image pixels (the map covers 56 x 72 at scale 0.25), some partly outside."""
        count = count or self.K
        batch = rng.integers(0, self.N, count)
        corner = rng.uniform(-20, 70, (count, 2))
        size = rng.uniform(0.5, 40, (count, 2))
        return np.concatenate([batch[:, None], corner, corner + size], 1).astype(dtype)

    def degenerate(self, rois, sampling_ratio):
        rois[0, 1:] = [40, 40, 40, 40]  # zero size
        rois[1, 1:] = [50, 50, 30, 20]  # inverted
        rois[2, 3] = np.nan
        rois[3, 1] = np.inf
        rois[4, 0] = self.N  # batch index past the end
        rois[5, 0] = -1
        rois[6, 0] = np.nan
        # torchvision is defined on the degenerate boxes with a static grid, and on the ordinary ones
        return list(range(2, 7)), [*([0, 1] if sampling_ratio > 0 else []), *range(7, len(rois))]

    def fuzz_cases(self):
        coordinate = st.floats(-30, 90, allow_nan=False, width=32)
        box = st.tuples(st.integers(0, self.N - 1), coordinate, coordinate, coordinate, coordinate)
        special = st.none() | st.tuples(st.integers(0, 3), st.integers(0, 4),
                                        st.sampled_from([np.nan, np.inf, -np.inf, 5.0]))
        return st.tuples(st.sampled_from(LAYOUTS), st.sampled_from([-1, 1, 2]), st.just(()),
                         st.lists(box, min_size=4, max_size=4), special).map(_with_special)

    def peer_defines(self, roi, sampling_ratio) -> bool:
        defined = 0 <= roi[0] < self.N and np.isfinite(roi).all()
        return bool(defined and (sampling_ratio > 0 or (roi[3] > roi[1] and roi[4] > roi[2])))


def _with_special(drawn):
    """``(layout, sampling_ratio, attrs, rois)`` of a fuzz draw, its special value put in place."""
    layout, sampling_ratio, attrs, boxes, special = drawn
    rois = np.array(boxes, "float32")
    if special is not None:
        rois[special[0], special[1]] = special[2]
    return layout, sampling_ratio, attrs, rois


ROTATED_RADIANS = (("angle_unit", "radians"),)
DETECTRON2 = (("angle_unit", "degrees"), ("clockwise", False), ("aligned", True))
MMCV_ALIGNED_CLOCKWISE = (("angle_unit", "radians"), ("clockwise", True), ("aligned", True))
MMCV_UNALIGNED = (("angle_unit", "radians"), ("clockwise", False), ("aligned", False))


class TestRoIAlignRotated(RoIFamilyTester):
    """``relax.vision.roi_align_rotated`` against OpenVINO's ``ROIAlignRotated`` (radians, both
    ``clockwise`` values) and :func:`tvm_roialign.testing.roi_align_rotated_ref` in detectron2's
    (degrees, aligned) and mmcv's (radians, clockwise, aligned=False) conventions: random rotated
    boxes (angles 0, 90, 180, negative, boxes partly outside the map)."""

    N, C_IN, H, W = 2, 8, 14, 18
    C_OUT = C_IN
    POOLED = (3, 4)
    K = 16
    ROI_WIDTH = 6
    PEER_CASES = (
        *_product(LAYOUTS, (2, 0), ("native",), [(("clockwise", False),), (("clockwise", True),)]),
        *_product(LAYOUTS, (2, 0), ("llvm",), [()]),  # the TE path (native adaptive: the kernel)
    )
    REFERENCE_CASES = tuple(
        (layout, sr, convention, convention is DETECTRON2)
        for convention in (DETECTRON2, MMCV_ALIGNED_CLOCKWISE, MMCV_UNALIGNED)
        for sr in (2, -1) for layout in LAYOUTS
    )
    FLOAT64_CASES = tuple(_product(LAYOUTS, (-1,), [DETECTRON2], [True]))
    FLOAT16_CASES = (("NHWC", 2, (), False),)
    DEGENERATE_CASES = tuple(_product(LAYOUTS, (2, 0)))

    def make_op(self, data, rois, layout, sampling_ratio, attrs):
        attrs = {"aligned": True, "clockwise": False, "angle_unit": "radians", **attrs}
        return tvm_roialign.roi_align_rotated(
            data, rois, self.POOLED, spatial_scale=self.SCALE, sampling_ratio=sampling_ratio,
            layout=layout, **attrs
        )

    def expected_fn(self, data, rois, sampling_ratio, attrs):
        attrs = {"angle_unit": "radians", **attrs}
        return roi_align_rotated_ref(data, rois, self.POOLED, self.SCALE, sampling_ratio, **attrs)

    def peer_fn(self, data, rois, sampling_ratio, attrs):
        return openvino_roi_align_rotated(data, rois, self.POOLED, self.SCALE, sampling_ratio,
                                          dict(attrs).get("clockwise", False))

    def random_rois(self, rng, degrees=False, count=None, dtype="float32"):
        """Rotated boxes in image pixels (the map covers 56 x 72 at scale 0.25), some partly
        outside; the first angles are 0, 90, 180, -90 and -45 degrees."""
        count = count or self.K
        batch = rng.integers(0, self.N, count)
        centre = rng.uniform(-10, 80, (count, 2))
        size = rng.uniform(2, 60, (count, 2))
        angle = rng.uniform(-math.pi, math.pi, count)
        angle[:5] = np.array([0, 90, 180, -90, -45]) * math.pi / 180
        if degrees:
            angle = angle * 180 / math.pi
        return np.concatenate([batch[:, None], centre, size, angle[:, None]], 1).astype(dtype)

    def reference_rois(self, rng, degrees):
        rois = self.random_rois(rng, degrees=degrees)
        rois[5, 3:5] = [0.5, 2.0]  # below 1 after scaling: clamped unless aligned
        return rois

    def degenerate(self, rois, sampling_ratio):
        rois[0, 3:5] = 0  # zero size
        rois[1, 3:5] = [-8, -4]  # negative size
        rois[2, 1] = np.nan
        rois[3, 5] = np.inf  # angle
        rois[4, 4] = -np.inf
        rois[5, 0] = self.N  # batch index past the end
        rois[6, 0] = -1
        rois[7, 0] = np.nan
        empty = [0, 1] if sampling_ratio == 0 else []  # an empty adaptive grid gives 0
        return [*empty, *range(2, 8)], list(range(8, len(rois)))

    def fuzz_cases(self):
        coordinate = st.floats(-20, 90, allow_nan=False, width=32)
        size = st.floats(-5, 70, allow_nan=False, width=32)
        angle = st.one_of(st.sampled_from([0.0, math.pi / 2, math.pi, -math.pi / 2]),
                          st.floats(-7, 7, allow_nan=False, width=32))
        box = st.tuples(st.integers(0, self.N - 1), coordinate, coordinate, size, size, angle)
        special = st.none() | st.tuples(st.integers(0, 3), st.integers(0, 5),
                                        st.sampled_from([np.nan, np.inf, -np.inf, 7.0]))
        clockwise = st.booleans().map(lambda c: (("clockwise", c),))
        return st.tuples(st.sampled_from(LAYOUTS), st.sampled_from([0, 1, 2]), clockwise,
                         st.lists(box, min_size=4, max_size=4), special).map(_with_special)

    def peer_defines(self, roi, sampling_ratio) -> bool:
        """OpenVINO's result is defined for finite rois, a batch index in [0, N), sizes >= 0."""
        return bool(0 <= roi[0] < self.N and np.isfinite(roi).all() and (roi[3:5] >= 0).all())

    def test_degrees_equal_radians(self):
        rng = np.random.default_rng(1)
        data = smooth_data(self.shape())
        rois = self.random_rois(rng, degrees=True)
        radians = rois.copy()
        radians[:, 5] = (rois[:, 5].astype("float64") * math.pi / 180).astype("float32")
        out_deg = self.run(data, rois, "NHWC", 2, (("angle_unit", "degrees"),))
        out_rad = self.run(data, radians, "NHWC", 2)
        np.testing.assert_allclose(out_deg, out_rad, rtol=0, atol=FAMILY_TOL["peer"])
