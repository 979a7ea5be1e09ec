"""Winograd convolution: 3x3 stride-1 NHWC convolutions with constant weights as a transform, a
batched matrix product and an inverse transform (the math: :mod:`tvm_roialign.topi.winograd`).

Over a whole layer, Winograd's ``a*a`` products per tile (``a = m + 2`` for an ``m x m`` output
tile) become ``a*a`` independent matrix products ``[tiles, C] x [C, K]`` (one per point of the
transformed tile), which the matmul schedule runs at the machine's peak; the input and output
transforms are cheap elementwise passes.

The rewrite, per ``conv2d(x, W)`` with ``W`` a constant:

* ``U = G W G^T`` is computed here, in float64, once, and cast to the weight's dtype; the constant
  becomes ``U [a*a, C, K]``;
* ``V = winograd_input(x)`` ``[a*a, tiles, C]``: ``B^T d B`` for every tile (zero padding applied on
  the fly);
* ``M = matmul(V, U)`` ``[a*a, tiles, K]``;
* ``y = winograd_output(M)`` ``[N, OH, OW, K]``: ``A^T m A``, the conv's bias / ReLU fuse after it.

Which convolutions are rewritten: 3x3 kernel, stride 1, dilation 1, one group, NHWC data, float32,
at least ``min_channels`` input and output channels (small convolutions are memory-bound: no gain)
and at least ``min_tiles`` output tiles: the transformed weights are ``(m+2)^2 / 9`` times the
conv's (4x for ``m = 4``), and a layer of few tiles (ResNet's last stages: 7x7 pixels, 4 tiles)
reads them for too little work, where direct convolution is faster. Anything else, and any module
without such a conv, is returned unchanged.

A conv of symbolic height, width or batch (one library for every image size) is rewritten too,
its transforms written on the caller's shape expressions. Its input transform keeps the tiles'
row and column as axes of its output (``[a*a, N, tiles_h, tiles_w, C]``, then a view to the
product's ``[a*a, tiles, C]``), so that no unrolled read divides by the symbolic tile count.
Whether such a conv has enough tiles is judged at its size for ``reference_side`` (the image side
the library is expected to see most; a detector's padded ``max_size``), so one library makes the
choice that a static build at that size makes.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, te, tirx

from ..topi.winograd import (
    INPUT_BLOCK,
    OUTPUT_BLOCK,
    POINTS,
    i64_shape,
    input_transform,
    output_size,
    output_transform,
    tile_counts,
    transform_weight,
    winograd_matrices,
)
from ._mutator import FunctionRewriter, is_op_call, rewrite_module, tensor_shape


def _shape_exprs(expr):
    """The rank-4 shape of ``expr`` as expressions (IntImm where static), or None."""
    ty = expr.ty
    if (
        not isinstance(ty, relax.TensorType)
        or not isinstance(ty.shape, relax.ShapeExpr)
        or len(ty.shape.values) != 4
    ):
        return None
    return list(ty.shape.values)

#: ``op_pattern`` of the output transforms (TVM's ``kOutEWiseFusable``): FuseOps fuses the conv's
#: elementwise epilogue (bias, ReLU) into them, but not the next conv's input transform, which
#: their unrolled two-stage schedule does not take in the same function
_OUT_EWISE_FUSABLE = 4


#: How many of the smaller tile's transformed products a larger tile may need at most to be chosen:
#: a larger tile's transforms hold more vectors ((m + 2)^2 per channel vector, beyond a 32-register
#: file for m >= 4) and cost more per product, so a tile that saves only a few percent of the
#: products (F(5x5) against F(4x4) on a large map: 10%) gives it back in its transforms, while one
#: that fits the map much better (F(5x5) on 14x14: 23% fewer) wins
LARGER_TILE_SHARE = 0.85


def choose_tile(tiles, n: int, h: int, w: int, pad) -> tuple[int, int, int]:
    """``(m, tiles_h, tiles_w)``: of the output tiles ``tiles``, the smallest one unless a larger one
    needs at most :data:`LARGER_TILE_SHARE` of its transformed products ``(m + 2)^2 * N *
    tiles_h * tiles_w`` (the batched product's multiply-adds per channel pair, and the size of its
    operands)."""
    best = None
    for m in sorted(tiles):
        tiles_h, tiles_w = tile_counts(h, w, pad, m)
        work = (m + 2) ** 2 * n * tiles_h * tiles_w
        if best is None or work <= LARGER_TILE_SHARE * best[0]:
            best = (work, m, tiles_h, tiles_w)
    return best[1:]


def _at_side(dim, reference_side: int) -> int:
    """``dim`` as an integer: its value, or its value at the reference image side."""
    if isinstance(dim, tirx.IntImm):
        return int(dim.value)
    side = lambda _var: tirx.IntImm("int64", reference_side)
    value = tvm.sym.Analyzer().simplify(tvm_ffi.structural_map(dim, (tirx.Var, side)))
    return int(value.value) if isinstance(value, tirx.IntImm) else 0


def winograd_geometry(call, tiles=(4,), reference_side: int = 320, min_channels: int = 64,
                      min_tiles: int = 32):
    """``(input dims, padding, tile m)`` of a float32 conv2d ``call`` that :class:`WinogradConv2D`
    rewrites once its weight is a constant (with these parameters), judged from the types alone
    (the weight's shape), else None: also the decision for a weight still to be folded (an ONNX QDQ
    model's ``dequantize``)."""
    if not is_op_call(call, "relax.nn.conv2d"):
        return None
    weight = call.args[1]
    attrs = call.attrs
    dims = _shape_exprs(call.args[0])
    kernel = tensor_shape(weight)
    if (
        dims is None
        or kernel is None
        or not isinstance(dims[3], tirx.IntImm)
        or str(attrs.data_layout) != "NHWC"
        or str(attrs.out_layout or attrs.data_layout) != "NHWC"
        or int(attrs.groups) != 1
        or [int(v) for v in attrs.strides] != [1, 1]
        or [int(v) for v in attrs.dilation] != [1, 1]
        or str(call.ty.dtype) != "float32"
        or str(weight.ty.dtype) != "float32"
    ):
        return None
    layout = str(attrs.kernel_layout)
    kh, kw, channels, filters = (kernel[layout.index(a)] for a in "HWIO")
    if (kh, kw) != (3, 3) or None in (channels, filters) or min(channels, filters) < min_channels:
        return None
    pad = [int(v) for v in attrs.padding]  # top, left, bottom, right
    # the decisions are taken at the layer's size for the reference image side when the
    # size is symbolic (one library serves every size; the few-tile layers stay direct); a
    # symbolic batch is taken at that value too, so its convs are Winograd (judged as a batch
    # of one, layer3 of a symbolic resnet18 stayed direct where the static build at 1x3x320x480
    # takes Winograd: 1.44x that build, 1.30x with the symbolic convs' merged rows)
    n_ref, h_ref, w_ref = (_at_side(d, reference_side) for d in dims[:3])
    out_h, out_w = output_size(h_ref, w_ref, pad)
    if out_h < 1 or out_w < 1:
        return None
    m, tiles_h, tiles_w = choose_tile(tiles, max(n_ref, 1), h_ref, w_ref, pad)
    if n_ref * tiles_h * tiles_w < min_tiles:
        return None
    return dims, pad, m


def winograd_plan(call, tiles=(4,), reference_side: int = 320, min_channels: int = 64, min_tiles: int = 32):
    """``(hwio weight, input dims, padding, tile m)`` of a conv2d ``call`` with a constant weight that
    :class:`WinogradConv2D` rewrites (with these parameters, :func:`winograd_geometry`), else None."""
    geometry = winograd_geometry(call, tiles, reference_side, min_channels, min_tiles)
    if geometry is None or not isinstance(call.args[1], tvm.ir.expr.Constant):
        return None
    layout = str(call.attrs.kernel_layout)
    hwio = call.args[1].value.numpy().transpose([layout.index(a) for a in "HWIO"])
    return (hwio, *geometry)


class _WinogradRewriter(FunctionRewriter):
    tiles = (4,)
    min_channels = 64
    min_tiles = 32
    reference_side = 320
    record = None

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        plan = winograd_plan(call, self.tiles, self.reference_side, self.min_channels, self.min_tiles)
        if plan is None:
            return call
        hwio, dims, pad, m = plan
        self.changed = True
        filters = hwio.shape[3]
        transformed = transform_weight(hwio, m)
        if self.record is not None:
            self.record.record(transformed, hwio, m)
        weight_u = relax.const(transformed)
        if all(isinstance(d, tirx.IntImm) for d in dims):
            return self._static(call.args[0], [int(d) for d in dims], pad, m, weight_u, filters)
        return self._symbolic(call.args[0], dims, pad, m, weight_u)

    def _static(self, x, x_shape, pad, m, weight_u, filters):
        """The transforms as functions shared by every conv of the same signature."""
        n, h, w, channels = x_shape
        alpha = m + 2
        tiles_h, tiles_w = tile_counts(h, w, pad, m)
        tiles = n * tiles_h * tiles_w
        out_h, out_w = output_size(h, w, pad)
        transformed = self._call(
            "winograd_input_transform",
            (tuple(x_shape), m, tuple(pad[:2]), tiles_h, tiles_w),
            lambda: input_transform(
                te.placeholder(i64_shape(x_shape), "float32", "x"), m, pad[:2], tiles_h, tiles_w
            ),
            x,
            [alpha * alpha, tiles, channels],
        )
        product = self.builder_.emit(relax.op.matmul(transformed, weight_u))
        return self._call(
            "winograd_output_transform",
            (alpha, tiles, filters, m, (n, out_h, out_w), tiles_h, tiles_w),
            lambda: output_transform(
                te.placeholder(i64_shape((alpha * alpha, tiles, filters)), "float32", "m"),
                m,
                (n, out_h, out_w, filters),
                tiles_h,
                tiles_w,
            ),
            product,
            [n, out_h, out_w, filters],
        )

    def _symbolic(self, x, dims, pad, m, weight_u):
        """The transforms written on the caller's own shape expressions, as legalized ops are
        (FuseTIR requires one buffer shape per tensor when it fuses the input transform with its
        producer). The input transform keeps the tiles' coordinates as axes (its indices then
        divide by no symbolic extent); a view gives the matrix product its rows."""
        bb = self.builder_
        alpha = m + 2
        tiles_h, tiles_w = tile_counts(dims[1], dims[2], pad, m)
        tiles = dims[0] * tiles_h * tiles_w
        transformed = bb.emit_te(
            lambda t: input_transform(t, m, pad[:2], tiles_h, tiles_w, flat=False),
            x,
            primfunc_name_hint="winograd_input_transform",
        )
        rows = bb.emit(relax.op.memory.view(transformed, [alpha * alpha, tiles, dims[3]]))
        product = bb.emit(relax.op.matmul(rows, weight_u))
        filters = weight_u.ty.shape[2]
        tiled = bb.emit(
            relax.op.memory.view(product, [alpha * alpha, dims[0], tiles_h, tiles_w, filters])
        )
        out_shape = (dims[0], *output_size(dims[1], dims[2], pad), filters)
        out = bb.emit_te(
            lambda t: output_transform(t, m, out_shape, tiles_h, tiles_w, flat=False),
            tiled,
            primfunc_name_hint="winograd_output_transform",
        )
        gvar = bb.lookup_binding(out).args[0]
        bb.update_func(gvar, bb.get()[gvar].with_attr("op_pattern", _OUT_EWISE_FUSABLE))
        return out

    def _call(self, name, key, make, arg, out_shape):
        """``call_tir`` of the transform for ``key``, its PrimFunc made once per signature."""
        cache = self.__dict__.setdefault("_funcs", {})
        if (name, key) not in cache:
            out = make()
            placeholder = out.op.input_tensors[0]
            while not isinstance(placeholder.op, te.PlaceholderOp):
                placeholder = placeholder.op.input_tensors[0]
            func = te.create_prim_func([placeholder, out]).without_attr("global_symbol")
            if name == "winograd_output_transform":
                func = func.with_attr("op_pattern", _OUT_EWISE_FUSABLE)
            cache[(name, key)] = self.builder_.add_func(func, name)
        return self.builder_.emit(
            relax.call_tir(
                cache[(name, key)], [arg], relax.TensorType(out_shape, "float32")
            )
        )


def tile_set(tile) -> tuple[int, ...]:
    """The candidate output tiles of ``tile`` (an int or a sequence of them), checked against
    :data:`~tvm_roialign.topi.winograd.POINTS`."""
    tiles = tuple(int(t) for t in (tile if isinstance(tile, (tuple, list)) else (tile,)))
    if not tiles or any(t not in POINTS for t in tiles):
        raise ValueError(f"tile must be one of {sorted(POINTS)} or a tuple of them, got {tile}")
    return tiles


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.WinogradConv2D")
class WinogradConv2D:  # pylint: disable=too-few-public-methods
    """Rewrite 3x3 stride-1 NHWC constant-weight conv2d as Winograd ``F(m x m, 3 x 3)``: ``tile``
    is ``m``, or a tuple of candidate tiles of which each conv gets the one with the fewest
    transformed products at its size (:func:`choose_tile`). ``record``: a
    :class:`~tvm_roialign.passes.WinogradWeights` that learns each transformed weight, so that
    :class:`~tvm_roialign.passes.LiftWeightTransforms` can compute it at load instead of storing
    it (None: stored)."""

    def __init__(
        self,
        tile: int | tuple = 4,
        min_channels: int = 64,
        min_tiles: int = 32,
        reference_side: int = 320,
        record=None,
    ):
        self.tiles = tile_set(tile)
        self.record = record
        self.min_channels = int(min_channels)
        self.min_tiles = int(min_tiles)
        self.reference_side = int(reference_side)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        rewritten = rewrite_module(
            _WinogradRewriter,
            mod,
            tiles=self.tiles,
            min_channels=self.min_channels,
            min_tiles=self.min_tiles,
            reference_side=self.reference_side,
            record=self.record,
        )
        if rewritten is mod:
            return mod
        # a rewritten conv's binding is an alias of its output transform's result, which FuseOps
        # does not look through: without this the bias / ReLU epilogue would stay a pass of its own
        return relax.transform.CanonicalizeBindings()(rewritten)


__all__ = [
    "INPUT_BLOCK",
    "OUTPUT_BLOCK",
    "WinogradConv2D",
    "choose_tile",
    "input_transform",
    "output_transform",
    "tile_set",
    "transform_weight",
    "winograd_geometry",
    "winograd_matrices",
    "winograd_plan",
]
