"""ATen ops that TVM's torch.export importer lacks or converts wrongly (tvm_roialign/frontend/_torch_ops.py):
each exported from PyTorch, imported, compiled and compared with eager PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _functions import FunctionModule

from tvm_roialign.frontend import from_exported_program
from tvm_roialign.testing import compile_and_run

GRID = torch.linspace(-1.2, 1.1, 2 * 3 * 4).reshape(1, 3, 4, 2)

#: name -> (function of x, x's shape); x is random normal, except where the name says otherwise
CASES = {
    "amax": (lambda x: torch.amax(x, dim=(2, 3), keepdim=True), (1, 4, 6, 6)),
    "amin_all": (lambda x: torch.amin(x), (1, 4, 6, 6)),
    "logsumexp": (lambda x: torch.logsumexp(x, dim=1), (1, 4, 6, 6)),
    "min_dim": (lambda x: torch.min(x, dim=2), (1, 4, 6, 6)),
    "prod_dim": (lambda x: torch.prod(x, dim=1), (1, 4, 6, 6)),
    "var_mean": (lambda x: torch.var_mean(x, dim=(1, 2)), (2, 4, 6, 6)),
    "var_mean_no_correction": (lambda x: torch.var_mean(x, dim=1, correction=0, keepdim=True), (1, 4, 6, 6)),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, (3, 4), return_indices=True), (1, 4, 7, 9)),
    "adaptive_max_pool2d_ties": (
        lambda x: F.adaptive_max_pool2d(x.round(), 2, return_indices=True), (1, 2, 5, 5)
    ),
    "unfold": (lambda x: F.unfold(x, (3, 2), dilation=(1, 2), padding=1, stride=2), (2, 3, 7, 8)),
    "grid_sample": (lambda x: F.grid_sample(x, GRID, align_corners=False), (1, 4, 6, 6)),
    "grid_sample_nearest_border": (
        lambda x: F.grid_sample(x, GRID, mode="nearest", padding_mode="border", align_corners=True),
        (1, 4, 6, 6),
    ),
    "group_norm_no_affine": (lambda x: F.group_norm(x, 2), (1, 4, 6, 6)),
    "group_norm": (lambda x: F.group_norm(x, 2, torch.arange(4.0), torch.ones(4)), (1, 4, 6, 6)),
}



def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out.detach().numpy()]
    return [t.detach().numpy() for t in out]


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_equals_eager(name):
    fn, shape = CASES[name]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    expected = _flat(fn(x))
    mod = from_exported_program(torch.export.export(FunctionModule(fn), (x,)))
    got = compile_and_run(mod, [x.numpy()])
    got = got if isinstance(got, list) else [got]
    assert len(got) == len(expected)
    for ours, ref in zip(got, expected):
        assert ours.shape == ref.shape and ours.dtype == ref.dtype, (ours.shape, ref.shape, ours.dtype)
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_adaptive_max_pool2d_of_nan_and_minus_infinity_equals_eager():
    """A window of -inf gives -inf at its first position; a NaN wins its window."""
    x = torch.full((1, 1, 4, 4), -torch.inf)
    x[0, 0, 3, 3] = torch.nan
    fn = CASES["adaptive_max_pool2d"][0]
    values, indices = fn(x)
    mod = from_exported_program(torch.export.export(FunctionModule(fn), (x,)))
    ours, ours_indices = compile_and_run(mod, [x.numpy()])
    np.testing.assert_array_equal(ours, values.numpy())
    np.testing.assert_array_equal(ours_indices[~np.isnan(ours)], indices.numpy()[~np.isnan(ours)])
