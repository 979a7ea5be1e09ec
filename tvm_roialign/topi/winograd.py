"""Winograd's minimal filtering ``F(m x m, 3 x 3)``: its transform matrices, the weight transform
and the TE input / output transforms (the Relax rewrite that uses them:
:mod:`tvm_roialign.passes.winograd`).

For an output tile of ``m x m`` pixels and a ``3 x 3`` kernel, the algorithm computes

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A

over an ``a x a`` input tile ``d`` (``a = m + 2``): ``a*a`` products per tile and channel pair
instead of ``9 m^2`` (2.25x fewer for ``m = 2``, 4x fewer for ``m = 4``).

:func:`winograd_matrices` builds the matrices by the Cook-Toom construction from interpolation
points (:data:`POINTS`), ``B^T`` solved so that the 1-D identity holds exactly. ``F(2, 3)``'s
matrices are small integers and halves (exact in binary); ``F(4, 3)`` with points
``0, +-1, +-1/2`` keeps the error within a few float32 ulps of the sum's magnitude (it grows with
``m``). :func:`input_transform` can keep the tiles' row and column as axes of its output, so that
a symbolic-size image is indexed without dividing by the symbolic tile count.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np
from tvm import te, tirx

#: interpolation points (the point at infinity is implied) per output tile size
POINTS = {
    2: (0, 1, -1),
    4: (0, 1, -1, Fraction(1, 2), Fraction(-1, 2)),
    5: (0, 1, -1, 2, Fraction(1, 2), Fraction(-1, 2)),
    6: (0, 1, -1, 2, -2, Fraction(1, 2), Fraction(-1, 2)),
}

INPUT_BLOCK = "winograd_input"
OUTPUT_BLOCK = "winograd_output"
WEIGHT_BLOCK = "winograd_weight"


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


def weight_transform_terms(m: int) -> np.ndarray:
    """``[a*a, 9]`` float64: row ``e*a + f`` holds ``G[e, b] G[f, d]`` at column ``3b + d``, so that
    ``U[e*a + f] = sum_r terms[e*a + f, r] W[r]`` for a 3x3 weight ``W`` flattened to ``[9, C, K]``
    (:func:`transform_weight`'s ``G W G^T`` as one small product, for :func:`weight_transform`)."""
    _, g, _ = winograd_matrices(m)
    return np.einsum("eb,fd->efbd", g, g).reshape(g.shape[0] ** 2, 9)


def weight_transform(weight: te.Tensor, terms: te.Tensor, name: str = WEIGHT_BLOCK) -> te.Tensor:
    """``U [a*a, C, K]`` of a ``[9, C, K]`` float32 weight (a 3x3 HWIO weight, its taps flattened)
    and :func:`weight_transform_terms`' ``[a*a, 9]`` float64 ``terms``: each point a sum of nine
    float64 products rounded once to float32, as :func:`transform_weight` (which computes the same
    sums in another order) rounds. Run once when a library is loaded
    (:class:`~tvm_roialign.passes.LiftWeightTransforms`), not at every call."""
    points = terms.shape[0]

    def point(p, c, k):
        total = None
        for r in range(9):
            term = terms[p, r] * weight[r, c, k].astype("float64")
            total = term if total is None else total + term
        return total.astype(weight.dtype)

    return te.compute((points, *weight.shape[1:]), point, name=name)


def i64_shape(shape) -> list:
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
        i64_shape((alpha, alpha, *tile_axes, c_)), rows, name=INPUT_BLOCK + "_rows"
    )

    def cols(ef, *tile_and_channel):
        e, f = ef // alpha, ef % alpha
        values = [partial[(i, f, *tile_and_channel)] for i in range(alpha)]
        return _select_of_sums(e, bt, values, x.dtype)

    return te.compute(i64_shape((alpha * alpha, *tile_axes, c_)), cols, name=INPUT_BLOCK)


def output_transform(
    mt: te.Tensor, m: int, out_shape, tiles_h, tiles_w, flat: bool = True
) -> te.Tensor:
    """``Y [N, OH, OW, K]``: ``A^T M A`` of every tile, cropped to the output; two separable stages:
    ``T[a, f] = sum_e A^T[a, e] M[e, f]``, then ``Y[a, b] = sum_f A^T[b, f] T[a, f]``. ``mt`` is
    ``[a*a, N*tiles_h*tiles_w, K]`` (``flat``) or ``[a*a, N, tiles_h, tiles_w, K]``; the unflattened
    form finds a pixel's tile without multiplying by a symbolic tile count."""
    at, _, _ = winograd_matrices(m)
    alpha = at.shape[1]
    per_image = tiles_h * tiles_w

    def rows(a, f, *tile_and_channel):
        values = [mt[(e * alpha + f, *tile_and_channel)] for e in range(alpha)]
        return _select_of_sums(a, at, values, mt.dtype)

    partial = te.compute(
        i64_shape((m, alpha, *mt.shape[1:])), rows, name=OUTPUT_BLOCK + "_rows"
    )

    def compute(n, h, w, k):
        if flat:
            tile = (n * per_image + h // m * tiles_w + w // m,)
        else:
            tile = (n, h // m, w // m)
        a, b = h % m, w % m
        values = [partial[(a, f, *tile, k)] for f in range(alpha)]
        return _select_of_sums(b, at, values, mt.dtype)

    return te.compute(i64_shape(out_shape), compute, name=OUTPUT_BLOCK)


def div_up(value, m: int):
    """``ceil(value / m)`` of an int or a symbolic int64 expression."""
    if isinstance(value, int):
        return -(-value // m)
    return tirx.floordiv(value + (m - 1), m)


def output_size(h, w, pad):
    """The conv's output height and width (3x3, stride 1) of an ``h x w`` input."""
    return h + (pad[0] + pad[2] - 2), w + (pad[1] + pad[3] - 2)


def tile_counts(h, w, pad, m: int):
    """Tiles along the output's height and width of a 3x3 stride-1 conv of an ``h x w`` input."""
    out_h, out_w = output_size(h, w, pad)
    return div_up(out_h, m), div_up(out_w, m)


__all__ = [
    "INPUT_BLOCK",
    "OUTPUT_BLOCK",
    "POINTS",
    "WEIGHT_BLOCK",
    "div_up",
    "i64_shape",
    "input_transform",
    "output_size",
    "output_transform",
    "tile_counts",
    "transform_weight",
    "weight_transform",
    "weight_transform_terms",
    "winograd_matrices",
]
