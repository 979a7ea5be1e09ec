"""The AVX512-BF16 micro-kernel as a TensorIntrin: the AMX kernel's 32 x 32 block on ``vdpbf16ps``.

The description is the AMX kernel's (:mod:`~tvm_roialign.schedules.intrin.amx`):
``C[i, j] += f32(A[i, k]) * f32(B[0, k // 2, j, k % 2])`` over a 32 x 32 block and ``kc`` reduction elements,
the weights in the pair layout. The implementation runs the block as four groups of 8 rows, each held in 16
vector accumulators (8 rows x 2 vectors of 16 fp32); a step over one pair of reduction elements loads the pair
of weights of the 32 columns (two vectors of 16 pairs), broadcasts each row's pair of activations and issues
16 ``vdpbf16ps`` (each lane: ``acc += a0 * b0 + a1 * b1``).

TVM 0.27 hands LLVM a bf16 vector as 16-bit integers (its bf16 legalization), while the intrinsic
``llvm.x86.avx512bf16.dpbf16ps.512`` takes ``<32 x bfloat>``: the call goes through a small LLVM
function imported into the module (``pragma_import_llvm``) that takes the pairs as ``<16 x i32>``
and reinterprets them.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .amx import BF16
from .register import block_func, register_block_intrin

#: the imported LLVM function: ``acc + dot(a pairs, b pairs)`` with the pairs as 32-bit lanes
_DPBF16PS = "tvm_roialign_dpbf16ps"
_LLVM_IR = f"""
define internal <16 x float> @{_DPBF16PS}(<16 x float> %c, <16 x i32> %a, <16 x i32> %b) alwaysinline {{
  %x = bitcast <16 x i32> %a to <32 x bfloat>
  %y = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %c, <32 x bfloat> %x,
                                                          <32 x bfloat> %y)
  ret <16 x float> %r
}}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
"""

#: rows of a group (accumulators: rows x 2 vectors)
_GROUP = 8


def _dot(acc, a_pair, b_pairs):
    return tirx.call_pure_extern("float32x16", _DPBF16PS, acc, a_pair, b_pairs)


def _impl(kc: int, zero_init: bool):
    pairs = kc // 2

    @T.macro
    def body(A, B, C, sa, sc):
        acc = T.alloc_buffer((_GROUP, 32), "float32", scope="local")
        for g in T.serial(32 // _GROUP, annotations={"pragma_import_llvm": _LLVM_IR}):
            for r, h in T.grid(_GROUP, 2):
                if zero_init:
                    acc[r, T.ramp(h * 16, 1, 16)] = T.broadcast(T.float32(0), 16)
                else:
                    acc[r, T.ramp(h * 16, 1, 16)] = C[g * _GROUP + r, T.ramp(h * 16, 1, 16)]
            for p in range(pairs):
                for r in T.unroll(_GROUP):
                    for h in T.unroll(2):
                        acc[r, T.ramp(h * 16, 1, 16)] = _dot(
                            acc[r, T.ramp(h * 16, 1, 16)],
                            T.broadcast(
                                T.reinterpret("int32", A.vload([g * _GROUP + r, 2 * p], "uint16x2")), 16
                            ),
                            T.reinterpret("int32x16", B.vload([0, p, h * 16, 0], "uint16x32")),
                        )
            for r, h in T.grid(_GROUP, 2):
                C[g * _GROUP + r, T.ramp(h * 16, 1, 16)] = acc[r, T.ramp(h * 16, 1, 16)]

    return block_func(kc, "uint16", "uint16", 2, "float32", body)


def avx512_bf16_intrin(kc: int, zero_init: bool = False) -> str:
    """The name of the micro-kernel over ``kc`` reduction elements (a multiple of 32), registered
    with ``TensorIntrin`` on first use; ``zero_init`` as
    :func:`~tvm_roialign.schedules.intrin.amx.amx_bf16_intrin`."""
    return register_block_intrin("tvm_roialign_avx512_bf16", BF16.step, kc, zero_init, BF16.desc, _impl)


__all__ = ["avx512_bf16_intrin"]
