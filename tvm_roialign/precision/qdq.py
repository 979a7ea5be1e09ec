"""The graph phase of an ONNX QDQ model (:func:`qdq_passes`, a part of phase 1 of
:func:`~tvm_roialign.pipeline_phases.prepare_pipeline`): its quantized layers on the target's int8
kernels with its own scales (:class:`~tvm_roialign.passes.QDQContractions`) where the kernels take
its weights, else as imported (fake-quant float) with a note saying why (:func:`qdq_note`); and the
choice, shared with a calibrated int8 build, of the contractions fp32 runs faster (:func:`int8_keeps`:
a reduction too short for the kernels, on AVX2 the convs Winograd takes).
"""

from __future__ import annotations

import warnings

import numpy as np
import tvm


def qdq_passes(target: tvm.target.Target, precision: str, calibration, keep_fp32, weights: int,
               winograd: int = 0, reference_side: int = 320) -> list:
    """:class:`~tvm_roialign.passes.QDQContractions` where ``target`` has int8 kernels that take the
    model's weights (``weights``: their largest magnitude, :func:`qdq_note`), else nothing (the model
    runs as imported, fake-quant float), with a warning; a warning too where ``precision`` is bf16
    (a QDQ model keeps its own quantization), a ValueError for a calibration or kept layers
    (nothing is calibrated). The layers :func:`int8_keeps` picks (``winograd``: Winograd's tile)
    stay as imported, as they stay fp32 in a calibrated int8 build."""
    from ..passes import QDQContractions
    from ..schedules.int8_contraction import int8_weight_limit

    if calibration is not None or keep_fp32:
        raise ValueError(
            "calibration and keep_fp32 apply to fp32 models: this model is already quantized (ONNX QDQ) "
            "and keeps its own scales"
        )
    if precision == "bf16":
        warnings.warn(
            "precision bf16: the model is already quantized (ONNX QDQ): it keeps its own int8 "
            "quantization, not bf16",
            stacklevel=3,
        )
    note = qdq_note(target, weights)
    if note is not None:
        warnings.warn(note, stacklevel=3)
        return []
    kind = llvm_int8_kind(target)
    keep = int8_keeps(kind, winograd, reference_side)
    return [QDQContractions(weight_limit=int8_weight_limit(kind), keep_layer=keep)]


def int8_keeps(kind: str | None, winograd: int, reference_side: int):
    """A predicate of a conv or matmul call true for the contractions the int8 kernels ``kind``
    should leave in fp32, judged from the call's types (a QDQ model's weights are not constants
    yet): those whose reduction is too short for the kernels to pay
    (:func:`~.schedules.int8_contraction.int8_pays`), and, where the kernels leave them to it, the
    convs Winograd takes (:func:`~.schedules.int8_contraction.int8_leaves_winograd_convs`)."""
    from ..passes.winograd import tile_set, winograd_geometry
    from ..schedules.int8_contraction import int8_leaves_winograd_convs, int8_pays

    tiles = tile_set(winograd) if winograd and int8_leaves_winograd_convs(kind) else None

    def keep(call):
        reduction = _reduction(call)
        if reduction is not None and not int8_pays(kind, reduction):
            return True
        return tiles is not None and winograd_geometry(call, tiles, reference_side) is not None

    return keep


def _reduction(call) -> int | None:
    """The reduction length of a conv2d (taps x input channels) or matmul ``call``, when static."""
    from ..passes._mutator import tensor_shape

    if call.op.name == "relax.nn.conv2d":
        shape, layout = tensor_shape(call.args[1]), str(call.attrs.kernel_layout)
        lengths = [shape[layout.index(a)] for a in "HWI"] if shape is not None else [None]
    else:
        shape = tensor_shape(call.args[0])
        lengths = shape[-1:] if shape else [None]
    return None if None in lengths else int(np.prod(lengths))


def llvm_int8_kind(target: tvm.target.Target) -> str | None:
    """:func:`~.schedules.int8_contraction.int8_instructions` of an llvm ``target``, None for others."""
    from ..schedules.int8_contraction import int8_instructions

    return int8_instructions(target) if target.kind.name == "llvm" else None


def qdq_note(target: tvm.target.Target, weights: int = 127) -> str | None:
    """Why an ONNX QDQ model whose int8 weights reach ``weights`` in magnitude
    (:func:`~.passes.qdq_contractions.qdq_weight_peak`) runs its quantized layers in float
    (fake-quant) on ``target``: it has no int8 kernels, or AVX2's, which take weights up to 64
    (ONNX Runtime's ``reduce_range``); None where its kernels take them."""
    from ..schedules.int8_contraction import int8_weight_limit
    from ..target import describe

    kind = llvm_int8_kind(target)
    if kind is None:
        return (
            f"quantized (ONNX QDQ) model: target {describe(target)} has no int8 kernels (AMX-INT8, "
            "AVX512-VNNI, AVX2, AArch64 dot product); its quantized layers run in float (fake-quant)"
        )
    limit = int8_weight_limit(kind)
    if weights <= limit:
        return None
    return (
        f"quantized (ONNX QDQ) model: its int8 weights reach {weights}, and the int8 kernels of target "
        f"{describe(target)} ({kind}) take up to {limit} (ONNX Runtime's quantize_static(..., "
        "reduce_range=True) keeps to it); its quantized layers run in float (fake-quant)"
    )


__all__ = ["int8_keeps", "llvm_int8_kind", "qdq_note", "qdq_passes"]
