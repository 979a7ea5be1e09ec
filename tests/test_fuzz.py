"""Fuzz (bounded, derandomized): spatial_scale x torchvision's aligned x sampling_ratio x layout x a
NaN / infinity at any position of any roi, against torchvision where torchvision returns and the
float64 reference everywhere.

torchvision's result is only defined for a roi with finite coordinates and a batch index in
``[0, N)`` (it casts a NaN coordinate to int and indexes the map with it, and reads any batch
index it is given), so it is compared on those rois only, one at a time (it raises for an
inverted box with ``aligned=True`` and an adaptive grid, whose grid size is negative); every roi
is compared with the reference
(whose geometry is rounded in float32 as the kernels', so that samples exactly on a boundary fall
on the same side), and a roi with a non-finite value must be a row of zeros.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torchvision
import tvm
from _targets import GENERIC as HOST
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

from tvm_roialign.testing import build_roi_align_module, roi_align_ref, run_roi_align_vm

N, C, H, W = 2, 4, 12, 14
NUM_ROIS = 6
POOLED = (3, 2)
SCALES = (1.0, 0.5, 0.25, 0.3, 0.6, 0.7, 1 / 3)
SPECIALS = (float("nan"), float("inf"), float("-inf"))


@functools.cache
def _vm(scale, aligned, sampling_ratio, layout):
    shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
    mod = build_roi_align_module(shape, NUM_ROIS, POOLED, scale, sampling_ratio, aligned, layout,
                                 torchvision_aligned=True)
    return relax.VirtualMachine(tvm.compile(mod, target=HOST), tvm.cpu())


@functools.cache
def _data():
    return np.random.default_rng(0).standard_normal((N, C, H, W)).astype("float32")


coordinate = st.one_of(
    st.integers(-4, 18).map(float),  # integer boxes: samples on pixel and bin boundaries
    st.floats(-4, 18, allow_nan=False, width=32),
)
roi = st.tuples(st.integers(0, N), coordinate, coordinate, coordinate, coordinate)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    scale=st.sampled_from(SCALES),
    aligned=st.booleans(),
    sampling_ratio=st.sampled_from([-1, 0, 1, 2]),
    layout=st.sampled_from(["NCHW", "NHWC"]),
    boxes=st.lists(roi, min_size=NUM_ROIS, max_size=NUM_ROIS),
    special=st.none() | st.tuples(st.integers(0, NUM_ROIS - 1), st.integers(0, 4),
                                  st.sampled_from(SPECIALS)),
)
@example(scale=0.6, aligned=True, sampling_ratio=-1, layout="NCHW",
         boxes=[(0, 0.0, 0.0, 10.0 / 0.6, 10.0 / 0.6)] * NUM_ROIS, special=(1, 3, float("nan")))
@example(scale=1.0, aligned=False, sampling_ratio=2, layout="NHWC",
         boxes=[(0, 1.0, 1.0, 6.0, 5.0)] * NUM_ROIS, special=(0, 3, float("nan")))
@example(scale=0.7, aligned=True, sampling_ratio=0, layout="NHWC",
         boxes=[(1, 3.0, 2.0, 17.0, 11.0)] * NUM_ROIS, special=(2, 4, float("-inf")))
@example(scale=0.5, aligned=False, sampling_ratio=-1, layout="NCHW",  # samples on y == -1
         boxes=[(0, 0.0, -2.0, 0.0, 0.0)] * NUM_ROIS, special=None)
def test_fuzz(scale, aligned, sampling_ratio, layout, boxes, special, tol):
    rois = np.array(boxes, "float32") / np.array([1, scale, scale, scale, scale], "float32")
    rois[:, 0] = [b[0] for b in boxes]
    if special is not None:
        row, column, value = special
        rois[row, column] = value
    rois = rois.astype("float32")
    data = _data()
    got = run_roi_align_vm(_vm(scale, aligned, sampling_ratio, layout), data, rois, layout)

    finite = np.isfinite(rois).all(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        want = roi_align_ref(data, rois, POOLED, scale, sampling_ratio, aligned,
                             half_pixel=aligned, coord_dtype="float32")
    np.testing.assert_allclose(got, want, rtol=tol["float32"], atol=tol["float32"])
    assert not got[~finite].any()

    defined = finite & (rois[:, 0] >= 0) & (rois[:, 0] < N)
    for k in np.nonzero(defined)[0]:
        try:  # an inverted box with aligned=True and an adaptive grid: a negative grid size
            theirs = torchvision.ops.roi_align(
                torch.from_numpy(data), torch.from_numpy(rois[k:k + 1]), POOLED, scale,
                sampling_ratio, aligned).numpy()
        except (RuntimeError, ValueError):
            continue
        np.testing.assert_allclose(got[k:k + 1], theirs, rtol=tol["float32"], atol=tol["float32"])
