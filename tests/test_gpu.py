"""RoIAlign on a CUDA GPU against torchvision's CUDA kernel (skipped without a CUDA device).

* float32 and float16, both layouts (NHWC compared through a permute), fixed and adaptive sampling
  grids, torchvision's ``aligned`` both ways. torchvision computes float16 rois in float16 (box
  coordinates and sample positions rounded to float16: on random data its float16 result differs
  from its own float32 result by up to ~1), while ours computes in float32 for float16 data; so
  float16 is compared with torchvision run in float32 on the same float16-valued inputs, to within
  one float16 rounding of the result;
* one case with more than ``2**31`` output elements (172 000 rois x 256 channels x 7 x 7, float16,
  4.3 GB): ours is compared with torchvision chunk by chunk (each chunk is below torchvision's own
  32-bit limit), including the rois whose outputs straddle element ``2**31``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_roialign.testing import build_roi_align_module, roi_align_ref

torch = pytest.importorskip("torch")
tv_ops = pytest.importorskip("torchvision.ops")


def _cuda_available() -> bool:
    try:
        return bool(tvm.cuda(0).exist) and torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a TVM or torch built without CUDA
        return False


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU (TVM and torch)"),
]

SCALE = 0.25
POOLED = (7, 7)


def cuda_target():
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    return tvm.target.Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})


@functools.cache
def compiled(data_shape, num_rois, sampling_ratio, aligned, layout, dtype):
    mod = build_roi_align_module(data_shape, num_rois, POOLED, SCALE, sampling_ratio, aligned,
                                 layout, "avg", dtype, torchvision_aligned=True)
    return relax.VirtualMachine(tvm.compile(mod, target=cuda_target()), tvm.cuda(0))


def to_tvm(tensor):
    return tvm.runtime.from_dlpack(tensor.contiguous())


def to_torch(tensor):
    return torch.from_dlpack(tensor)


def make_rois(num_rois, batch, height, width, dtype, seed=0):
    """Boxes in input-image pixels (feature map / SCALE), some partly outside the image."""
    gen = torch.Generator().manual_seed(seed)
    img_h, img_w = height / SCALE, width / SCALE
    xy = torch.rand(num_rois, 2, generator=gen) * torch.tensor([img_w, img_h]) - 16
    wh = torch.rand(num_rois, 2, generator=gen) * torch.tensor([img_w, img_h]) / 3 + 1
    idx = torch.randint(0, batch, (num_rois, 1), generator=gen).float()
    return torch.cat([idx, xy, xy + wh], dim=1).to(dtype).cuda()


def run_ours(vm, data_nchw, rois, layout):
    data = data_nchw if layout == "NCHW" else data_nchw.permute(0, 2, 3, 1)
    out = to_torch(vm["main"](to_tvm(data), to_tvm(rois)))
    return out if layout == "NCHW" else out.permute(0, 3, 1, 2)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("sampling_ratio, aligned", [(2, False), (0, True)])
def test_matches_torchvision_cuda(dtype, layout, sampling_ratio, aligned):
    n, c, h, w, k = 2, 64, 50, 68, 300
    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(1)
    data = torch.randn(n, c, h, w, generator=gen).to(torch_dtype).cuda()
    rois = make_rois(k, n, h, w, torch_dtype)
    shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    vm = compiled(shape, k, sampling_ratio, aligned, layout, dtype)
    got = run_ours(vm, data, rois, layout)
    expected = tv_ops.roi_align(data.float(), rois.float(), POOLED, SCALE, sampling_ratio, aligned)
    assert got.dtype == data.dtype
    tol = 1e-4 if dtype == "float32" else 4e-3  # float16: one rounding of values up to ~4
    torch.testing.assert_close(got.float(), expected, rtol=tol, atol=tol)
    # and the float64 reference on a few rois (torchvision itself is not the definition)
    few = slice(0, 20)
    ref = roi_align_ref(data.double().cpu().numpy(), rois[few].double().cpu().numpy(), POOLED,
                        SCALE, sampling_ratio, aligned, "NCHW", half_pixel=aligned)
    np.testing.assert_allclose(got[few].double().cpu().numpy(), ref, rtol=tol, atol=tol)


def test_more_than_2_pow_31_outputs():
    """172 000 rois x 256 x 7 x 7 = 2 157 568 000 > 2**31 - 1 output elements (float16, 4.3 GB),
    compared chunk by chunk with torchvision in float32 (each chunk below its 32-bit limit)."""
    n, c, h, w, k = 1, 256, 50, 68, 172_000
    assert k * c * POOLED[0] * POOLED[1] > 2**31 - 1
    gen = torch.Generator().manual_seed(2)
    data = torch.randn(n, c, h, w, generator=gen).half().cuda()
    rois = make_rois(k, n, h, w, torch.float16, seed=3)
    vm = compiled((n, c, h, w), k, 2, False, "NCHW", "float16")
    got = run_ours(vm, data, rois, "NCHW")
    assert tuple(got.shape) == (k, c, *POOLED)
    per_roi = c * POOLED[0] * POOLED[1]
    straddle = (2**31) // per_roi  # the roi whose outputs contain element 2**31
    chunk = 20_000  # 20 000 x 12 544 < 2**31: within torchvision's limit
    for start in sorted({*range(0, k, chunk), straddle - chunk // 2}):
        part = slice(start, min(start + chunk, k))
        expected = tv_ops.roi_align(data.float(), rois[part].float(), POOLED, SCALE, 2, False)
        torch.testing.assert_close(got[part].float(), expected, rtol=4e-3, atol=4e-3)
    del got
    torch.cuda.empty_cache()
