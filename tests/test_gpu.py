"""RoIAlign on a CUDA GPU against torchvision's CUDA kernel (skipped without a CUDA device).

The shared cases on CUDA are the ``cuda`` path of ``test_roi_family.py``. Here: one case with more than
``2**31`` output elements (172 000 rois x 256 channels x 7 x 7, float16, 4.3 GB), compared with
torchvision's CUDA kernel in float32 on the same float16-valued inputs (ours accumulates float16 in
float32; torchvision's float16 kernel rounds coordinates to float16) chunk by chunk (each chunk
below torchvision's own 32-bit limit), including the rois whose outputs straddle element ``2**31``.
"""

from __future__ import annotations

import functools

import pytest
import tvm
from tvm import relax

from tvm_roialign.testing import build_roi_align_module

torch = pytest.importorskip("torch")
tv_ops = pytest.importorskip("torchvision.ops")


pytestmark = pytest.mark.cuda  # skipped without a CUDA GPU (conftest.py)

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


def test_more_than_2_pow_31_outputs(tol):
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
        torch.testing.assert_close(got[part].float(), expected, rtol=tol["float16"],
                                   atol=tol["float16"])
    del got
    torch.cuda.empty_cache()
