"""ATen ops that TVM's torch.export importer lacks or converts wrongly (tvm_roialign/frontend/_torch_ops.py):
each exported from PyTorch, imported, compiled and compared with eager PyTorch."""

from __future__ import annotations

import warnings

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


def _assert_imports_as_eager(fn, shape, seed: int, **import_options):
    """``fn`` (a function of x, or a module) exported, imported with ``import_options``, compiled
    and run: every output of eager PyTorch's shape and dtype, within 1e-5."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        expected = _flat(fn(x))
        module = fn if isinstance(fn, torch.nn.Module) else FunctionModule(fn)
        program = torch.export.export(module, (x,))
    got = compile_and_run(from_exported_program(program, **import_options), [x.numpy()])
    got = got if isinstance(got, list) else [got]
    assert len(got) == len(expected)
    for ours, ref in zip(got, expected):
        assert ours.shape == ref.shape and ours.dtype == ref.dtype, (ours.shape, ref.shape, ours.dtype)
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_equals_eager(name):
    _assert_imports_as_eager(*CASES[name], seed=0)


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


def _batch_norm(affine: bool) -> torch.nn.Module:
    """An eval-mode BatchNorm2d with running statistics far from 0 / 1, a momentum and an epsilon
    of its own: a converter that reads one argument for another, or normalizes by the batch's
    statistics, is off by far more than the tolerance."""
    bn = torch.nn.BatchNorm2d(4, eps=0.25, momentum=0.3, affine=affine)
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([3.0, -2.0, 0.5, 1.0]))
        bn.running_var.copy_(torch.tensor([4.0, 0.5, 9.0, 2.0]))
        if affine:
            bn.weight.copy_(torch.tensor([2.0, -1.0, 0.5, 3.0]))
            bn.bias.copy_(torch.tensor([0.1, 0.2, -0.3, 1.0]))
    return bn.eval()


#: name -> (function of x, x's shape), imported as exported (``run_ep_decomposition=False``, as
#: the detectors are): ops PyTorch's decompositions would otherwise have rewritten
UNDECOMPOSED_CASES = {
    "where_scalar_other": (lambda x: torch.where(x > 0, x, 2), (2, 3, 4)),
    "where_scalar_self": (lambda x: torch.where(x > 0, -1.5, x), (2, 3, 4)),
    "where_scalars": (lambda x: torch.where(x > 0, 1, 0.5), (2, 3, 4)),
    "where_int_tensor_float_scalar": (lambda x: torch.where(x > 0, (x * 4).int(), 0.5), (2, 3, 4)),
    "where_int_tensor_int_scalar": (lambda x: torch.where(x > 0, (x * 4).int(), 7), (2, 3, 4)),
    "meshgrid_ij": (lambda x: torch.meshgrid(x[0, 0], x[1, :, 1], indexing="ij"), (2, 3, 4)),
    "meshgrid_xy": (lambda x: torch.meshgrid(x[0, 0], x[1, :, 1], x[0, 1, :2], indexing="xy"), (2, 3, 4)),
    "stack_first": (lambda x: torch.stack([x, x * 2, -x]), (2, 3, 4)),
    "stack_last": (lambda x: torch.stack([x, x + 1], dim=-1), (2, 3, 4)),
    "stack_middle": (lambda x: torch.stack([x, x.exp()], dim=2), (2, 3, 4)),
    "batch_norm": (_batch_norm(True), (2, 4, 5, 5)),
    "batch_norm_no_affine": (_batch_norm(False), (2, 4, 5, 5)),
}


@pytest.mark.parametrize("name", sorted(UNDECOMPOSED_CASES))
def test_undecomposed_op_equals_eager(name):
    _assert_imports_as_eager(*UNDECOMPOSED_CASES[name], seed=1, run_ep_decomposition=False)


def test_batch_norm_in_training_mode_is_refused():
    bn = torch.nn.BatchNorm2d(4).train()
    program = torch.export.export(bn, (torch.randn(2, 4, 3, 3),))
    with pytest.raises(ValueError, match="training=True"):
        from_exported_program(program, run_ep_decomposition=False)


@pytest.mark.parametrize("op", ["stack", "meshgrid"])
def test_undecomposed_stack_and_meshgrid_move_to_nhwc(op):
    """A convolution's output stacked (or a meshgrid of it) converts to NHWC without the warning
    of a failed conversion (Relax's ConvertLayout fails on relax.stack, so stack imports as
    expand_dims + concat), and the result equals eager PyTorch's."""
    from tvm_roialign.pipeline import build
    from tvm_roialign.target import parse_target
    from tvm_roialign.testing import run_first

    conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def fn(x):
        y = conv(x)
        if op == "stack":
            return torch.stack([y, y.relu()], dim=-1)
        rows, cols = torch.meshgrid(y[0, 0, :, 0], y[0, 0, 0, :], indexing="ij")
        return y + rows * cols

    x = torch.randn(1, 3, 6, 7, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = fn(x).numpy()
        program = torch.export.export(FunctionModule(fn), (x,))
    mod = from_exported_program(program, run_ep_decomposition=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = build(mod, parse_target("llvm"), layout="NHWC")
    assert not [w for w in caught if "layout conversion" in str(w.message)], [str(w.message) for w in caught]
    np.testing.assert_allclose(run_first(built.executable, x.numpy()), expected, rtol=1e-4, atol=1e-4)
