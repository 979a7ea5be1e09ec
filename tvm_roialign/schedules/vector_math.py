"""``exp`` and ``sigmoid`` of float32 in a form LLVM vectorizes.

TVM lowers ``T.exp`` (and ``T.sigmoid``, ``1 / (1 + exp(-x))``) on llvm to the ``llvm.exp``
intrinsic, which LLVM turns into one call of the C library's ``expf`` per lane: a vectorized
epilogue (the SiLU ``x * sigmoid(x)`` after every conv of EfficientNet) then runs a scalar call per
element. :func:`vectorize_exp` rewrites them, in a scheduled PrimFunc, into arithmetic alone:

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
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx

#: the two parts of ln 2 (the first has 9 significant bits, so ``n * _LN2_HIGH`` is exact)
_LN2_HIGH = 0.693359375
_LN2_LOW = math.log(2.0) - _LN2_HIGH
#: below this ``exp`` is not a normal float32 (ln of FLT_MIN)
_LOWEST = math.log(2.0**-126)
_DEGREE = 7


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


def _rewrite(call):
    name = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
    if name not in ("tirx.exp", "tirx.sigmoid") or str(call.ty) != "float32":
        return call
    x = call.args[0]
    if name == "tirx.exp":
        return vector_exp(x)
    return _f32(1.0) / (_f32(1.0) + vector_exp(_f32(0.0) - x))


def vectorize_exp(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every float32 ``exp`` and ``sigmoid`` rewritten (see the module); ``func``
    itself when it has none."""
    found = []

    def note(call):
        if isinstance(call.op, tvm.ir.Op) and call.op.name in ("tirx.exp", "tirx.sigmoid"):
            found.append(call)

    tvm_ffi.structural_walk(func.body, (tvm.ir.expr.Call, note), order="post")
    if not found:
        return func
    return func.with_body(tvm_ffi.structural_map(func.body, (tvm.ir.expr.Call, _rewrite)))


__all__ = ["vector_exp", "vectorize_exp"]
