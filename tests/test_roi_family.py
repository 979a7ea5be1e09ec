"""The RoI family's numerics, one subclass of tests/_roi_tester.py's :class:`RoIOpTester` per op:

* ``roi_align`` on every code path (the op through Relax, the x86 TE schedule and adaptive-grid
  kernel, the generic llvm schedule, ARM built for aarch64 and run here, the GPU loop nest unbound,
  CUDA) against the float64 reference (its geometry rounded in the accumulate dtype as the
  kernels') and torchvision's ``roi_align`` (``avg`` with ``half_pixel == aligned``);
* ``multiscale_roi_align`` through Relax and the GPU loop nest against torchvision's
  ``MultiScaleRoIAlign`` (and per-level ``roi_align`` for ``aligned``) and a per-level reference;
* ``ps_roi_align`` against torchvision's ``ps_roi_align``;
* ``roi_align_rotated`` against OpenVINO's ``ROIAlignRotated`` (opset 15) and the reference in
  detectron2's (degrees, aligned) and mmcv's (radians, clockwise, aligned=False) conventions.

The non-numeric tests of each op (types, errors, registration) are in its own test file.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict

import numpy as np
import torch
import torchvision
import tvm
from _degenerate import DEGENERATE_ROIS, SAMPLED_ROWS, ZERO_ROWS
from _peers import openvino_roi_align_rotated
from _roi_tester import (
    LAYOUTS,
    PRIM_PATHS,
    RELAX_TARGETS,
    RoICase,
    RoIOpTester,
    prim_runner,
    relax_runner,
    to_layout,
)
from hypothesis import strategies as st
from tvm import relax, te

import tvm_roialign
from tvm_roialign import topi
from tvm_roialign.ops.roi_align import RoiAlignAttrs
from tvm_roialign.testing import (
    build_roi_align_module,
    ps_roi_align_ref,
    roi_align_ref,
    roi_align_rotated_ref,
    smooth_data,
)
from tvm_roialign.topi._args import rois_dtypes_for
from tvm_roialign.topi._sampling import accumulate_dtype

SPECIALS = (float("nan"), float("inf"), float("-inf"))


def _out_shape(layout, num_rois, channels, pooled):
    return (num_rois, channels, *pooled) if layout == "NCHW" else (num_rois, *pooled, channels)


def _layout_shape(shape, layout):
    n, c, h, w = shape
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


# === roi_align =================================================================================


def _roi_align_attrs(mode, aligned, half_pixel, scale, pooled):
    return (("mode", mode), ("aligned", aligned), ("half_pixel", half_pixel), ("scale", scale),
            ("pooled", pooled))


def _roi_align_cases():
    """Every layout x mode x aligned x fixed/adaptive grid; the sampling ratio, scale, pooled size,
    dtype and (for aligned) torchvision's or stock TVM's meaning rotate through their values."""
    scales = (1.0, 0.25, 0.0625, 0.6, 1 / 3)
    pooled = ((7, 7), (2, 3), (14, 14))
    combos = itertools.product(LAYOUTS, ("avg", "max", "onnx_max"), (False, True), (True, False))
    for i, (layout, mode, aligned, adaptive) in enumerate(combos):
        sampling_ratio = ((-1, 0) if adaptive else (2, 1))[(i // 2) % 2]
        half_pixel = aligned and i % 8 != 5  # half_pixel implies aligned (as in every importer)
        attrs = _roi_align_attrs(mode, aligned, half_pixel, scales[i % 5], pooled[i % 3])
        yield layout, sampling_ratio, attrs, ("float32", "float16", "float64")[(i // 2) % 3]


def _roi_align_bf16_cases():
    """bfloat16 data (float32 rois): layout x mode x fixed/adaptive grid, aligned and its meaning
    alternating."""
    combos = itertools.product(LAYOUTS, ("avg", "max"), (2, -1))
    for i, (layout, mode, sampling_ratio) in enumerate(combos):
        aligned = i % 2 == 0
        attrs = _roi_align_attrs(mode, aligned, aligned and i % 4 == 0, (1.0, 0.25, 0.6)[i % 3],
                                 ((7, 7), (2, 3))[i % 2])
        yield layout, sampling_ratio, attrs, "bfloat16"


#: The degenerate boxes (``_degenerate.DEGENERATE_ROIS``) under each layout, both meanings of
#: aligned, fixed and adaptive grids, every mode
_ROI_ALIGN_DEGENERATE = [
    ("NCHW", 2, _roi_align_attrs("avg", False, False, 1.0, (2, 2))),
    ("NHWC", -1, _roi_align_attrs("max", True, True, 1.0, (2, 2))),
    ("NCHW", 0, _roi_align_attrs("onnx_max", True, True, 0.5, (3, 2))),
    ("NHWC", -1, _roi_align_attrs("avg", False, False, 0.5, (3, 2))),
]
ROI_ALIGN_PATHS = ("relax", *PRIM_PATHS)


def _on_paths(cases):
    """A case per path; the kernel path only has adaptive grids (it is not used otherwise)."""
    return tuple(RoICase(path, layout, sr, attrs, dtype)
                 for path, (layout, sr, attrs, *rest) in itertools.product(ROI_ALIGN_PATHS, cases)
                 for dtype in (rest or ["float32"])
                 if not (path == "x86-kernel" and sr > 0))


def _torchvision_meaning(case):
    return (case.get("mode") == "avg" and case.get("aligned") == case.get("half_pixel")
            and case.dtype not in ("float16", "bfloat16"))  # torchvision's CPU kernel: neither


class TestRoIAlign(RoIOpTester):
    """``relax.vision.roi_align`` on every path; the fuzz: spatial_scale x torchvision's aligned x
    sampling_ratio x layout x a NaN / infinity at any position of any roi (torchvision's result is
    only defined for finite rois with a batch index in ``[0, N)``, and it raises for an inverted
    box with ``aligned=True`` and an adaptive grid)."""

    N, C, H, W = 2, 12, 11, 13
    REFERENCE_CASES = _on_paths([*_roi_align_cases(), *_roi_align_bf16_cases()])
    PEER_CASES = tuple(c for c in REFERENCE_CASES if _torchvision_meaning(c))
    DEGENERATE_CASES = _on_paths(_ROI_ALIGN_DEGENERATE)
    FUZZ_EXAMPLES = 60
    FUZZ_SHAPE = (2, 4, 12, 14)
    FUZZ_POOLED = (3, 2)

    def build(self, case, data_shape, num_rois):
        pooled, scale = case.get("pooled"), case.get("scale")
        mode, aligned, half_pixel = case.get("mode"), case.get("aligned"), case.get("half_pixel")
        shape = _layout_shape(data_shape, case.layout)
        if case.path == "relax":  # tvm_roialign.roi_align for torchvision's meaning, else stock
            mod = build_roi_align_module(shape, num_rois, pooled, scale, case.sampling_ratio,
                                         aligned, case.layout, mode, case.dtype,
                                         torchvision_aligned=half_pixel,
                                         rois_dtype=rois_dtypes_for(case.dtype)[0])
            return _vm_runner(mod)
        inputs = [te.placeholder(shape, case.dtype, "data"),
                  te.placeholder((num_rois, 5), rois_dtypes_for(case.dtype)[0], "rois")]
        attrs = RoiAlignAttrs(pooled, scale, case.sampling_ratio, aligned, case.layout, mode,
                              half_pixel)

        def compute(d, r):
            return topi.roi_align(d, r, pooled, scale, mode, case.sampling_ratio, aligned,
                                  case.layout, half_pixel)

        run = prim_runner(*PRIM_PATHS[case.path](compute, inputs, case.layout, attrs))
        out_shape = _out_shape(case.layout, num_rois, data_shape[1], pooled)
        return lambda data, rois: run(data, rois, out_shape)

    def expected_fn(self, case, data, rois):
        return roi_align_ref(data, rois, case.get("pooled"), case.get("scale"),
                             case.sampling_ratio, case.get("aligned"), "NCHW", case.get("mode"),
                             half_pixel=case.get("half_pixel"),
                             coord_dtype=accumulate_dtype(case.dtype))

    def peer_fn(self, case, data, rois):
        return torchvision.ops.roi_align(torch.from_numpy(data), torch.from_numpy(rois),
                                         case.get("pooled"), case.get("scale"),
                                         case.sampling_ratio, case.get("aligned")).numpy()

    def reference_inputs(self, case, rng):
        """N(0, 1) data; boxes in feature-map units (inside, straddling the border, tiny, large;
        integer and fractional corners) divided by the scale: image pixels."""
        data = np.random.default_rng(0).standard_normal((self.N, self.C, self.H, self.W))
        boxes_rng = np.random.default_rng(3)
        starts = np.concatenate([boxes_rng.uniform(-2, 10, (6, 2)),
                                 boxes_rng.integers(-1, 9, (4, 2))])
        sizes = np.concatenate([boxes_rng.uniform(0.2, 9, (6, 2)),
                                boxes_rng.integers(1, 8, (4, 2))])
        boxes = np.concatenate([starts, starts + sizes], axis=1) / case.get("scale")
        batch = np.arange(len(boxes)) % self.N
        rois = np.concatenate([batch[:, None], boxes], axis=1)
        return data.astype(case.dtype), rois.astype(rois_dtypes_for(case.dtype)[0])

    def degenerate(self, case, rng):
        data = np.random.default_rng(2).standard_normal((self.N, self.C, self.H, self.W))
        scale = np.array([1, *[1 / case.get("scale")] * 4], "float32")
        rois = (DEGENERATE_ROIS * scale).astype("float32")
        return data.astype("float32"), rois, ZERO_ROWS, [], SAMPLED_ROWS

    def fuzz_case(self, scale, aligned, sampling_ratio, layout, boxes, special):
        """``(case, data, rois)``: ``boxes`` in feature-map units divided by the scale, one value
        replaced by ``special`` = ``(row, column, value)``."""
        rois = np.array(boxes, "float32") / np.array([1, scale, scale, scale, scale], "float32")
        rois[:, 0] = [b[0] for b in boxes]
        if special is not None:
            rois[special[0], special[1]] = special[2]
        case = RoICase("relax", layout, sampling_ratio,
                       _roi_align_attrs("avg", aligned, aligned, scale, self.FUZZ_POOLED))
        data = np.random.default_rng(0).standard_normal(self.FUZZ_SHAPE).astype("float32")
        return case, data, rois.astype("float32")

    def fuzz_cases(self):
        n = self.FUZZ_SHAPE[0]
        coordinate = st.one_of(
            st.integers(-4, 18).map(float),  # integer boxes: samples on pixel and bin boundaries
            st.floats(-4, 18, allow_nan=False, width=32),
        )
        roi = st.tuples(st.integers(0, n), coordinate, coordinate, coordinate, coordinate)
        special = st.none() | st.tuples(st.integers(0, 5), st.integers(0, 4),
                                        st.sampled_from(SPECIALS))
        return st.builds(self.fuzz_case, st.sampled_from((1.0, 0.5, 0.25, 0.3, 0.6, 0.7, 1 / 3)),
                         st.booleans(), st.sampled_from([-1, 0, 1, 2]), st.sampled_from(LAYOUTS),
                         st.lists(roi, min_size=6, max_size=6), special)

    def fuzz_examples(self):
        nan, inf = float("nan"), float("inf")
        return [
            self.fuzz_case(0.6, True, -1, "NCHW", [(0, 0.0, 0.0, 10.0 / 0.6, 10.0 / 0.6)] * 6,
                           (1, 3, nan)),
            self.fuzz_case(1.0, False, 2, "NHWC", [(0, 1.0, 1.0, 6.0, 5.0)] * 6, (0, 3, nan)),
            self.fuzz_case(0.7, True, 0, "NHWC", [(1, 3.0, 2.0, 17.0, 11.0)] * 6, (2, 4, -inf)),
            # samples on y == -1
            self.fuzz_case(0.5, False, -1, "NCHW", [(0, 0.0, -2.0, 0.0, 0.0)] * 6, None),
        ]

    def peer_defines(self, case, roi) -> bool:
        if not (np.isfinite(roi).all() and 0 <= roi[0] < self.FUZZ_SHAPE[0]):
            return False
        inverted = roi[3] < roi[1] or roi[4] < roi[2]
        return not (inverted and case.get("aligned") and case.sampling_ratio <= 0)


def _vm_runner(mod):
    vm = relax.VirtualMachine(tvm.compile(mod, target=RELAX_TARGETS["relax"]), tvm.cpu())
    return lambda *arrays: vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


# === ps_roi_align and roi_align_rotated ========================================================

#: rtol 0: ``reference`` on a smooth map (:func:`smooth_data`: a coordinate's ulp moves a sample by
#: less), ``peer`` on N(0, 1) data (float32 sums in another order); float16 and float64 against
#: the reference: the suite's ``TOLERANCE``.
FAMILY_TOL = {"reference": 1e-6, "peer": 1e-5}


def _cases(paths, layouts, ratios, attrs=((),), dtypes=("float32",)):
    return tuple(RoICase(path, layout, sr, a, dtype) for a, path, sr, layout, dtype
                 in itertools.product(attrs, paths, ratios, layouts, dtypes))


class _OneOpTester(RoIOpTester):
    """An op of one feature map through Relax (``native``: the hand-scheduled adaptive-grid kernel
    for adaptive grids; ``llvm``: the TE schedule) on random boxes: N(0, 1) data for the peer, a
    smooth map for the reference (N(0, 1) in float64)."""

    N = C_IN = C_OUT = H = W = K = 0
    POOLED: tuple = ()
    SCALE = 0.25
    ROI_WIDTH = 5

    def make_op(self, data, rois, case):
        raise NotImplementedError

    def random_rois(self, rng, degrees=False, dtype="float32"):
        raise NotImplementedError

    def degenerate_rows(self, rois, sampling_ratio):
        """``rois`` made degenerate in place; ``(rows that must be 0, rows the peer defines)``."""
        raise NotImplementedError

    def shape(self):
        return (self.N, self.C_IN, self.H, self.W)

    def build(self, case, data_shape, num_rois):
        return relax_runner(lambda d, r: self.make_op(d, r, case), case.path,
                            data=(_layout_shape(data_shape, case.layout), case.dtype),
                            rois=((num_rois, self.ROI_WIDTH), rois_dtypes_for(case.dtype)[0]))

    def tolerance(self, case, check, tol):
        if check == "peer":
            return 0, FAMILY_TOL["peer"]
        if case.dtype == "bfloat16":  # one rounding: relative to the output's magnitude
            return tol["bfloat16"], tol["bfloat16"]
        return 0, FAMILY_TOL["reference"] if case.dtype == "float32" else tol[case.dtype]

    @staticmethod
    def degrees(case):
        return case.get("angle_unit") == "degrees"

    def reference_rois(self, rng, degrees):
        return self.random_rois(rng, degrees=degrees)

    def reference_inputs(self, case, rng):
        degrees = self.degrees(case)
        if case.dtype == "float64":
            data = rng.standard_normal(self.shape())
            return data, self.random_rois(rng, degrees=degrees, dtype="float64")
        if case.dtype in ("float16", "bfloat16"):
            data = smooth_data(self.shape()).astype(case.dtype)
            rois = self.random_rois(rng, degrees=degrees)
            return data, rois.astype(rois_dtypes_for(case.dtype)[0])
        return smooth_data(self.shape()), self.reference_rois(rng, degrees)

    def peer_inputs(self, case, rng):
        data = rng.standard_normal(self.shape()).astype("float32")
        return data, self.random_rois(rng)

    def degenerate(self, case, rng):
        data = smooth_data(self.shape())
        rois = self.random_rois(rng)
        zero_rows, peer_rows = self.degenerate_rows(rois, case.sampling_ratio)
        return data, rois, zero_rows, peer_rows, []

    def fuzz_boxes(self):
        raise NotImplementedError

    def fuzz_cases(self):
        """``(case, smooth data, rois)``: 4 boxes, one value maybe replaced by a special one."""
        layouts_ratios_attrs, box, special_value = self.fuzz_boxes()
        special = st.none() | st.tuples(st.integers(0, 3), st.integers(0, self.ROI_WIDTH - 1),
                                        special_value)
        return st.builds(self._fuzz_case, layouts_ratios_attrs,
                         st.lists(box, min_size=4, max_size=4), special)

    def _fuzz_case(self, case, boxes, special):
        rois = np.array(boxes, "float32")
        if special is not None:
            rois[special[0], special[1]] = special[2]
        return case, smooth_data(self.shape()), rois


class TestPSRoIAlign(_OneOpTester):
    """``relax.vision.ps_roi_align`` against torchvision's ``ps_roi_align`` and
    :func:`tvm_roialign.testing.ps_roi_align_ref`.

    torchvision divides by the grid size without ``max(., 1)``: an empty adaptive grid (a
    zero-size or inverted box) gives NaN there and 0 here (RoIAlign's contract), so such boxes are
    compared with the reference only."""

    N, C_OUT, H, W = 2, 4, 14, 18
    POOLED = (3, 2)
    C_IN = C_OUT * POOLED[0] * POOLED[1]
    K = 12
    PEER_CASES = _cases(("native", "llvm"), LAYOUTS, (2, -1))
    REFERENCE_CASES = (*_cases(("native",), LAYOUTS, (2, 0)),
                       *_cases(("native",), LAYOUTS, (-1,), dtypes=("float64",)),
                       *_cases(("native",), LAYOUTS, (2,), dtypes=("float16",)),
                       *_cases(("native", "llvm"), LAYOUTS, (2, -1), dtypes=("bfloat16",)))
    DEGENERATE_CASES = _cases(("native",), LAYOUTS, (2, -1))

    def make_op(self, data, rois, case):
        return tvm_roialign.ps_roi_align(data, rois, self.POOLED, spatial_scale=self.SCALE,
                                         sampling_ratio=case.sampling_ratio, layout=case.layout)

    def expected_fn(self, case, data, rois):
        return ps_roi_align_ref(data, rois, self.POOLED, self.SCALE, case.sampling_ratio)

    def peer_fn(self, case, data, rois):
        return torchvision.ops.ps_roi_align(torch.from_numpy(data), torch.from_numpy(rois),
                                            self.POOLED, self.SCALE, case.sampling_ratio).numpy()

    def random_rois(self, rng, degrees=False, dtype="float32"):
        """Boxes in image pixels (the map covers 56 x 72 at scale 0.25), some partly outside."""
        batch = rng.integers(0, self.N, self.K)
        corner = rng.uniform(-20, 70, (self.K, 2))
        size = rng.uniform(0.5, 40, (self.K, 2))
        return np.concatenate([batch[:, None], corner, corner + size], 1).astype(dtype)

    def degenerate_rows(self, rois, sampling_ratio):
        rois[0, 1:] = [40, 40, 40, 40]  # zero size
        rois[1, 1:] = [50, 50, 30, 20]  # inverted
        rois[2, 3] = np.nan
        rois[3, 1] = np.inf
        rois[4, 0] = self.N  # batch index past the end
        rois[5, 0] = -1
        rois[6, 0] = np.nan
        # torchvision is defined on the degenerate boxes with a static grid, and on the ordinary ones
        return list(range(2, 7)), [*([0, 1] if sampling_ratio > 0 else []), *range(7, len(rois))]

    def fuzz_boxes(self):
        coordinate = st.floats(-30, 90, allow_nan=False, width=32)
        box = st.tuples(st.integers(0, self.N - 1), coordinate, coordinate, coordinate, coordinate)
        cases = st.builds(lambda layout, sr: RoICase("native", layout, sr),
                          st.sampled_from(LAYOUTS), st.sampled_from([-1, 1, 2]))
        return cases, box, st.sampled_from([np.nan, np.inf, -np.inf, 5.0])

    def peer_defines(self, case, roi) -> bool:
        defined = 0 <= roi[0] < self.N and np.isfinite(roi).all()
        return bool(defined and (case.sampling_ratio > 0 or (roi[3] > roi[1] and roi[4] > roi[2])))


DETECTRON2 = (("angle_unit", "degrees"), ("clockwise", False), ("aligned", True))
MMCV_ALIGNED_CLOCKWISE = (("angle_unit", "radians"), ("clockwise", True), ("aligned", True))
MMCV_UNALIGNED = (("angle_unit", "radians"), ("clockwise", False), ("aligned", False))


class TestRoIAlignRotated(_OneOpTester):
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
        *_cases(("native",), LAYOUTS, (2, 0), [(("clockwise", False),), (("clockwise", True),)]),
        *_cases(("llvm",), LAYOUTS, (2, 0)),  # the TE path (native adaptive: the kernel)
    )
    REFERENCE_CASES = (
        *_cases(("native",), LAYOUTS, (2, -1), [DETECTRON2, MMCV_ALIGNED_CLOCKWISE, MMCV_UNALIGNED]),
        *_cases(("native",), LAYOUTS, (-1,), [DETECTRON2], dtypes=("float64",)),
        RoICase("native", "NHWC", 2, (), "float16"),
        *_cases(("native", "llvm"), LAYOUTS, (2, -1), [DETECTRON2], dtypes=("bfloat16",)),
    )
    DEGENERATE_CASES = _cases(("native",), LAYOUTS, (2, 0))

    def make_op(self, data, rois, case):
        attrs = {"aligned": True, "clockwise": False, "angle_unit": "radians", **dict(case.attrs)}
        return tvm_roialign.roi_align_rotated(data, rois, self.POOLED, spatial_scale=self.SCALE,
                                              sampling_ratio=case.sampling_ratio,
                                              layout=case.layout, **attrs)

    def expected_fn(self, case, data, rois):
        attrs = {"angle_unit": "radians", **dict(case.attrs)}
        return roi_align_rotated_ref(data, rois, self.POOLED, self.SCALE, case.sampling_ratio,
                                     **attrs)

    def peer_fn(self, case, data, rois):
        return openvino_roi_align_rotated(data, rois, self.POOLED, self.SCALE, case.sampling_ratio,
                                          case.get("clockwise", False))

    def random_rois(self, rng, degrees=False, dtype="float32"):
        """Rotated boxes in image pixels (the map covers 56 x 72 at scale 0.25), some partly
        outside; the first angles are 0, 90, 180, -90 and -45 degrees."""
        batch = rng.integers(0, self.N, self.K)
        centre = rng.uniform(-10, 80, (self.K, 2))
        size = rng.uniform(2, 60, (self.K, 2))
        angle = rng.uniform(-math.pi, math.pi, self.K)
        angle[:5] = np.array([0, 90, 180, -90, -45]) * math.pi / 180
        if degrees:
            angle = angle * 180 / math.pi
        return np.concatenate([batch[:, None], centre, size, angle[:, None]], 1).astype(dtype)

    def reference_rois(self, rng, degrees):
        rois = self.random_rois(rng, degrees=degrees)
        rois[5, 3:5] = [0.5, 2.0]  # below 1 after scaling: clamped unless aligned
        return rois

    def degenerate_rows(self, rois, sampling_ratio):
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

    def fuzz_boxes(self):
        coordinate = st.floats(-20, 90, allow_nan=False, width=32)
        size = st.floats(-5, 70, allow_nan=False, width=32)
        angle = st.one_of(st.sampled_from([0.0, math.pi / 2, math.pi, -math.pi / 2]),
                          st.floats(-7, 7, allow_nan=False, width=32))
        box = st.tuples(st.integers(0, self.N - 1), coordinate, coordinate, size, size, angle)
        cases = st.builds(lambda layout, sr, cw: RoICase("native", layout, sr, (("clockwise", cw),)),
                          st.sampled_from(LAYOUTS), st.sampled_from([0, 1, 2]), st.booleans())
        return cases, box, st.sampled_from([np.nan, np.inf, -np.inf, 7.0])

    def peer_defines(self, case, roi) -> bool:
        """OpenVINO's result is defined for finite rois, a batch index in [0, N), sizes >= 0."""
        return bool(0 <= roi[0] < self.N and np.isfinite(roi).all() and (roi[3:5] >= 0).all())

    def test_degrees_equal_radians(self):
        rng = np.random.default_rng(1)
        data = smooth_data(self.shape())
        rois = self.random_rois(rng, degrees=True)
        radians = rois.copy()
        radians[:, 5] = (rois[:, 5].astype("float64") * math.pi / 180).astype("float32")
        out_deg = self.run(RoICase("native", "NHWC", 2, (("angle_unit", "degrees"),)), data, rois)
        out_rad = self.run(RoICase("native", "NHWC", 2), data, radians)
        np.testing.assert_allclose(out_deg, out_rad, rtol=0, atol=FAMILY_TOL["peer"])


# === multiscale_roi_align ======================================================================

IMAGE = (200, 232)  # (height, width)
SCALES = (1 / 4, 1 / 8, 1 / 16, 1 / 32)


def _multiscale_attrs(pooled, aligned=False, levels=4):
    return (("pooled", pooled), ("aligned", aligned), ("levels", levels))


def _fpn_levels(rois, scales):
    """The FPN level of each roi (torchvision's ``LevelMapper``: canonical size 224 at level 4,
    in float32); NaN (a negative area) gives -1."""
    k_min, k_max = (round(-math.log2(s)) for s in (scales[0], scales[-1]))
    boxes = rois[:, 1:].astype("float32")
    with np.errstate(invalid="ignore", divide="ignore"):
        size = np.sqrt((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))
        level = np.floor(np.float32(4) + np.log2(size / np.float32(224)) + np.float32(1e-6))
    level = np.clip(level, k_min, k_max) - k_min
    return np.where(np.isnan(level), -1, level).astype(int)


class TestMultiscaleRoIAlign(RoIOpTester):
    """``relax.vision.multiscale_roi_align`` (through Relax; the GPU rule's loop nest unbound on
    the host) on four levels of a 200 x 232 image (sizes as a backbone gives them), boxes of 6 to
    700 pixels (below and above the level range), a zero-size box, a negative-area box (zeros) and
    a box with both sides reversed."""

    C = 8
    REFERENCE_CASES = (RoICase("relax", "NCHW", 2, _multiscale_attrs((7, 6))),
                       RoICase("relax", "NHWC", 0, _multiscale_attrs((3, 3), aligned=True)),
                       RoICase("relax", "NHWC", 2, _multiscale_attrs((7, 6)), "bfloat16"),
                       # (the PrimFunc paths pass aligned without half_pixel: stock meaning)
                       RoICase("gpu-unbound", "NCHW", 0, _multiscale_attrs((3, 3)), "bfloat16"))
    PEER_CASES = (
        *_cases(("relax",), LAYOUTS, (2,), [_multiscale_attrs((7, 6))]),
        RoICase("relax", "NCHW", 0, _multiscale_attrs((3, 3))),
        RoICase("relax", "NCHW", 2, _multiscale_attrs((4, 4), aligned=True)),
        RoICase("relax", "NCHW", 2, _multiscale_attrs((5, 5), levels=1)),
        *_cases(("gpu-unbound",), LAYOUTS, (2,), [_multiscale_attrs((3, 3))]),
    )
    DEGENERATE_CASES = (RoICase("relax", "NCHW", 2, _multiscale_attrs((2, 2))),
                        RoICase("relax", "NHWC", -1, _multiscale_attrs((3, 2), aligned=True)))
    FUZZ_EXAMPLES = 20

    def build(self, case, data_shape, num_rois):
        pooled, aligned, levels = case.get("pooled"), case.get("aligned"), case.get("levels")
        shapes = [_layout_shape(s, case.layout) for s in data_shape[:levels]]
        scales = list(SCALES[:levels])
        if case.path == "relax":
            run = relax_runner(
                lambda *args: tvm_roialign.multiscale_roi_align(
                    list(args[:-1]), args[-1], pooled, scales,
                    sampling_ratio=case.sampling_ratio, aligned=aligned, layout=case.layout),
                case.path, **{f"f{i}": (s, case.dtype) for i, s in enumerate(shapes)},
                rois=((num_rois, 5), rois_dtypes_for(case.dtype)[0]))
            return lambda features, rois: run(*features[:levels], rois)
        inputs = [*(te.placeholder(s, case.dtype, f"f{i}") for i, s in enumerate(shapes)),
                  te.placeholder((num_rois, 5), rois_dtypes_for(case.dtype)[0], "rois")]

        def compute(*args):
            return topi.multiscale_roi_align(list(args[:-1]), args[-1], pooled, scales,
                                             case.sampling_ratio, aligned, case.layout)

        prim = prim_runner(*PRIM_PATHS[case.path](compute, inputs, case.layout, None))
        out_shape = _out_shape(case.layout, num_rois, data_shape[0][1], pooled)
        return lambda features, rois: prim(*features[:levels], rois, out_shape)

    def transform_data(self, data, layout):
        return [to_layout(f, layout) for f in data]

    def other_data(self, data):
        return [f * 100 for f in data]

    def expected_fn(self, case, data, rois):
        """Each roi: :func:`roi_align_ref` on its level (zeros for a negative area)."""
        levels, aligned = case.get("levels"), case.get("aligned")
        level = _fpn_levels(rois, SCALES[:levels])
        out = np.zeros((len(rois), data[0].shape[1], *case.get("pooled")))
        for k, scale in enumerate(SCALES[:levels]):
            rows = np.nonzero(level == k)[0]
            out[rows] = roi_align_ref(data[k], rois[rows], case.get("pooled"), scale,
                                      case.sampling_ratio, aligned, half_pixel=aligned,
                                      coord_dtype="float32")
        return out

    def peer_fn(self, case, data, rois):
        """torchvision's ``MultiScaleRoIAlign``; with ``aligned``, its level mapping and
        ``roi_align(aligned=True)`` on each level."""
        levels, pooled = case.get("levels"), case.get("pooled")
        names = [str(i) for i in range(levels)]
        pooler = torchvision.ops.MultiScaleRoIAlign(names, pooled, case.sampling_ratio)
        features = OrderedDict((n, torch.from_numpy(f)) for n, f in zip(names, data))
        boxes = [torch.from_numpy(rois[rois[:, 0] == b, 1:]) for b in range(len(data[0]))]
        want = pooler(features, boxes, [IMAGE] * len(data[0])).numpy()
        assert [float(s) for s in pooler.scales] == list(SCALES[:levels])
        if not case.get("aligned"):
            return want
        level = pooler.map_levels(boxes).numpy()
        for k, scale in enumerate(SCALES[:levels]):
            rows = np.nonzero(level == k)[0]
            want[rows] = torchvision.ops.roi_align(
                features[str(k)], torch.from_numpy(rois[rows]), pooled, scale,
                case.sampling_ratio, True).numpy()
        return want

    def tolerance(self, case, check, tol):
        return (tol[case.dtype] if case.dtype == "bfloat16" else 0), tol[case.dtype]

    def features(self, rng, smooth=False):
        """Sizes as a backbone gives them: ceil-divided by two per level (odd sizes on the way)."""
        shapes, height, width = [], -(-IMAGE[0] // 4), -(-IMAGE[1] // 4)
        for _ in SCALES:
            shapes.append((2, self.C, height, width))
            height, width = -(-height // 2), -(-width // 2)
        if smooth:
            return [smooth_data(s) for s in shapes]
        return [rng.standard_normal(s).astype("float32") for s in shapes]

    @staticmethod
    def rois(rng):
        count = 24
        size = rng.permutation(np.geomspace(6, 700, count))
        aspect = rng.uniform(0.5, 2.0, count)
        x1 = rng.uniform(-20, IMAGE[1], count)
        y1 = rng.uniform(-20, IMAGE[0], count)
        boxes = np.stack([x1, y1, x1 + size * aspect, y1 + size / aspect], axis=1)
        extra = np.array([[30, 40, 30, 40], [50, 20, 40, 90], [120, 150, 20, 30]], np.float64)
        boxes = np.concatenate([boxes, extra]).astype(np.float32)
        batch = rng.integers(0, 2, len(boxes))
        order = np.argsort(batch, kind="stable")  # torchvision concatenates the images' boxes
        return np.concatenate([batch[order, None], boxes[order]], axis=1).astype(np.float32)

    def peer_inputs(self, case, rng):
        rng = np.random.default_rng(11)
        return self.features(rng), self.rois(rng)

    def reference_inputs(self, case, rng):
        return [f.astype(case.dtype) for f in self.features(rng, smooth=True)], self.rois(rng)

    def degenerate(self, case, rng):
        """``_degenerate.DEGENERATE_ROIS`` at level 0's scale (all on level 0)."""
        rois = (DEGENERATE_ROIS * np.array([1, 4, 4, 4, 4], "float32")).astype("float32")
        return self.features(rng), rois, ZERO_ROWS, [], SAMPLED_ROWS

    def fuzz_case(self, layout_ratio_aligned, boxes, special):
        layout, sampling_ratio, aligned = layout_ratio_aligned
        boxes = sorted(boxes, key=lambda b: b[0])
        rois = np.array([[b, x, y, x + w, y + h] for b, x, y, w, h in boxes], "float32")
        if special is not None:
            rois[special[0], special[1]] = special[2]
        case = RoICase("relax", layout, sampling_ratio, _multiscale_attrs((3, 3), aligned))
        return case, self.features(np.random.default_rng(0)), rois

    def fuzz_cases(self):
        """Boxes of any size over the image (negative sizes among them), one value maybe NaN or
        infinite."""
        coordinate = st.floats(-40, 260, allow_nan=False, width=32)
        size = st.one_of(st.floats(-30, 700, allow_nan=False, width=32),
                         st.sampled_from([0.0, 56.0, 112.0, 224.0, 448.0]))  # level boundaries
        box = st.tuples(st.integers(0, 1), coordinate, coordinate, size, size)
        special = st.none() | st.tuples(st.integers(0, 5), st.integers(0, 4),
                                        st.sampled_from(SPECIALS))
        grids = st.sampled_from([("NCHW", 2, False), ("NHWC", 0, True), ("NCHW", -1, True)])
        return st.builds(self.fuzz_case, grids, st.lists(box, min_size=6, max_size=6), special)

    def peer_defines(self, case, roi) -> bool:
        """torchvision's pooler takes finite boxes of images in order (no batch index)."""
        return bool(np.isfinite(roi).all())

    def test_rois_cover_every_level(self):
        rng = np.random.default_rng(11)
        self.features(rng)
        levels = _fpn_levels(self.rois(rng), SCALES)
        assert {0, 1, 2, 3} <= set(levels.tolist())
        assert (levels == -1).sum() == 1  # the negative-area box

    def test_negative_area_box_is_zero(self, rng):
        case = self.PEER_CASES[0]
        data, rois = self.peer_inputs(case, rng)
        got = self.run(case, data, rois)
        negative_area = np.nonzero((rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2]) < 0)[0]
        assert len(negative_area) == 1 and not got[negative_area].any()
