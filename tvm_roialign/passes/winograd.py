"""Winograd convolution: 3x3 stride-1 NHWC convolutions with constant weights as a transform, a
batched matrix product and an inverse transform.

For an output tile of ``m x m`` pixels and a ``3 x 3`` kernel, Winograd's minimal filtering
algorithm ``F(m x m, 3 x 3)`` computes

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A

over an ``a x a`` input tile ``d`` (``a = m + 2``), i.e. ``a*a`` products per tile and channel pair
instead of ``9 m^2``: 2.25x fewer for ``m = 2`` and 4x fewer for ``m = 4``. Over a whole layer, the
products become ``a*a`` independent matrix products ``[tiles, C] x [C, K]`` (one per point of the
transformed tile), which the matmul schedule runs at the machine's peak; the input and output
transforms are cheap elementwise passes.

The rewrite, per ``conv2d(x, W)`` with ``W`` a constant:

* ``U = G W G^T`` is computed here, in float64, once, and cast to the weight's dtype; the constant
  becomes ``U [a*a, C, K]``;
* ``V = winograd_input(x)`` ``[a*a, tiles, C]``: ``B^T d B`` for every tile (zero padding applied on
  the fly);
* ``M = matmul(V, U)`` ``[a*a, tiles, K]``;
* ``y = winograd_output(M)`` ``[N, OH, OW, K]``: ``A^T m A``, the conv's bias / ReLU fuse after it.

The transform matrices come from :func:`winograd_matrices` (Cook-Toom construction from
interpolation points, ``B^T`` solved so that the 1-D identity holds exactly). ``F(2, 3)``'s matrices
are small integers and halves (exact in binary); ``F(4, 3)`` with points ``0, +-1, +-1/2`` keeps the
error within a few float32 ulps of the sum's magnitude (it grows with ``m``). Which convolutions are
rewritten: 3x3 kernel, stride 1, dilation 1, one group, NHWC data, float32, at least
``min_channels`` input and output channels (small convolutions are memory-bound: no gain) and at
least ``min_tiles`` output tiles: the transformed weights are ``(m+2)^2 / 9`` times the conv's (4x for
``m = 4``), and a layer of few tiles (ResNet's last stages: 7x7 pixels, 4 tiles) reads them for too
little work; direct convolution is faster there (resnet18 at 224x224: 23 -> 16 ms on 2 cores).
Anything else, and any module without such a conv, is returned unchanged.

A conv of symbolic height, width or batch (one library for every image size) is rewritten too,
its transforms written on the caller's shape expressions. Its input transform keeps the tiles'
row and column as axes of its output (``[a*a, N, tiles_h, tiles_w, C]``, then a reshape, a view,
to the product's ``[a*a, tiles, C]``): indexing the image from a flat tile number would divide by
the symbolic tile count in every unrolled read, which LLVM took minutes to compile. Whether such a
conv has enough tiles is judged at its size for ``reference_side`` (the image side the library is
expected to see most; a detector's padded ``max_size``), so one library makes the choice that a
static build at that size makes.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te, tirx

from ._mutator import FunctionRewriter, is_op_call, rewrite_module

#: interpolation points (the point at infinity is implied) per output tile size
POINTS = {
    2: (0, 1, -1),
    4: (0, 1, -1, Fraction(1, 2), Fraction(-1, 2)),
    6: (0, 1, -1, 2, -2, Fraction(1, 2), Fraction(-1, 2)),
}

INPUT_BLOCK = "winograd_input"
OUTPUT_BLOCK = "winograd_output"


def winograd_matrices(m: int, r: int = 3, points=None):
    """``(A^T [m, a], G [a, r], B^T [a, a])`` of ``F(m, r)`` as float64 arrays (``a = m + r - 1``).

    ``A^T`` and ``G`` follow the Cook-Toom construction from ``a - 1`` finite points and the point
    at infinity; ``B^T`` is solved from ``sum_j A^T[i, j] G[j, k] B^T[j, t] = [t == i + k]`` (the 1-D
    correlation ``y[i] = sum_k d[i + k] g[k]``), in exact rational arithmetic.
    """
    at, g, bt = _matrices(m, r, tuple(points if points is not None else POINTS[m]))
    return at.copy(), g.copy(), bt.copy()


@functools.cache
def _matrices(m: int, r: int, points: tuple):
    points = [Fraction(p) for p in points]
    alpha = m + r - 1
    if len(points) != alpha - 1 or len(set(points)) != len(points):
        raise ValueError(
            f"F({m}, {r}) needs {alpha - 1} distinct finite points, got {points}"
        )
    at = [[p**i for p in points] + [Fraction(int(i == m - 1))] for i in range(m)]
    g = []
    for j, p in enumerate(points):
        f = Fraction(1)
        for q in points[:j] + points[j + 1 :]:
            f *= p - q
        g.append([p**k / f for k in range(r)])
    g.append([Fraction(int(k == r - 1)) for k in range(r)])
    # B^T column by column: a linear system in exact rationals (Gaussian elimination)
    coef = [
        [at[i][j] * g[j][k] for j in range(alpha)] for i in range(m) for k in range(r)
    ]
    bt = [[Fraction(0)] * alpha for _ in range(alpha)]
    for t in range(alpha):
        rhs = [Fraction(int(t == i + k)) for i in range(m) for k in range(r)]
        sol = _solve(coef, rhs)
        for j in range(alpha):
            bt[j][t] = sol[j]
    to_array = lambda rows: np.array([[float(v) for v in row] for row in rows])
    return to_array(at), to_array(g), to_array(bt)


def _solve(a_rows, b):
    """Least-squares-free exact solve of an overdetermined but consistent rational system."""
    rows = [[*list(row), rhs] for row, rhs in zip(a_rows, b)]
    ncols = len(a_rows[0])
    pivots = []
    r = 0
    for c in range(ncols):
        pivot = next((i for i in range(r, len(rows)) if rows[i][c] != 0), None)
        if pivot is None:
            continue
        rows[r], rows[pivot] = rows[pivot], rows[r]
        inv = 1 / rows[r][c]
        rows[r] = [v * inv for v in rows[r]]
        for i in range(len(rows)):
            if i != r and rows[i][c] != 0:
                factor = rows[i][c]
                rows[i] = [vi - factor * vr for vi, vr in zip(rows[i], rows[r])]
        pivots.append(c)
        r += 1
    if any(all(v == 0 for v in row[:-1]) and row[-1] != 0 for row in rows):
        raise ValueError("inconsistent Winograd system (points do not define F(m, r))")
    sol = [Fraction(0)] * ncols
    for i, c in enumerate(pivots):
        sol[c] = rows[i][-1]
    return sol


def transform_weight(weight_hwio: np.ndarray, m: int) -> np.ndarray:
    """``U [a*a, C, K] = G W G^T`` of an HWIO ``3x3`` weight, computed in float64."""
    _, g, _ = winograd_matrices(m)
    alpha = g.shape[0]
    w = weight_hwio.astype("float64").reshape(3, -1)  # [a(row), 3 * C * K]
    rows = (g @ w).reshape(alpha, 3, -1)  # [e, b, C*K]
    u = g @ rows.transpose(1, 0, 2).reshape(3, -1)  # [f, e * C*K]
    u = u.reshape(alpha, alpha, -1).transpose(1, 0, 2)  # [e, f, C*K]
    shape = (alpha * alpha, *weight_hwio.shape[2:])
    return np.ascontiguousarray(u).reshape(shape).astype(weight_hwio.dtype)


def _i64(shape) -> list:
    """A shape in int64, as legalized Relax ops have them (FuseTIR compares buffer types); a
    symbolic dimension (an int64 expression) is kept as it is."""
    return [
        tirx.IntImm("int64", int(v)) if isinstance(v, (int, tirx.IntImm)) else v
        for v in shape
    ]


def _linear_combination(terms, dtype):
    """``sum(coef * value)`` without multiplications by 1 and with subtractions for -1."""
    expr = None
    for coef, value in terms:
        if coef == 0:
            continue
        if coef == 1:
            term, negative = value, False
        elif coef == -1:
            term, negative = value, True
        else:
            term, negative = value * tirx.const(float(coef), dtype), False
        if expr is None:
            expr = -term if negative else term
        else:
            expr = expr - term if negative else expr + term
    return expr


def _select_of_sums(index, coefficients, values, dtype):
    """``sum_j coefficients[index][j] * values[j]`` for a (loop-unrolled) ``index``: the values
    bound once by ``Let`` and each case of the select a sum of their names (a small expression
    that compiles fast once the select is unrolled), zero coefficients left out."""
    names = [tirx.Var(f"v{j}", dtype) for j in range(len(values))]
    cases = [_linear_combination(list(zip(row, names)), dtype) for row in coefficients]
    body = _select(index, cases, dtype)
    for name, value in reversed(list(zip(names, values))):
        body = tirx.Let(name, value, body)
    return body


def _select(index, cases, dtype):
    """``cases[index]`` for a (loop-unrolled) integer ``index`` as a chain of selects."""
    expr = cases[-1] if cases[-1] is not None else tirx.const(0.0, dtype)
    for i in range(len(cases) - 2, -1, -1):
        value = cases[i] if cases[i] is not None else tirx.const(0.0, dtype)
        expr = tirx.Select(index == i, value, expr)
    return expr


def input_transform(
    x: te.Tensor, m: int, padding, tiles_h, tiles_w, flat: bool = True
) -> te.Tensor:
    """``V [a*a, N*tiles_h*tiles_w, C]`` (``flat``) or ``V [a*a, N, tiles_h, tiles_w, C]``: ``B^T d B``
    of every input tile (zero padding), as two separable stages: ``T[i, f] = sum_j B^T[f, j] d[i, j]``,
    then ``V[e, f] = sum_i B^T[e, i] T[i, f]``. The unflattened form indexes the image with the
    tile's own coordinates (no division by a symbolic tile count)."""
    n_, h_, w_, c_ = x.shape
    _, _, bt = winograd_matrices(m)
    alpha = bt.shape[0]
    pad_top, pad_left = int(padding[0]), int(padding[1])
    per_image = tiles_h * tiles_w

    def tile_rows(i, f, n, th, tw, c):
        hh = th * m + i - pad_top

        def d(j):
            ww = tw * m + j - pad_left
            inside = tirx.all(hh >= 0, hh < h_, ww >= 0, ww < w_)
            return tirx.if_then_else(inside, x[n, hh, ww, c], tirx.const(0.0, x.dtype))

        return _select_of_sums(f, bt, [d(j) for j in range(alpha)], x.dtype)

    if flat:
        tile_axes = (n_ * per_image,)

        def rows(i, f, p, c):
            return tile_rows(i, f, p // per_image, p % per_image // tiles_w, p % tiles_w, c)

    else:
        tile_axes = (n_, tiles_h, tiles_w)
        rows = tile_rows

    partial = te.compute(
        _i64((alpha, alpha, *tile_axes, c_)), rows, name=INPUT_BLOCK + "_rows"
    )

    def cols(ef, *tile_and_channel):
        e, f = ef // alpha, ef % alpha
        values = [partial[(i, f, *tile_and_channel)] for i in range(alpha)]
        return _select_of_sums(e, bt, values, x.dtype)

    return te.compute(_i64((alpha * alpha, *tile_axes, c_)), cols, name=INPUT_BLOCK)


def output_transform(
    mt: te.Tensor, m: int, out_shape, tiles_h: int, tiles_w: int
) -> te.Tensor:
    """``Y [N, OH, OW, K]``: ``A^T M A`` of every tile, cropped to the output; two separable stages:
    ``T[a, f] = sum_e A^T[a, e] M[e, f]``, then ``Y[a, b] = sum_f A^T[b, f] T[a, f]``."""
    at, _, _ = winograd_matrices(m)
    alpha = at.shape[1]
    per_image = tiles_h * tiles_w

    def rows(a, f, p, k):
        values = [mt[e * alpha + f, p, k] for e in range(alpha)]
        return _select_of_sums(a, at, values, mt.dtype)

    partial = te.compute(
        _i64((m, alpha, mt.shape[1], mt.shape[2])),
        rows,
        name=OUTPUT_BLOCK + "_rows",
    )

    def compute(n, h, w, k):
        p = n * per_image + h // m * tiles_w + w // m
        a, b = h % m, w % m
        values = [partial[a, f, p, k] for f in range(alpha)]
        return _select_of_sums(b, at, values, mt.dtype)

    return te.compute(_i64(out_shape), compute, name=OUTPUT_BLOCK)


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


def _div_up(value, m: int):
    if isinstance(value, int):
        return -(-value // m)
    return tirx.floordiv(value + (m - 1), m)


def _out_size(h, w, pad):
    """The conv's output height and width (3x3, stride 1) of an ``h x w`` input."""
    return h + (pad[0] + pad[2] - 2), w + (pad[1] + pad[3] - 2)


def _tiles(h, w, pad, m: int):
    out_h, out_w = _out_size(h, w, pad)
    return _div_up(out_h, m), _div_up(out_w, m)


class _WinogradRewriter(FunctionRewriter):
    tile = 4
    min_channels = 64
    min_tiles = 32
    reference_side = 320

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if not is_op_call(call, "relax.nn.conv2d"):
            return call
        weight = call.args[1]
        attrs = call.attrs
        dims = _shape_exprs(call.args[0])
        if (
            not isinstance(weight, tvm.ir.expr.Constant)
            or dims is None
            or not isinstance(dims[3], tirx.IntImm)
            or str(attrs.data_layout) != "NHWC"
            or str(attrs.out_layout or attrs.data_layout) != "NHWC"
            or int(attrs.groups) != 1
            or [int(v) for v in attrs.strides] != [1, 1]
            or [int(v) for v in attrs.dilation] != [1, 1]
            or str(call.ty.dtype) != "float32"
            or str(weight.ty.dtype) != "float32"
        ):
            return call
        layout = str(attrs.kernel_layout)
        value = weight.value.numpy()
        hwio = value.transpose([layout.index(a) for a in "HWIO"])
        if (
            hwio.shape[:2] != (3, 3)
            or min(hwio.shape[2], hwio.shape[3]) < self.min_channels
        ):
            return call
        pad = [int(v) for v in attrs.padding]  # top, left, bottom, right
        m = self.tile
        # the decision is taken at the layer's size for the reference image side when the size
        # is symbolic (one library serves every size; the few-tile layers stay direct)
        n_ref, h_ref, w_ref = (self._reference(d) for d in dims[:3])
        out_h, out_w = h_ref + pad[0] + pad[2] - 2, w_ref + pad[1] + pad[3] - 2
        if out_h < 1 or out_w < 1:
            return call
        if n_ref * -(-out_h // m) * -(-out_w // m) < self.min_tiles:
            return call
        self.changed = True
        filters = hwio.shape[3]
        weight_u = relax.const(transform_weight(hwio, m))
        if all(isinstance(d, tirx.IntImm) for d in dims):
            return self._static(call.args[0], [int(d) for d in dims], pad, m, weight_u, filters)
        return self._symbolic(call.args[0], dims, pad, m, weight_u)

    def _static(self, x, x_shape, pad, m, weight_u, filters):
        """The transforms as functions shared by every conv of the same signature."""
        n, h, w, channels = x_shape
        alpha = m + 2
        tiles_h, tiles_w = _tiles(h, w, pad, m)
        tiles = n * tiles_h * tiles_w
        out_h, out_w = _out_size(h, w, pad)
        transformed = self._call(
            "winograd_input_transform",
            (tuple(x_shape), m, tuple(pad[:2]), tiles_h, tiles_w),
            lambda: input_transform(
                te.placeholder(_i64(x_shape), "float32", "x"), m, pad[:2], tiles_h, tiles_w
            ),
            x,
            [alpha * alpha, tiles, channels],
        )
        product = self.builder_.emit(relax.op.matmul(transformed, weight_u))
        return self._call(
            "winograd_output_transform",
            (alpha, tiles, filters, m, (n, out_h, out_w), tiles_h, tiles_w),
            lambda: output_transform(
                te.placeholder(_i64((alpha * alpha, tiles, filters)), "float32", "m"),
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
        tiles_h, tiles_w = _tiles(dims[1], dims[2], pad, m)
        tiles = dims[0] * tiles_h * tiles_w
        transformed = bb.emit_te(
            lambda t: input_transform(t, m, pad[:2], tiles_h, tiles_w, flat=False),
            x,
            primfunc_name_hint="winograd_input_transform",
        )
        rows = bb.emit(relax.op.memory.view(transformed, [alpha * alpha, tiles, dims[3]]))
        product = bb.emit(relax.op.matmul(rows, weight_u))
        out_shape = (dims[0], *_out_size(dims[1], dims[2], pad), weight_u.ty.shape[2])
        return bb.emit_te(
            lambda t: output_transform(t, m, out_shape, tiles_h, tiles_w),
            product,
            primfunc_name_hint="winograd_output_transform",
        )

    def _reference(self, dim) -> int:
        """``dim`` as an integer: its value, or its value at the reference image side."""
        if isinstance(dim, tirx.IntImm):
            return int(dim.value)
        side = lambda _var: tirx.IntImm("int64", self.reference_side)
        value = tvm.sym.Analyzer().simplify(tvm_ffi.structural_map(dim, (tirx.Var, side)))
        return int(value.value) if isinstance(value, tirx.IntImm) else 0

    def _call(self, name, key, make, arg, out_shape):
        """``call_tir`` of the transform for ``key``, its PrimFunc made once per signature."""
        cache = self.__dict__.setdefault("_funcs", {})
        if (name, key) not in cache:
            out = make()
            placeholder = out.op.input_tensors[0]
            while not isinstance(placeholder.op, te.PlaceholderOp):
                placeholder = placeholder.op.input_tensors[0]
            func = te.create_prim_func([placeholder, out]).without_attr("global_symbol")
            cache[(name, key)] = self.builder_.add_func(func, name)
        return self.builder_.emit(
            relax.call_tir(
                cache[(name, key)], [arg], relax.TensorType(out_shape, "float32")
            )
        )


@tvm.transform.module_pass(opt_level=0, name="WinogradConv2D")
class WinogradConv2D:  # pylint: disable=too-few-public-methods
    """Rewrite 3x3 stride-1 NHWC constant-weight conv2d as Winograd ``F(tile x tile, 3 x 3)``."""

    def __init__(
        self,
        tile: int = 4,
        min_channels: int = 64,
        min_tiles: int = 32,
        reference_side: int = 320,
    ):
        if tile not in POINTS:
            raise ValueError(f"tile must be one of {sorted(POINTS)}, got {tile}")
        self.tile = int(tile)
        self.min_channels = int(min_channels)
        self.min_tiles = int(min_tiles)
        self.reference_side = int(reference_side)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(
            _WinogradRewriter,
            mod,
            tile=self.tile,
            min_channels=self.min_channels,
            min_tiles=self.min_tiles,
            reference_side=self.reference_side,
        )


__all__ = [
    "INPUT_BLOCK",
    "OUTPUT_BLOCK",
    "WinogradConv2D",
    "input_transform",
    "output_transform",
    "transform_weight",
    "winograd_matrices",
]
