"""Which bf16 contractions take their epilogue along and which write bf16 activations.

For each contraction (a conv2d / matmul the pass converts) of a Relax function, its *chain*: the
elementwise ops after it that its output stage computes in fp32 on the sums, in this order and
each optional: ``+ bias`` (a constant along the channels), ``+ residual`` (a tensor of the same
shape), ``relu``; each op of the chain is the only user of the value before it. The chain's last
value is stored as bf16 rows (``[ceil(M / 32) * 32, channels]``, uint16 bit patterns) when every
user of it is another contraction reading it as its input, or a chain adding it as its residual:
those read bf16 directly (no rounding pass), and the activations between such layers stay bf16.
Any other user (pooling, a graph output, an op the chains do not take) keeps it fp32 in the op's
shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import relax

from ._mutator import const_value, is_op_call


@dataclass
class Chain:
    """A contraction and the epilogue its output stage computes (see module docstring)."""

    call: relax.Call
    bias: np.ndarray | None = None
    residual: relax.Var | None = None
    relu: bool = False
    #: the bindings the fused call replaces (the contraction and the chain but the last)
    members: list = field(default_factory=list)
    end: relax.Var | None = None
    bits_out: bool = False


def _users(func: relax.Function) -> tuple[dict, set]:
    """``var -> [(binding var, value)]`` of the function's bindings, and the vars the function
    returns or uses outside a plain binding (kept fp32)."""
    users: dict = {}
    escaping = set(relax.analysis.free_vars(func.body.body))
    for block in func.body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                escaping.update(relax.analysis.free_vars(binding.value))
                continue
            for var in relax.analysis.free_vars(binding.value):
                users.setdefault(var, []).append((binding.var, binding.value))
    return users, escaping


def _channel_bias(value: np.ndarray | None, channels) -> np.ndarray | None:
    """``value`` as a ``[channels]`` fp32 vector when it broadcasts along the channels only."""
    if value is None or value.dtype != np.float32 or not isinstance(channels, int):
        return None
    if value.ndim == 0 or value.shape[-1] != channels or any(d != 1 for d in value.shape[:-1]):
        return None
    return value.reshape(channels)


def _same_shape(a, b) -> bool:
    sa, sb = a.ty, b.ty
    if not (isinstance(sa, relax.TensorType) and isinstance(sb, relax.TensorType)):
        return False
    if str(sa.dtype) != "float32" or str(sb.dtype) != "float32":
        return False
    if not (isinstance(sa.shape, relax.ShapeExpr) and isinstance(sb.shape, relax.ShapeExpr)):
        return False
    return len(sa.shape.values) == len(sb.shape.values) and all(
        str(x) == str(y) for x, y in zip(sa.shape.values, sb.shape.values)
    )


def _extend(chain: Chain, cur, value, channels) -> bool:
    """Take the op ``value`` (the only user of ``cur``) into ``chain``; False when it does not fit."""
    if is_op_call(value, "relax.nn.relu") and not chain.relu:
        chain.relu = True
        return True
    if not is_op_call(value, "relax.add") or chain.relu:
        return False
    other = value.args[1] if value.args[0].same_as(cur) else value.args[0]
    if other.same_as(cur):
        return False
    if chain.bias is None and chain.residual is None:
        bias = _channel_bias(const_value(other), channels)
        if bias is not None:
            chain.bias = bias
            return True
    if chain.residual is None and isinstance(other, relax.Var) and _same_shape(other, cur):
        chain.residual = other
        return True
    return False


def _chain(var, call, users, escaping, claimed: set) -> Chain:
    """The chain of the contraction ``var = call``; an op another chain took is not taken."""
    chain = Chain(call)
    cur = var
    channels = call.ty.shape.values[-1]
    channels = int(channels) if hasattr(channels, "value") else None
    while cur not in escaping and len(users.get(cur, ())) == 1:
        user_var, value = users[cur][0]
        if user_var in claimed or not _extend(chain, cur, value, channels):
            break
        chain.members.append(cur)
        claimed.add(user_var)
        cur = user_var
    chain.end = cur
    return chain


def plan_chains(func: relax.Function, convertible) -> dict:
    """``end var -> Chain`` of every contraction of ``func`` (a binding whose value
    ``convertible(call)`` accepts), with ``bits_out`` decided (module docstring)."""
    users, escaping = _users(func)
    chains, claimed = {}, set()
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding) and convertible(binding.value):
                chain = _chain(binding.var, binding.value, users, escaping, claimed)
                chains[chain.end] = chain
    inputs = {}
    for chain in chains.values():
        start = chain.members[0] if chain.members else chain.end
        inputs[start] = chain.call.args[0]
    residuals = {}
    for chain in chains.values():
        for member in [*chain.members[1:], chain.end]:
            residuals[member] = chain.residual
    for end, chain in chains.items():
        readers = users.get(end, ())
        chain.bits_out = (
            end not in escaping
            and bool(readers)
            and all(_reads_bits(end, reader, inputs, residuals) for reader, _ in readers)
        )
    return chains


def _reads_bits(var, reader, inputs, residuals) -> bool:
    """Whether ``reader`` (a binding var) reads ``var`` as a contraction's input or a residual."""
    data = inputs.get(reader)
    if data is not None and data.same_as(var):
        return True
    residual = residuals.get(reader)
    return residual is not None and residual.same_as(var)


__all__ = ["Chain", "plan_chains"]
