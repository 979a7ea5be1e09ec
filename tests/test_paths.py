"""One tester for every code path that computes RoIAlign, in the manner of torchvision's tests.

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
from typing import NamedTuple

import numpy as np
import pytest
import torch
import torchvision
import tvm
from _targets import AARCH64 as ARM
from _targets import GENERIC as HOST
from tvm import relax, te

from tvm_roialign import topi
from tvm_roialign.ops.roi_align import RoiAlignAttrs
from tvm_roialign.strategies import STRATEGIES
from tvm_roialign.strategies.base import LAYOUT_ATTR, mark_scheduled
from tvm_roialign.strategies.cuda import RoIAlignCUDA
from tvm_roialign.testing import build_roi_align_module, roi_align_ref
from tvm_roialign.topi._sampling import accumulate_dtype

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host={"kind": "llvm"})
N, C, H, W = 2, 12, 11, 13
NAN, INF = float("nan"), float("inf")


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
#: Degenerate boxes (zero size, inverted, outside, non-finite, huge, out-of-range batch) under
#: each layout, both meanings of aligned, fixed and adaptive grids, every mode
DEGENERATE_CASES = [
    Case("NCHW", "avg", False, False, 2, 1.0, (2, 2), "float32"),
    Case("NHWC", "max", True, True, -1, 1.0, (2, 2), "float32"),
    Case("NCHW", "onnx_max", True, True, 0, 0.5, (3, 2), "float32"),
    Case("NHWC", "avg", False, False, -1, 0.5, (3, 2), "float32"),
]
DEGENERATE_ROIS = np.array(
    [
        [0, 3, 3, 3, 3],  # zero size
        [1, 6, 6, 2, 2],  # inverted
        [0, -30, -30, -20, -20],  # outside the map
        [0, 100, 100, 120, 130],  # outside the map
        [2, 1, 1, 5, 5],  # batch index == N
        [-3, 1, 1, 5, 5],  # negative batch index
        [NAN, 1, 1, 5, 5],  # NaN batch index
        [0, NAN, 1, 5, 5],  # NaN coordinate
        [0, 1, 1, NAN, 5],  # NaN end (a >= 1 clamp must not hide it)
        [0, -INF, -INF, INF, INF],  # infinite box
        [1, 1e30, 1e30, 1e30, 1e30],  # huge coordinates, zero size
        [1, -0.9, 2, 1e-3, 2.5],  # thin box at the border
        [1, 1, 1, 6, 6],  # an ordinary box
        [0, 9, 8, 40, 25],  # past the right and bottom border
    ],
    dtype="float32",
)
#: rows that are 0 whatever the mode: no valid sample
ZERO_ROWS = [2, 3, 4, 5, 6, 7, 8, 9, 10]


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
    assert all(first[row].any() for row in (11, 12, 13))
