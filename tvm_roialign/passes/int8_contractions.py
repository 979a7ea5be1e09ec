"""Convolutions and matmuls with constant weights as int8 contractions (``precision="int8"``):
post-training static quantization.

Each ungrouped NHWC ``conv2d`` and each 2-D ``matmul`` of a constant weight, in float32, becomes
a call of :func:`tvm_roialign.topi.int8_contraction.int8_contraction`: the weight quantized to int8
per output channel (symmetric) and packed here, once; the input activation quantized to uint8 with
one scale and zero point per tensor, from the range calibration saw; the products summed in int32
and dequantized to fp32 in the kernel's write-back, so every other op (bias, residual adds, ReLU,
pooling) stays as it was and fuses into that write-back. A conv over fewer than a multiple of
:data:`TAP_CHANNELS` input channels (an RGB stem) has narrow taps: each kernel row's run of inputs
is padded to :data:`~tvm_roialign.topi.contraction_geometry.ROW_TAP_DEPTH` (the kernels' choice
of what pays, :func:`~tvm_roialign.precision.qdq.int8_keeps`, counts that padding).

Where the input is quantized: by a call of its own (:func:`_Int8Rewriter._prequantize`) where the
contraction reads it alone, or where it is a conv of more than one tap (whose gather would quantize
each input once per tap), shared by every contraction that quantizes the same tensor alike (a
ResNet block's first conv and its downsampling 1x1); operator fusion then puts that call in the
producer's write-back (a second, uint8 output where the fp32 one is read elsewhere, as by a
residual add). Else in the contraction's gather.

Calibration (:func:`observe_ranges`): a copy of the module in which each such contraction's input
passes through an observer (a packed function keeping a sample of its values and its extremes) is
compiled in fp32 and run on the calibration inputs, and each input's range chosen to minimize the
quantization's mean squared error on its samples (:func:`clipped_range`). The contractions are
numbered in the order the rewriter visits them, the same in the observed copy and in the rewrite.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import tvm
from tvm import relax

from ..topi.contraction_geometry import ROW_TAP_DEPTH
from ..topi.int8_contraction import (
    ActivationQuant,
    dequant_constants,
    int8_contraction,
    pack_weight_quads,
    quantize_activation,
    quantize_weight,
)
from ._contraction_spec import TAP_CHANNELS, call_contraction, contraction_spec, dims, unpadded_weight
from ._mutator import FunctionRewriter, rewrite_module

#: values of each observed tensor kept per calibration run (a strided subsample, and its extremes)
SAMPLES = 1 << 16

#: the shares of the observed range tried for a tensor's quantization range (:func:`clipped_range`)
CLIP_FACTORS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2)

#: the global packed function the observed copy calls: ``(x, (index,)) -> copy of x``
OBSERVER = "tvm_roialign.int8_observe"


class _Int8Rewriter(FunctionRewriter):
    """With ``ranges`` None: each taken contraction's input through the observer; else each
    taken contraction as an int8 one, its input quantized over ``ranges[i]`` (kept in fp32 where
    that is None, or where ``keep`` of its ``[K, N]`` weight is true)."""

    ranges: Sequence | None = None
    keep: Callable | None = None
    keep_call: Callable | None = None
    weight_limit: int = 127

    def __init__(self, mod):
        super().__init__(mod)
        self.index = 0
        self.single_use = single_use_vars(mod)
        # (source, quantization) -> its uint8 copy, made once for every contraction reading it alike
        self.quantized: dict = {}

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        source = call.args[0] if call.args else None
        call = self.visit_expr_post_order(call)
        # narrow taps (an RGB stem): each kernel row's run of inputs padded to ROW_TAP_DEPTH
        spec = contraction_spec(call, row_tap_depth=ROW_TAP_DEPTH)
        if spec is None:
            return call
        index, self.index = self.index, self.index + 1
        if self.ranges is not None and (self.ranges[index] is None or self._kept(call, spec)):
            return call  # kept in fp32
        self.changed = True
        if self.ranges is None:
            x = call.args[0]
            observed = self.builder_.emit(
                relax.call_pure_packed(OBSERVER, x, relax.ShapeExpr([index]), ty_args=x.ty)
            )
            return relax.Call(call.op, [observed, *call.args[1:]], call.attrs, call.ty_args)
        act = ActivationQuant.from_range(*self.ranges[index])
        return self._emit(call, spec, act, prequantize=self._prequantize(source, call.args[0], spec, act))

    def visit_binding_block_(self, block):  # pylint: disable=arguments-renamed
        return self._in_scope(super().visit_binding_block_, block)

    def visit_dataflow_block_(self, block):  # pylint: disable=arguments-renamed
        return self._in_scope(super().visit_dataflow_block_, block)

    def _in_scope(self, visit, block):
        """``visit(block)`` with the quantized copies of the enclosing blocks (whose vars this block
        sees) and its own, which no later block outside it sees (a dataflow block's vars, a branch's)."""
        outer = self.quantized
        self.quantized = dict(outer)
        try:
            return visit(block)
        finally:
            self.quantized = outer

    def _prequantize(self, source, x, spec, act: ActivationQuant) -> bool:
        """Whether the contraction's input is quantized by a call of its own: where it reads it
        alone (the producer then writes uint8 only), where another contraction already quantized it
        alike (the same call), or where it is a conv with more than one tap (its gather would
        quantize each input once per tap; the copy costs one pass over the input). A 1x1 conv or a
        matmul sharing its fp32 input with another reader quantizes in its gather (one pass
        either way)."""
        geometry = spec[1]
        if geometry is not None and geometry.row_taps:
            return False  # its padded copy quantizes each input once
        if source in self.single_use or (x, act) in self.quantized:
            return True
        return geometry is not None and geometry.kh * geometry.kw > 1 and isinstance(x, relax.Var)

    def _kept(self, call, spec) -> bool:
        if self.keep_call is not None and self.keep_call(call):
            return True
        if self.keep is None:
            return False
        return bool(self.keep(unpadded_weight(spec)))

    def _emit(self, call, spec, act: ActivationQuant, prequantize: bool):
        matrix, geometry, rows, out_shape = spec
        q, w_scale = quantize_weight(matrix, self.weight_limit)
        x = call.args[0]
        if prequantize and geometry is not None:
            # a conv's input as it is (a matmul's may be reshaped first): one copy for every reader
            key = (x, act)
            if key not in self.quantized:
                self.quantized[key] = _emit_quantized(self.builder_, x, act)
            x, prequantize = self.quantized[key], False
        return emit_int8_contraction(self.builder_, x, q, w_scale, act, rows, out_shape, geometry,
                                     prequantize)


def single_use_vars(mod: tvm.IRModule) -> set:
    """The variables of ``mod``'s Relax functions that one binding (or the returned value) reads."""
    counts: dict = {}

    def count(expr):
        seen = set()

        def visit(node):
            if isinstance(node, relax.Var) and node not in seen:
                seen.add(node)
                counts[node] = counts.get(node, 0) + 1

        relax.analysis.post_order_visit(expr, visit)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            for block in func.body.blocks:
                for binding in block.bindings:
                    count(binding.value)
            count(func.body.body)
    return {var for var, n in counts.items() if n == 1}


def _emit_quantized(builder, x, act: ActivationQuant):
    """``x`` quantized by ``act`` in a call of its own (:func:`quantize_activation`)."""
    quantize = functools.partial(quantize_activation, act=act)
    return builder.emit(builder.call_te(quantize, x, primfunc_name_hint="int8_quantize"))


def emit_int8_contraction(builder, x, q, w_scale, act: ActivationQuant, rows, out_shape, geometry,
                          prequantize: bool = False):
    """The call of :func:`~tvm_roialign.topi.int8_contraction.int8_contraction` on ``x`` (a conv's
    input when ``geometry`` is given, else a matmul's, reshaped to ``[rows, K]``) with the int8
    weight ``q`` ``[K, N]``, its per-channel ``w_scale`` and the input's quantization ``act``.
    ``prequantize`` (``x`` read by this contraction alone): ``x`` quantized to uint8 by a call of
    its own first (:func:`~tvm_roialign.topi.int8_contraction.quantize_activation`), which operator
    fusion then puts in the write-back of ``x``'s producer, so that ``x`` is never written in
    fp32 (the same bytes the kernel would quantize)."""
    if geometry is None and len(dims(x)) != 2:
        x = builder.emit(relax.op.reshape(x, [rows, q.shape[0]]))
    if prequantize:
        x = _emit_quantized(builder, x, act)
    correction, scale = dequant_constants(q, w_scale, act)
    constants = [relax.const(v) for v in (pack_weight_quads(q), correction, scale)]
    return call_contraction(builder, int8_contraction, "int8", x, *constants, rows=rows,
                            reduction=int(q.shape[0]), out_shape=out_shape, geometry=geometry, act=act)


def observed_module(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each contraction the pass takes reading its input through :data:`OBSERVER`."""
    return rewrite_module(_Int8Rewriter, mod, ranges=None)


def observe_ranges(mod: tvm.IRModule, inputs: Sequence, run: Callable) -> list[tuple[float, float]]:
    """The quantization range of each contraction's input (:func:`clipped_range` of what it saw)
    over the calibration ``inputs`` (each a list of
    NumPy arrays, ``main``'s parameters): ``run(observed_module)`` returns a callable that runs
    ``main`` on such a list."""
    observed = observed_module(mod)
    if observed is mod:
        return []
    seen: dict[int, list[np.ndarray]] = {}

    def observe(x, which):
        array = x.numpy()
        flat = array.reshape(-1)
        step = max(1, flat.size // SAMPLES)
        extremes = np.array([flat.min(), flat.max()], np.float32)
        seen.setdefault(int(which[0]), []).append(np.concatenate([extremes, flat[::step]]))
        return tvm.runtime.tensor(array)

    tvm.register_global_func(OBSERVER, observe, override=True)
    main = run(observed)
    for arrays in inputs:
        main(*arrays)
    count = _observers(observed)
    unseen = [i for i in range(count) if i not in seen]
    if unseen:
        warnings.warn(
            f"precision int8: {len(unseen)} of {count} contractions never ran on the calibration inputs "
            "(a branch they did not take) and stay fp32", stacklevel=2)
    return [clipped_range(np.concatenate(seen[i])) if i in seen else None for i in range(count)]


def _observers(observed: tvm.IRModule) -> int:
    """How many contractions :func:`observed_module` routed through :data:`OBSERVER`."""
    count = 0

    def visit(node):
        nonlocal count
        callee = node.args[0] if isinstance(node, relax.Call) and node.args else None
        if isinstance(callee, relax.ExternFunc) and callee.global_symbol == OBSERVER:
            count += 1

    for _, func in observed.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return count


def clipped_range(samples: np.ndarray) -> tuple[float, float]:
    """The range, among ``[min, max]`` of ``samples`` scaled by each of :data:`CLIP_FACTORS`, whose
    uint8 quantization has the smallest mean squared error on ``samples`` (values beyond it
    clamped): an outlier then does not coarsen the steps of every other value."""
    samples = samples.astype(np.float32)
    low, high = float(samples.min()), float(samples.max())
    best, best_error = (low, high), np.inf
    for factor in CLIP_FACTORS:
        act = ActivationQuant.from_range(low * factor, high * factor)
        restored = (act.quantize(samples).astype(np.float32) - act.zero) * np.float32(act.scale)
        error = float(np.mean((restored - samples) ** 2))
        if error < best_error:
            best, best_error = (low * factor, high * factor), error
    return best


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.Int8Contractions")
class Int8Contractions:  # pylint: disable=too-few-public-methods
    """Constant-weight conv2d (NHWC) and matmul as int8 contractions (see module docstring).
    ``ranges``: each contraction's calibrated input range, in visiting order; or None, and
    ``inputs`` (or a function of the module returning them) and ``run`` as :func:`observe_ranges`
    takes them, to calibrate when the pass runs. ``keep_fp32``: the contractions left in fp32, as
    positions (in that order; negative from the end), or as a predicate of a contraction's
    ``[K, N]`` weight (as :class:`~.bf16_contractions.BF16Contractions` takes it; a detector's
    layers by name: :func:`~tvm_roialign.precision.layers.keeps_fp32`). ``weight_limit``:
    the weights' range ``[-limit, limit]`` of the target's kernels; ``keep_call``: a predicate of a
    contraction's call, true for those another rewrite runs faster in fp32 (Winograd's convs on
    AVX2)."""

    def __init__(self, ranges: Sequence | None = None, inputs: Sequence = (), run: Callable | None = None,
                 keep_fp32: Sequence[int] | Callable = (), weight_limit: int = 127,
                 keep_call: Callable | None = None):
        self.ranges = ranges
        self.inputs = inputs
        self.run = run
        self.keep = keep_fp32 if callable(keep_fp32) else None
        self.keep_fp32 = () if callable(keep_fp32) else tuple(keep_fp32)
        self.weight_limit = int(weight_limit)
        self.keep_call = keep_call

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        ranges = self.ranges
        if ranges is None:
            inputs = self.inputs(mod) if callable(self.inputs) else self.inputs
            ranges = observe_ranges(mod, inputs, self.run)
        ranges = list(ranges)
        for position in self.keep_fp32:
            if not -len(ranges) <= position < len(ranges):
                raise ValueError(
                    f"keep_fp32: position {position} is outside the model's {len(ranges)} contractions"
                )
            ranges[position] = None
        if not any(r is not None for r in ranges):
            return mod
        # the predicates become class attributes: unbound
        unbound = {k: staticmethod(v) if v is not None else None
                   for k, v in (("keep", self.keep), ("keep_call", self.keep_call))}
        return rewrite_module(_Int8Rewriter, mod, ranges=ranges, weight_limit=self.weight_limit, **unbound)


__all__ = [
    "OBSERVER",
    "TAP_CHANNELS",
    "Int8Contractions",
    "clipped_range",
    "emit_int8_contraction",
    "observe_ranges",
    "observed_module",
    "single_use_vars",
]
