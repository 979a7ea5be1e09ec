"""An outside check: the forward cases of torchvision's own RoIAlign test design, run against
tvm-roialign's op in both layouts.

torchvision tests RoIAlign forward on a small random map (2 images, 50 channels, 10 x 10), four
integer boxes (one on the second image), a 5 x 5 output, ``spatial_scale=1`` and an adaptive grid,
for float16 / float32 / float64, contiguous and non-contiguous (H and W swapped by a permute)
inputs, ``aligned`` both ways, against a naive float64 expectation; it checks the output dtype,
that a repeated run is identical, that rois of the wrong shape are refused, boxes given as a list
of per-image tensors, and many random integer boxes. This module does the same against our op
(written from that design, with an expectation function of its own) and against torchvision.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
import torchvision
import tvm
from _targets import GENERIC as HOST
from tvm import relax

from tvm_roialign.frontend import from_exported_program
from tvm_roialign.testing import (
    build_roi_align_module,
    compile_and_run,
    run_roi_align_vm,
)

POOLED = 5
CHANNELS = 2 * POOLED**2
BOXES = [[0, 0, 0, 9, 9], [0, 0, 5, 4, 9], [0, 5, 5, 9, 9], [1, 0, 0, 9, 9]]
LAYOUTS = ("NCHW", "NHWC")


def expected_roi_align(data, rois, pooled, spatial_scale, sampling_ratio, aligned):
    """Naive float64 RoIAlign: each sample is interpolated from its (up to) four neighbours that
    lie on the map; a sample within one pixel outside the map is snapped onto its border row or
    column, one further out contributes nothing. No clamp of the roi size (torchvision's own
    expectation has none either; every box here is at least 4 pixels)."""
    data = np.asarray(data, np.float64)
    num_rois, channels = len(rois), data.shape[1]
    height, width = data.shape[2:]
    out = np.zeros((num_rois, channels, pooled, pooled))
    shift = 0.5 if aligned else 0.0

    def snap(v, size):
        if -1 < v <= 0:
            return 0.0
        if size - 1 <= v < size:
            return float(size - 1)
        return v

    def interpolate(plane, y, x):
        y, x = snap(y, height), snap(x, width)
        y0, x0 = math.floor(y), math.floor(x)
        total = 0.0
        for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
            for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
                if 0 <= yy < height and 0 <= xx < width:
                    total += wy * wx * plane[:, yy, xx]
        return total

    for r, (batch, x1, y1, x2, y2) in enumerate(np.asarray(rois, np.float64)):
        x1, y1, x2, y2 = (v * spatial_scale - shift for v in (x1, y1, x2, y2))
        bin_h, bin_w = (y2 - y1) / pooled, (x2 - x1) / pooled
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(bin_h)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(bin_w)
        plane = data[int(batch)]
        for i in range(pooled):
            for j in range(pooled):
                acc = 0.0
                for iy in range(grid_h):
                    y = y1 + i * bin_h + (iy + 0.5) * bin_h / grid_h
                    for ix in range(grid_w):
                        x = x1 + j * bin_w + (ix + 0.5) * bin_w / grid_w
                        acc = acc + interpolate(plane, y, x)
                out[r, :, i, j] = acc / (grid_h * grid_w)
    return out


def _input(dtype, contiguous, seed=0):
    """torchvision's map: rand(2, 50, 10, 10); non-contiguous = the same with H and W swapped."""
    x = torch.rand(2, CHANNELS, 10, 10, generator=torch.Generator().manual_seed(seed),
                   dtype=torch.float64).to(getattr(torch, dtype))
    return x if contiguous else x.permute(0, 1, 3, 2)


#: one xdist worker runs this module (`--dist loadgroup`): a build of :func:`_vm` serves several
#: tests (test_forward's contiguous and permuted maps, the repeated runs), which two workers built
#: twice
pytestmark = pytest.mark.xdist_group("torchvision_design")


@functools.cache
def _vm(shape, num_rois, aligned, layout, dtype, sampling_ratio=-1, pooled=POOLED):
    mod = build_roi_align_module(shape, num_rois, pooled, 1.0, sampling_ratio, aligned, layout,
                                 "avg", dtype, torchvision_aligned=True)
    return relax.VirtualMachine(tvm.compile(mod, target=HOST), tvm.cpu())


def _ours(x, rois, aligned, layout, sampling_ratio=-1, pooled=POOLED):
    """Our op on the logical values of ``x`` (NCHW), given in ``layout``; NCHW result."""
    data = x.contiguous().numpy()
    shape = data.shape if layout == "NCHW" else (data.shape[0], *data.shape[2:], data.shape[1])
    vm = _vm(shape, len(rois), aligned, layout, str(data.dtype), sampling_ratio, pooled)
    return run_roi_align_vm(vm, data, np.asarray(rois, data.dtype), layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_forward(dtype, contiguous, aligned, layout, tol):
    x = _input(dtype, contiguous)
    rois = np.array(BOXES, dtype)
    got = _ours(x, rois, aligned, layout)
    assert got.dtype == np.dtype(dtype)  # the output keeps the input dtype
    want = expected_roi_align(x.double().numpy(), rois, POOLED, 1.0, -1, aligned)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol[dtype], atol=tol[dtype])
    theirs = torchvision.ops.roi_align(x, torch.from_numpy(rois), POOLED, 1.0, -1, aligned)
    np.testing.assert_allclose(got.astype(np.float64), theirs.double().numpy(),
                               rtol=tol[dtype], atol=tol[dtype])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_repeated_runs_are_identical(layout):
    """torchvision's deterministic runs: two calls give the same bits, also with another call in
    between that leaves different values in the memory the runtime reuses."""
    x = _input("float32", True)
    rois = np.array(BOXES, "float32")
    first = _ours(x, rois, True, layout)
    _ours(x * 7.0 - 3.0, rois, True, layout)
    np.testing.assert_array_equal(first, _ours(x, rois, True, layout))


@pytest.mark.parametrize("shape", [(1, 4), (1, 3)])
def test_rois_of_the_wrong_shape_are_refused(shape):
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType([1, 1, 8, 8], "float32"))
    rois = relax.Var("rois", relax.TensorType(list(shape), "float32"))
    with pytest.raises(ValueError, match=r"\[K, 5\]"), bb.function("main", [data, rois]):
        bb.emit(relax.op.vision.roi_align(data, rois, (2, 2), 1.0))


def test_rois_dtype_must_match():
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType([1, 1, 8, 8], "float32"))
    rois = relax.Var("rois", relax.TensorType([2, 5], "float16"))
    with pytest.raises(TypeError, match="rois dtype"), bb.function("main", [data, rois]):
        bb.emit(relax.op.vision.roi_align(data, rois, (2, 2), 1.0))


@pytest.mark.parametrize("aligned", [False, True])
def test_boxes_as_a_list_through_torch_export(aligned, tol):
    """Boxes as a list of per-image [L, 4] tensors (torchvision converts them to [K, 5]), on a
    non-contiguous map, through the torch.export importer."""

    class Model(torch.nn.Module):
        def forward(self, x, b0, b1):
            return torchvision.ops.roi_align(x.permute(0, 1, 3, 2), [b0, b1], (3, 3), 1.0, -1,
                                             aligned)

    x = _input("float32", True)
    b0 = torch.tensor([[0, 0, 9, 9], [0, 5, 4, 9.0]])
    b1 = torch.tensor([[5, 5, 9, 9], [0, 0, 9, 9.0], [1, 2, 3, 4.0]])
    want = Model()(x, b0, b1).numpy()
    mod = from_exported_program(torch.export.export(Model(), (x, b0, b1)))
    got = compile_and_run(mod, [x.numpy(), b0.numpy(), b1.numpy()])
    np.testing.assert_allclose(got[0] if isinstance(got, list) else got, want,
                               rtol=tol["float32"], atol=tol["float32"])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("aligned", [False, True])
def test_many_random_integer_boxes(layout, aligned, tol):
    """torchvision's quantization test boxes: 1000 integer boxes (origin in [0, 5), size in
    [0, 5)) on two 10 x 10 images, some of zero size."""
    g = torch.Generator().manual_seed(0)
    rois = torch.randint(0, 5, (1000, 5), generator=g).float()
    rois[:, 0] = torch.randint(0, 2, (1000,), generator=g).float()
    rois[:, 3:] += rois[:, 1:3]
    x = torch.randint(50, 100, (2, 2, 10, 10), generator=g).float()
    got = _ours(x, rois.numpy(), aligned, layout)
    want = torchvision.ops.roi_align(x, rois, POOLED, 1.0, -1, aligned).numpy()
    np.testing.assert_allclose(got, want, rtol=tol["float32"], atol=tol["float32"])
