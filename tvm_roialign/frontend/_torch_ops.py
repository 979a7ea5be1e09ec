"""Converters for ATen ops that TVM's ``torch.export`` importer lacks or converts wrongly.

Lacking: ``amax``, ``amin``, ``min.dim``, ``prod.dim_int``, ``var_mean``, ``adaptive_max_pool2d``, and
``where`` with a scalar branch (``where.ScalarOther`` / ``ScalarSelf`` / ``Scalar``: a program
imported without PyTorch's decompositions keeps them).
Wrong: ``grid_sampler_2d`` (the grid is PyTorch's ``[N, H, W, 2]``, TVM's kernel reads ``[N, 2, H,
W]``: the stock converter passes it unchanged and the output has the wrong shape), ``im2col``
(``F.unfold``; the stock converter fails for every kernel size but 1), ``batch_norm.default`` (what a
program imported without PyTorch's decompositions holds for ``nn.BatchNorm2d``: the stock
converter reads its ``training`` flag as the momentum and its momentum as epsilon, and normalizes
by the batch's statistics: an eval-mode program imports as a training-mode one), ``group_norm`` without an
affine weight (the stock converter builds a call with a null argument and TVM aborts), ``stack`` (the
stock ``relax.stack`` fails Relax's ``ConvertLayout``, whose layout rule for it indexes out of range:
here an ``expand_dims`` of each input and a ``concat``, as PyTorch's decomposition makes it).

Each converter takes ``(node, importer)``, as ``from_exported_program``'s ``custom_convert_map``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from tvm import relax, te, tirx

#: ops converted whole, kept out of PyTorch's decompositions
UNDECOMPOSED = ("im2col.default", "group_norm.default")


def _arg(node, index, name, default):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _axes(importer, node, x, index=1):
    """The reduced axes of a reduction node (every axis for none or an empty list)."""
    dims = _arg(node, index, "dim", None)
    rank = len(importer.shape_of(x))
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return list(range(rank))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return [d % rank for d in dims]


def _reduce(op):
    def convert(node, importer):
        x = importer.env[node.args[0]]
        axes = _axes(importer, node, x)
        keepdim = bool(_arg(node, 2, "keepdim", False))
        return importer.block_builder.emit(op(x, axis=axes, keepdims=keepdim))

    return convert


def _min_dim(node, importer):
    """``aten.min.dim`` -> ``(values, indices)``."""
    x = importer.env[node.args[0]]
    axis = _axes(importer, node, x)[0]
    keepdim = bool(_arg(node, 2, "keepdim", False))
    bb = importer.block_builder
    values = bb.emit(relax.op.min(x, axis=[axis], keepdims=keepdim))
    indices = bb.emit(relax.op.argmin(x, axis=axis, keepdims=keepdim))
    return bb.emit(relax.Tuple([values, indices]))


def _where_scalar(node, importer):
    """``aten.where.ScalarOther`` / ``ScalarSelf`` / ``Scalar``: ``where(condition, a, b)`` with a
    Python scalar for one branch or both, in the dtype PyTorch gives the result
    (``torch.result_type``: the tensor's dtype, unless a float scalar meets an integer or bool
    tensor)."""
    condition = importer.env[node.args[0]]
    branches = [importer.env[a] if isinstance(a, torch.fx.Node) else a for a in node.args[1:3]]
    # each branch as PyTorch sees it when it promotes: a 0-d tensor of its dtype, or the scalar
    seen = [
        torch.empty((), dtype=getattr(torch, str(b.ty.dtype))) if isinstance(b, relax.Expr) else b
        for b in branches
    ]
    dtype = str(torch.result_type(*seen)).removeprefix("torch.")
    values = [
        (b if str(b.ty.dtype) == dtype else relax.op.astype(b, dtype))
        if isinstance(b, relax.Expr) else relax.const(b, dtype)
        for b in branches
    ]
    return importer.block_builder.emit(relax.op.where(condition, *values))


def _stack(node, importer):
    """``aten.stack.default``: each input given the new axis (``expand_dims``), then ``concat``."""
    bb = importer.block_builder
    inputs = [importer.env[t] for t in node.args[0]]
    rank = len(importer.shape_of(inputs[0])) + 1
    axis = _arg(node, 1, "dim", 0)
    if not -rank <= axis < rank:
        raise ValueError(f"stack dim must be in [{-rank}, {rank}), got {axis}")
    axis %= rank
    return bb.emit(relax.op.concat([relax.op.expand_dims(x, axis) for x in inputs], axis=axis))


def _batch_norm(node, importer):
    """``aten.batch_norm.default(input, weight, bias, running_mean, running_var, training,
    momentum, eps, cudnn_enabled)`` in inference: normalized by the running statistics (a
    training-mode batch norm, which normalizes by the batch's own and updates the running ones,
    is refused: the importer makes inference programs)."""
    x = importer.env[node.args[0]]
    training = bool(_arg(node, 5, "training", False))
    if training:
        raise ValueError("batch_norm with training=True: export the model in eval mode (model.eval())")
    channels = int(importer.shape_of(x)[1])
    dtype = str(x.ty.dtype)
    eps = float(_arg(node, 7, "eps", 1e-5))

    def operand(index, fill):
        arg = node.args[index] if len(node.args) > index else None
        return importer.env[arg] if arg is not None else relax.const(np.full(channels, fill, dtype))

    bb = importer.block_builder
    result = bb.emit(relax.op.nn.batch_norm(
        x, operand(1, 1.0), operand(2, 0.0), operand(3, 0.0), operand(4, 1.0), axis=1, epsilon=eps,
        center=node.args[2] is not None, scale=node.args[1] is not None, training=False,
    ))
    return bb.emit(relax.TupleGetItem(result, 0))


def _var_mean(node, importer):
    """``aten.var_mean.dim`` / ``.correction`` -> ``(variance, mean)``, the variance divided by
    ``count - correction`` (1 unless given, as PyTorch)."""
    x = importer.env[node.args[0]]
    axes = _axes(importer, node, x)
    keepdim = bool(node.kwargs.get("keepdim", _arg(node, 3, "keepdim", False)))
    correction = node.kwargs.get("correction", 1)
    unbiased = node.kwargs.get("unbiased")
    if unbiased is not None:
        correction = 1 if unbiased else 0
    shape = importer.shape_of(x)
    count = math.prod(int(shape[a]) for a in axes)
    bb = importer.block_builder
    mean = bb.emit(relax.op.mean(x, axis=axes, keepdims=True))
    centred = bb.emit(relax.op.subtract(x, mean))
    squares = bb.emit(relax.op.sum(relax.op.multiply(centred, centred), axis=axes, keepdims=keepdim))
    divisor = relax.const(max(count - float(correction), 0.0), x.ty.dtype)
    variance = bb.emit(relax.op.divide(squares, divisor))
    if not keepdim:
        mean = bb.emit(relax.op.squeeze(mean, axis=axes))
    return bb.emit(relax.Tuple([variance, mean]))


def _grid_sampler_2d(node, importer):
    """``aten.grid_sampler_2d``: PyTorch's ``[N, H, W, 2]`` grid transposed to TVM's ``[N, 2, H, W]``."""
    args = importer.retrieve_args(node)
    data, grid = args[0], args[1]
    method = {0: "bilinear", 1: "nearest", 2: "bicubic"}[int(args[2]) if len(args) > 2 else 0]
    padding = {0: "zeros", 1: "border", 2: "reflection"}[int(args[3]) if len(args) > 3 else 0]
    align_corners = bool(args[4]) if len(args) > 4 else False
    bb = importer.block_builder
    grid = bb.emit(relax.op.permute_dims(grid, [0, 3, 1, 2]))
    return bb.emit(relax.op.image.grid_sample(
        data, grid, method=method, layout="NCHW", padding_mode=padding, align_corners=align_corners
    ))


def _group_norm(node, importer):
    """``aten.group_norm(x, groups, weight, bias, eps, cudnn)``, a missing weight or bias taken as
    ones or zeros."""
    x = importer.env[node.args[0]]
    groups = int(node.args[1])
    weight = importer.env.get(node.args[2]) if len(node.args) > 2 and node.args[2] is not None else None
    bias = importer.env.get(node.args[3]) if len(node.args) > 3 and node.args[3] is not None else None
    eps = float(node.args[4]) if len(node.args) > 4 else 1e-5
    shape = importer.shape_of(x)
    channels, dtype = int(shape[1]), str(x.ty.dtype)
    if weight is None:
        weight = relax.const(np.ones(channels, dtype))
    if bias is None:
        bias = relax.const(np.zeros(channels, dtype))
    return importer.block_builder.emit(relax.op.nn.group_norm(
        x, weight, bias, num_groups=groups, channel_axis=1, axes=list(range(2, len(shape))),
        epsilon=eps,
    ))


def _im2col(node, importer):
    """``aten.im2col(x, kernel, dilation, padding, stride)`` (``F.unfold``) -> ``[N, C*kh*kw, L]``."""
    x = importer.env[node.args[0]]
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (tuple(int(v) for v in a) for a in node.args[1:5])
    n, c, h, w = (int(s) for s in importer.shape_of(x))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1

    def im2col(data):
        def value(b, row, col):
            channel, tap = row // (kh * kw), row % (kh * kw)
            y = col // ow * sh + tap // kw * dh - ph
            z = col % ow * sw + tap % kw * dw - pw
            inside = tirx.all(y >= 0, y < h, z >= 0, z < w)
            safe_y, safe_z = tirx.max(tirx.min(y, h - 1), 0), tirx.max(tirx.min(z, w - 1), 0)
            return tirx.Select(inside, data[b, channel, safe_y, safe_z], tirx.const(0, data.dtype))

        return te.compute((n, c * kh * kw, oh * ow), value, name="im2col")

    return importer.block_builder.emit_te(im2col, x)


def _adaptive_max_pool2d(node, importer):
    """``aten.adaptive_max_pool2d(x, output_size)`` -> ``(values, indices)``: PyTorch's windows
    ``[floor(i * H / oh), ceil((i + 1) * H / oh))``, indices flat over ``H * W`` (the first
    largest value of a window; a NaN counts as the largest, as in PyTorch)."""
    x = importer.env[node.args[0]]
    out_h, out_w = (int(v) for v in node.args[1])
    *lead, h, w = (int(s) for s in importer.shape_of(x))
    span_h, span_w = -(-h // out_h) + 1, -(-w // out_w) + 1  # the widest window, an upper bound

    def pool(data):
        rh = te.reduce_axis((0, span_h), name="rh")
        rw = te.reduce_axis((0, span_w), name="rw")

        def combine(a, b):
            bigger = tirx.any(b[1] > a[1], tirx.all(tirx.isnan(b[1]), tirx.Not(tirx.isnan(a[1]))))
            take_b = tirx.any(bigger, tirx.all(b[1] == a[1], b[0] < a[0]))
            return tirx.Select(take_b, b[0], a[0]), tirx.Select(take_b, b[1], a[1])

        def identity(index_dtype, value_dtype):
            return tirx.max_value(index_dtype), tirx.const(-math.inf, value_dtype)

        argmax = te.comm_reducer(combine, identity, name="first_argmax")

        def window(*idx):
            *outer, i, j = idx
            y0, x0 = i * h // out_h, j * w // out_w
            y1, x1 = ((i + 1) * h + out_h - 1) // out_h, ((j + 1) * w + out_w - 1) // out_w
            y, z = y0 + rh, x0 + rw
            inside = tirx.all(y < y1, z < x1)
            safe_y, safe_z = tirx.min(y, h - 1), tirx.min(z, w - 1)
            # a position past the window: the identity, which never wins
            flat = tirx.Select(inside, (safe_y * w + safe_z).astype("int64"), tirx.max_value("int64"))
            value = tirx.Select(inside, data[(*outer, safe_y, safe_z)], tirx.const(-math.inf, data.dtype))
            return argmax((flat, value), axis=[rh, rw])

        indices, values = te.compute((*lead, out_h, out_w), window, name="adaptive_max_pool2d")
        return [values, indices]

    return importer.block_builder.emit_te(pool, x)


def stock_gap_converters() -> dict:
    """The converters above, keyed as ``custom_convert_map`` expects."""
    return {
        "amax.default": _reduce(relax.op.max),
        "amin.default": _reduce(relax.op.min),
        "prod.dim_int": _reduce(relax.op.prod),
        "min.dim": _min_dim,
        "var_mean.dim": _var_mean,
        "var_mean.correction": _var_mean,
        "grid_sampler_2d.default": _grid_sampler_2d,
        "group_norm.default": _group_norm,
        "im2col.default": _im2col,
        "adaptive_max_pool2d.default": _adaptive_max_pool2d,
        "where.ScalarOther": _where_scalar,
        "where.ScalarSelf": _where_scalar,
        "where.Scalar": _where_scalar,
        "stack.default": _stack,
        "batch_norm.default": _batch_norm,
    }


def decomposition_table():
    """PyTorch's default decompositions without :data:`UNDECOMPOSED`."""
    table = torch.export.default_decompositions()
    for name in UNDECOMPOSED:
        packet, overload = name.split(".")
        table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
    return table
