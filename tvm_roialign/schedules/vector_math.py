"""``exp``, ``sigmoid`` and ``erf`` of float32 in a form LLVM vectorizes.

TVM lowers ``T.exp`` (and ``T.sigmoid``, ``1 / (1 + exp(-x))``) on llvm to the ``llvm.exp``
intrinsic, which LLVM turns into one call of the C library's ``expf`` per lane, and ``T.erf`` to a
call of ``erff``: a vectorized epilogue (the SiLU ``x * sigmoid(x)`` after every conv of
EfficientNet, the GELU of a transformer's MLP) then runs a scalar call per element.
:func:`vectorize_math` rewrites them, in a scheduled PrimFunc, into arithmetic alone.

``exp``:

* ``exp(x) = 2^n * p(r)`` with ``n = floor(x / ln 2 + 1/2)`` and ``r = x - n ln 2`` (``ln 2`` in
  two parts, the first exact in a few bits, so that ``r`` is exact to the last bit of ``x``), so
  ``|r| <= ln 2 / 2``;
* ``p``: the Taylor polynomial of ``exp`` to degree 7, whose truncation error on that interval is
  below a tenth of float32's unit roundoff (what is left is the rounding of the Horner steps,
  within one unit in the last place);
* ``2^n`` built from its bits (``(n + 127) << 23``) with ``n`` kept to ``[-126, 128]`` (128 as
  ``2^127 * 2``): above ``ln(FLT_MAX)`` the product overflows to ``inf`` as ``expf`` does; below
  ``ln(FLT_MIN)`` the result is ``0`` (``expf`` gives a denormal there, within ``1.2e-38``); a NaN
  stays NaN.

``sigmoid``, from ``exp`` of ``z = -|x|`` alone (the same reduction and polynomial, no overflow to
handle): ``e = exp(max(z, -88))``, ``sigmoid(x) = (x < 0 ? e : 1) / (1 + e)``. With ``z`` in
``[-88, 0]``, ``n`` is in ``[-127, 0]`` and ``2^n`` is built from its bits without a clamp of ``n``
or a select of the result: ``n = -127`` gives the bits of ``+0``, so ``e = 0`` and the result is
``0`` (``x`` below ``-87.7``) or ``1`` (above ``87.7``), as float32 rounds the exact values; a NaN
stays NaN. Within two units in the last place of the exact value (``e``'s unit, the sum's and the
quotient's half units); the polynomial by Estrin's scheme (:func:`_reduced_exp_estrin`). About
22 vector operations and one division where
``1 / (1 + exp(-x))`` through :func:`vector_exp` takes some 30: the SiLU ``x * sigmoid(x)``
after every convolution of EfficientNet is most of the work of its convolutions of few input
channels.

``erf(x) = x * g(x^2)`` with ``g(u) = erf(sqrt(u)) / sqrt(u)``, an entire function of ``u``, as
a rational function ``P(u) / Q(u)`` of degrees :data:`_ERF_DEGREES` on ``[0, 16]`` (``Q(0) = 1``,
``Q`` positive there), near-minimax in relative error (``~7e-8`` in exact arithmetic): its
coefficients (stored, so that every machine builds the same code) come from
:func:`_erf_coefficients`, a fit to :func:`math.erf` by iteratively reweighted linearized least
squares (Lawson's weights) on Chebyshev points. Eleven multiply-adds and one division, where a
polynomial of the same accuracy needs degree 16 (32 operations by Clenshaw's recurrence): it is
the GELU in the epilogue of every transformer MLP's first matmul. In float32 within ``4e-7`` of
the exact value (six units in the last place near 1, the roundings of the two Horner steps,
the division and the product; relative error ``~1e-7`` near 0); beyond
``|x| = 4`` float32's ``erf`` is ``+-1`` (the result is clamped to ``[-1, 1]``); a NaN stays NaN.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

#: the two parts of ln 2 (the first has 9 significant bits, so ``n * _LN2_HIGH`` is exact)
_LN2_HIGH = 0.693359375
_LN2_LOW = math.log(2.0) - _LN2_HIGH
#: below this ``exp`` is not a normal float32 (ln of FLT_MIN)
_LOWEST = math.log(2.0**-126)
_DEGREE = 7
#: degrees of numerator and denominator of the rational ``erf(sqrt(u)) / sqrt(u)`` on ``[0, _ERF_U]``
_ERF_DEGREES = (6, 4)
_ERF_U = 16.0


def _f32(value: float) -> tirx.FloatImm:
    return tirx.FloatImm("float32", value)


def _reduced_argument(x, n):
    """``r = x - n ln 2`` (``ln 2`` in two parts, so that ``n`` times the first is exact)."""
    return x - n * _f32(_LN2_HIGH) - n * _f32(_LN2_LOW)


def _reduced_exp(x, n):
    """``exp(r)`` of ``r = x - n ln 2`` by its Taylor polynomial (``|r| <= ln 2 / 2``)."""
    r = _reduced_argument(x, n)
    poly = _f32(1.0 / math.factorial(_DEGREE))
    for k in range(_DEGREE - 1, -1, -1):
        poly = poly * r + _f32(1.0 / math.factorial(k))
    return poly


def _reduced_exp_estrin(x, n):
    """:func:`_reduced_exp`'s polynomial by Estrin's scheme: pairs ``c_k + c_{k+1} r`` combined by
    ``r^2`` and ``r^4``, four multiply-adds deep where Horner's rule is seven (two products more),
    so that more elements are in flight at once where the epilogue is bound by that latency."""
    r = tirx.Var("exp_r", "float32")
    r2 = tirx.Var("exp_r2", "float32")
    c = [_f32(1.0 / math.factorial(k)) for k in range(_DEGREE + 1)]
    pairs = [c[k] + c[k + 1] * r for k in range(0, _DEGREE + 1, 2)]
    low = pairs[0] + pairs[1] * r2
    high = pairs[2] + pairs[3] * r2
    body = tirx.Let(r2, r * r, low + high * (r2 * r2))
    return tirx.Let(r, _reduced_argument(x, n), body)


def _power_of_two(n):
    """``2^n`` of an integral float32 ``n`` in ``[-127, 127]`` from its bits (``n = -127``: ``+0``)."""
    exponent = tirx.Cast("int32", n) + tirx.IntImm("int32", 127)
    return tirx.reinterpret("float32", tirx.shift_left(exponent, tirx.IntImm("int32", 23)))


def vector_exp(x):
    """``exp(x)`` of a float32 expression as arithmetic LLVM vectorizes (see the module)."""
    n = tirx.floor(x * _f32(1.0 / math.log(2.0)) + _f32(0.5))
    n = tirx.max(tirx.min(n, _f32(128.0)), _f32(-126.0))
    poly = _reduced_exp(x, n)
    # 2^n for n <= 127 from its bits; n = 128 (x just below ln(FLT_MAX)) as 2^127 * 2
    power = _power_of_two(tirx.min(n, _f32(127.0)))
    poly = tirx.Select(n > _f32(127.0), poly * _f32(2.0), poly)
    scaled = poly * power
    return tirx.Select(x < _f32(_LOWEST), _f32(0.0), scaled)


#: ``-|x|`` is kept above this (``exp`` of it is below float32's least normal, so that ``n`` is
#: ``-127`` at most and ``2^n`` becomes ``+0``)
_SIGMOID_FLOOR = -88.0


def vector_sigmoid(x):
    """``sigmoid(x)`` of a float32 expression as arithmetic LLVM vectorizes (see the module)."""
    v = tirx.Var("sigmoid_x", "float32")
    z = tirx.Var("sigmoid_z", "float32")
    n = tirx.Var("sigmoid_n", "float32")
    e = tirx.Var("sigmoid_e", "float32")
    floor = _f32(_SIGMOID_FLOOR)
    # a comparison and a select, which a NaN fails (it stays NaN; max would drop it)
    clamped = tirx.Select(_f32(0.0) - tirx.abs(v) < floor, floor, _f32(0.0) - tirx.abs(v))
    ratio = tirx.Select(v < _f32(0.0), e, _f32(1.0)) / (_f32(1.0) + e)
    body = tirx.Let(e, _reduced_exp_estrin(z, n) * _power_of_two(n), ratio)
    body = tirx.Let(n, tirx.floor(z * _f32(1.0 / math.log(2.0)) + _f32(0.5)), body)
    return tirx.Let(v, x, tirx.Let(z, clamped, body))


def _erf_coefficients(points: int = 2000, rounds: int = 30) -> tuple[list[float], list[float]]:
    """Coefficients (lowest degree first, ``Q``'s constant 1) of ``P / Q`` near the minimax
    relative-error fit of ``erf(sqrt(u)) / sqrt(u)`` on ``[0, _ERF_U]``: each round solves
    ``P(u) - g(u) (Q(u) - 1) = g(u)`` by weighted least squares, the weights ``1 / (g Q)`` of the
    previous round's ``Q`` (so the residual is the relative error) times Lawson's weights, which
    grow where the error is largest."""
    p, q = _ERF_DEGREES
    u = (np.cos(np.pi * (np.arange(points) + 0.5) / points) + 1.0) * _ERF_U / 2.0
    g = np.array([math.erf(v) / v for v in np.sqrt(u)])
    powers = np.vander(u, p + q + 1, increasing=True)
    system = np.hstack([powers[:, : p + 1], -g[:, None] * powers[:, 1 : q + 1]])
    lawson = np.full(points, 1.0 / points)
    denominator = np.ones(points)
    for _ in range(rounds):
        scale = lawson / (g * denominator)
        solution = np.linalg.lstsq(system * scale[:, None], g * scale, rcond=None)[0]
        numerator_c, denominator_c = solution[: p + 1], np.concatenate([[1.0], solution[p + 1 :]])
        denominator = powers[:, : q + 1] @ denominator_c
        error = np.abs(powers[:, : p + 1] @ numerator_c / denominator - g) / g
        lawson = lawson * np.sqrt(error / error.max()) + 1e-15
        lawson /= lawson.sum()
    return [float(c) for c in numerator_c], [float(c) for c in denominator_c]


#: ``_erf_coefficients()`` as stored (tests/test_vector_math.py refits and compares)
_ERF_NUMERATOR = [
    1.1283790949752914, 0.20706038838451227, 0.05151596305682181, 0.0039875034177765944,
    0.0001471903099116332, -1.941501190382694e-06, 1.9104933024483017e-08,
]
_ERF_DENOMINATOR = [
    1.0, 0.5168337626765999, 0.11794359310367776, 0.014952194320238553, 0.001020291259535548,
]


def _horner(u, coefficients: list[float]):
    value = _f32(coefficients[-1])
    for c in coefficients[-2::-1]:
        value = value * u + _f32(c)
    return value


def vector_erf(x):
    """``erf(x)`` of a float32 expression as arithmetic LLVM vectorizes (see the module)."""
    z = tirx.Var("erf_z", "float32")
    u = tirx.Var("erf_u", "float32")
    ratio = _horner(u, _ERF_NUMERATOR) / _horner(u, _ERF_DENOMINATOR)
    body = tirx.Let(u, z * z, _clamp(z * ratio, 1.0))
    return tirx.Let(z, _clamp(x, 4.0), body)


def _clamp(x, bound: float):
    """``x`` clamped to ``[-bound, bound]`` by comparisons, which a NaN fails: it stays NaN."""
    high, low = _f32(bound), _f32(-bound)
    return tirx.Select(x > high, high, tirx.Select(x < low, low, x))


#: the functions :func:`vectorize_math` rewrites, by TIR op name
_REWRITES = {
    "tirx.exp": vector_exp,
    "tirx.sigmoid": vector_sigmoid,
    "tirx.erf": vector_erf,
}
ALL_OPS = frozenset(name.split(".")[1] for name in _REWRITES)


def vectorize_math(func: tirx.PrimFunc, ops=ALL_OPS) -> tirx.PrimFunc:
    """``func`` with every float32 call of ``ops`` (names of :data:`ALL_OPS`) rewritten (see the
    module); ``func`` itself when it has none."""
    names = {f"tirx.{op}" for op in ops}
    found = []

    def wanted(call) -> bool:
        op = call.op
        return isinstance(op, tvm.ir.Op) and op.name in names and str(call.ty) == "float32"

    def rewrite(call):
        return _REWRITES[call.op.name](call.args[0]) if wanted(call) else call

    tvm_ffi.structural_walk(
        func.body, (tvm.ir.expr.Call, lambda call: found.append(call) if wanted(call) else None)
    )
    if not found:
        return func
    return func.with_body(tvm_ffi.structural_map(func.body, (tvm.ir.expr.Call, rewrite)))


__all__ = ["ALL_OPS", "vector_erf", "vector_exp", "vector_sigmoid", "vectorize_math"]
