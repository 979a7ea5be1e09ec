"""Convolutions and matmuls with constant weights as bf16 contractions (``precision="bf16"``).

Each ungrouped NHWC ``conv2d`` (a kernel larger than 1x1 over fewer than :data:`TAP_CHANNELS`
channels, an RGB stem, with each kernel row's taps padded to one tile's depth) and each 2-D
``matmul`` of a constant weight, in float32, becomes a call of
:func:`tvm_roialign.topi.bf16_contraction.bf16_contraction` (its channels static; its batch and image
size, so the GEMM's row count, may be symbolic, as in an any-size detector): the weight is rounded
to bf16 and packed into the pair layout here, once, at compile time; the products are accumulated in
fp32. The bias, residual add and ReLU after it are computed in its output stage, and its result is
bf16 rows ``[ceil(M / 32) * 32, C]`` where only contractions read it, else fp32 in the op's shape
(:mod:`.bf16_plan`):

    relu(conv2d(x, W) + b + r)  ->  call_tir(bf16_conv2d, x, pack(W), b, r)   # x, r: fp32 or bf16 rows
    matmul(x, W[K, N])          ->  call_tir(bf16_matmul, reshape(x, [M, K]), pack(W))

The schedule rule :class:`tvm_roialign.schedules.BF16Contraction` runs them on AMX tiles; the
pipeline applies this pass only for a target that has them.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..topi.bf16_contraction import TILE_K, Epilogue, bf16_contraction, pack_weight_vnni
from ._contraction_spec import TAP_CHANNELS, call_contraction, dims, unpadded_weight
from ._contraction_spec import contraction_spec as _contraction_spec
from ._mutator import FunctionRewriter, rewrite_module
from .bf16_plan import plan_chains


def contraction_spec(call):
    """What :func:`bf16_contraction` needs of ``call`` (a conv2d or matmul), or None when it is
    not converted."""
    return _contraction_spec(call, row_tap_depth=TILE_K)


def _is_bits(expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "uint16"


class _BF16Rewriter(FunctionRewriter):
    keep_fp32 = None  # the pass's keep_fp32

    def _converts(self, value) -> bool:
        spec = contraction_spec(value)
        if spec is None:
            return False
        return self.keep_fp32 is None or not self.keep_fp32(unpadded_weight(spec))

    def visit_function_(self, func):  # pylint: disable=arguments-renamed
        self._chains = plan_chains(func, self._converts)
        self._members = {m for chain in self._chains.values() for m in chain.members}
        return super().visit_function_(func)

    def visit_var_binding_(self, binding):  # pylint: disable=arguments-renamed
        chain = self._chains.get(binding.var)
        if binding.var in self._members:
            return  # computed inside the fused call of its chain
        if chain is None:
            super().visit_var_binding_(binding)
            return
        value = self._emit_chain(chain)
        if isinstance(binding.var, relax.DataflowVar):
            new_var = self.builder_.emit(value, name_hint=binding.var.name)
        else:
            new_var = self.builder_.emit_output(value, name_hint=binding.var.name)
        self.set_var_remap(binding.var, new_var)

    def _emit_chain(self, chain):
        self.changed = True
        call = chain.call
        matrix, geometry, rows, out_shape = contraction_spec(call)
        x = self.visit_expr(call.args[0])
        in_hw = None
        if _is_bits(x):
            in_hw = tuple(dims(call.args[0])[1:3]) if geometry is not None else None
        elif geometry is None and len(out_shape) > 2:
            x = self.builder_.emit(relax.op.reshape(x, [rows, dims(x)[-1]]))
        extra = []
        if chain.bias is not None:
            extra.append(relax.const(chain.bias))
        if chain.residual is not None:
            extra.append(self.visit_expr(chain.residual))
        epilogue = Epilogue(
            bias=chain.bias is not None,
            residual=chain.residual is not None,
            relu=chain.relu,
            bits_out=chain.bits_out,
        )
        packed = relax.const(pack_weight_vnni(matrix))
        return call_contraction(self.builder_, bf16_contraction, "bf16", x, packed, *extra, rows=rows,
                                reduction=int(matrix.shape[0]), out_shape=out_shape, geometry=geometry,
                                epilogue=epilogue, in_hw=in_hw)


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.BF16Contractions")
class BF16Contractions:  # pylint: disable=too-few-public-methods
    """Constant-weight conv2d (NHWC) and matmul as bf16 contractions (see module docstring).

    ``keep_fp32``: None, or called with each candidate's weight as a ``[K, N]`` matrix (one
    column per output channel); True leaves that call in fp32."""

    def __init__(self, keep_fp32=None):
        self.keep_fp32 = keep_fp32

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(
            _BF16Rewriter, mod, keep_fp32=staticmethod(self.keep_fp32) if self.keep_fp32 else None
        )


__all__ = ["TAP_CHANNELS", "BF16Contractions"]
