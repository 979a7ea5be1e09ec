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

``erf(x) = x * g(x^2)`` with ``g(u) = erf(sqrt(u)) / sqrt(u)``, an entire function of ``u``, as
its Chebyshev interpolant of degree :data:`_ERF_DEGREE` on ``[0, 16]`` (coefficients computed
here from :func:`math.erf`), evaluated by Clenshaw's recurrence: within ``3e-7`` of the exact
value (a few units in the last place near 1, relative error ``~1e-7`` near 0); beyond
``|x| = 4`` float32's ``erf`` is ``+-1``; a NaN stays NaN.
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
#: degree of the Chebyshev interpolant of ``erf(sqrt(u)) / sqrt(u)`` on ``[0, _ERF_U]``
_ERF_DEGREE = 16
_ERF_U = 16.0


def _f32(value: float) -> tirx.FloatImm:
    return tirx.FloatImm("float32", value)


def vector_exp(x):
    """``exp(x)`` of a float32 expression as arithmetic LLVM vectorizes (see the module)."""
    n = tirx.floor(x * _f32(1.0 / math.log(2.0)) + _f32(0.5))
    n = tirx.max(tirx.min(n, _f32(128.0)), _f32(-126.0))
    r = x - n * _f32(_LN2_HIGH) - n * _f32(_LN2_LOW)
    poly = _f32(1.0 / math.factorial(_DEGREE))
    for k in range(_DEGREE - 1, -1, -1):
        poly = poly * r + _f32(1.0 / math.factorial(k))
    # 2^n for n <= 127 from its bits; n = 128 (x just below ln(FLT_MAX)) as 2^127 * 2
    exponent = tirx.Cast("int32", tirx.min(n, _f32(127.0))) + tirx.IntImm("int32", 127)
    power = tirx.reinterpret("float32", tirx.shift_left(exponent, tirx.IntImm("int32", 23)))
    poly = tirx.Select(n > _f32(127.0), poly * _f32(2.0), poly)
    scaled = poly * power
    return tirx.Select(x < _f32(_LOWEST), _f32(0.0), scaled)


def _erf_coefficients() -> list[float]:
    """Chebyshev coefficients of ``erf(sqrt(u)) / sqrt(u)`` on ``[0, _ERF_U]`` (interpolation at
    the Chebyshev points of the first kind)."""
    k = np.arange(_ERF_DEGREE + 1)
    t = np.cos(np.pi * (k + 0.5) / (_ERF_DEGREE + 1))
    z = np.sqrt((t + 1.0) * _ERF_U / 2.0)
    g = np.array([math.erf(v) / v for v in z])
    return [float(c) for c in np.polynomial.chebyshev.chebfit(t, g, _ERF_DEGREE)]


_ERF_COEFFICIENTS = _erf_coefficients()


def vector_erf(x):
    """``erf(x)`` of a float32 expression as arithmetic LLVM vectorizes (see the module)."""
    z = tirx.Var("erf_z", "float32")
    t = tirx.Var("erf_t", "float32")
    # Clenshaw: b_k = 2 t b_{k+1} - b_{k+2} + c_k, value = t b_1 - b_2 + c_0; each b a Let
    names = [tirx.Var(f"erf_b{k}", "float32") for k in range(_ERF_DEGREE + 1)]
    c = _ERF_COEFFICIENTS
    value = t * names[1] - names[2] + _f32(c[0])
    erf = _clamp(z * value, 1.0)
    body = erf
    for k in range(1, _ERF_DEGREE + 1):
        later = names[k + 1] if k + 1 <= _ERF_DEGREE else _f32(0.0)
        latest = names[k + 2] if k + 2 <= _ERF_DEGREE else _f32(0.0)
        names_k = _f32(2.0) * t * later - latest + _f32(c[k])
        body = tirx.Let(names[k], names_k, body)
    body = tirx.Let(t, z * z * _f32(2.0 / _ERF_U) - _f32(1.0), body)
    return tirx.Let(z, _clamp(x, 4.0), body)


def _clamp(x, bound: float):
    """``x`` clamped to ``[-bound, bound]`` by comparisons, which a NaN fails: it stays NaN."""
    high, low = _f32(bound), _f32(-bound)
    return tirx.Select(x > high, high, tirx.Select(x < low, low, x))


#: the functions :func:`vectorize_math` rewrites, by TIR op name
_REWRITES = {
    "tirx.exp": vector_exp,
    "tirx.sigmoid": lambda x: _f32(1.0) / (_f32(1.0) + vector_exp(_f32(0.0) - x)),
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


__all__ = ["ALL_OPS", "vector_erf", "vector_exp", "vectorize_math"]
