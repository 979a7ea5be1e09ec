"""The graph phase of an ONNX QDQ model (:func:`qdq_passes`, a part of phase 1 of
:func:`~tvm_roialign.pipeline_phases.prepare_pipeline`): its quantized layers on the target's int8
kernels with its own scales (:class:`~tvm_roialign.passes.QDQContractions`) where the kernels take
its weights, else as imported (fake-quant float; :func:`~.policy.qdq_note` says why); and the
choice, shared with a calibrated int8 build, of the contractions fp32 runs faster (:func:`int8_keeps`:
a reduction too short for the kernels, on AVX2 the convs Winograd takes).
"""

from __future__ import annotations

import numpy as np


def qdq_passes(plan, calibration=None, keep_fp32=None, winograd: int = 0,
               reference_side: int = 320) -> list:
    """:class:`~tvm_roialign.passes.QDQContractions` where the plan (:func:`~.policy.resolve` of
    the QDQ model) runs int8, with its kernels' weight range, else nothing (the model runs as
    imported, fake-quant float; the plan's notes say why); a ValueError for a calibration or kept
    layers (nothing is calibrated). The layers :func:`int8_keeps` picks (``winograd``: Winograd's
    tile) stay as imported, as they stay fp32 in a calibrated int8 build."""
    from ..passes import QDQContractions

    if calibration is not None or keep_fp32:
        raise ValueError(
            "calibration and keep_fp32 apply to fp32 models: this model is already quantized (ONNX QDQ) "
            "and keeps its own scales"
        )
    if plan.precision != "int8":
        return []
    keep = int8_keeps(plan.kernels, winograd, reference_side)
    return [QDQContractions(weight_limit=plan.weight_limit, keep_layer=keep)]


def int8_keeps(kind: str | None, winograd: int, reference_side: int):
    """A predicate of a conv or matmul call true for the contractions the int8 kernels ``kind``
    should leave in fp32, judged from the call's types (a QDQ model's weights are not constants
    yet): those whose reduction is too short for the kernels to pay
    (:func:`~.schedules.lowp.int8.int8_pays`), and, where the kernels leave them to it, the
    convs Winograd takes (:func:`~.schedules.lowp.int8.int8_leaves_winograd_convs`)."""
    from ..passes.winograd import tile_set, winograd_geometry
    from ..schedules.lowp.int8 import int8_leaves_winograd_convs, int8_pays

    tiles = tile_set(winograd) if winograd and int8_leaves_winograd_convs(kind) else None

    def keep(call):
        reduction = _reduction(call)
        if reduction is not None and not int8_pays(kind, *reduction):
            return True
        return tiles is not None and winograd_geometry(call, tiles, reference_side) is not None

    return keep


def _reduction(call) -> tuple[int, int] | None:
    """The reduction length of a conv2d (taps x input channels) or matmul ``call``, when static,
    and the length the int8 kernels run it as (a narrow-tap conv's kernel rows each padded to
    :data:`~tvm_roialign.topi.contraction_geometry.ROW_TAP_DEPTH`)."""
    from ..passes._contraction_spec import narrow_taps
    from ..passes._mutator import tensor_shape
    from ..topi.contraction_geometry import ROW_TAP_DEPTH

    if call.op.name == "relax.nn.conv2d":
        shape, layout = tensor_shape(call.args[1]), str(call.attrs.kernel_layout)
        lengths = [shape[layout.index(a)] for a in "HWI"] if shape is not None else [None]
    else:
        shape = tensor_shape(call.args[0])
        lengths = shape[-1:] if shape else [None]
    if None in lengths:
        return None
    reduction = int(np.prod(lengths))
    if len(lengths) == 3 and narrow_taps(*lengths):
        return reduction, lengths[0] * ROW_TAP_DEPTH
    return reduction, reduction


__all__ = ["int8_keeps", "qdq_passes"]
