"""A detector's precision plan, and which layers of a bf16 or int8
detector stay in fp32 (``compile_detector(..., fp32_layers=...)``, ``TVMMaskRCNN(...,
fp32_layers=...)`` for bf16, ``--fp32-layers``).

A bf16 (int8) build turns every constant-weight convolution and matmul it takes into a bf16 (int8)
contraction (:class:`~tvm_roialign.passes.BF16Contractions`,
:class:`~tvm_roialign.passes.Int8Contractions`). The layers named here are left in fp32. They
are named by the torchvision modules that hold them:

==================  ===========================================================
name                torchvision module
==================  ===========================================================
``backbone``        ``model.backbone.body`` (the ResNet / MobileNet trunk)
``fpn``             ``model.backbone.fpn``
``rpn``             ``model.rpn.head`` (its 3x3 conv, objectness and box deltas)
``box_head``        ``model.roi_heads.box_head`` (``fc6``, ``fc7``)
``box_predictor``   ``model.roi_heads.box_predictor`` (``cls_score``, ``bbox_pred``)
``mask_head``       ``model.roi_heads.mask_head``
``mask_predictor``  ``model.roi_heads.mask_predictor``
``keypoint_head``   ``model.roi_heads.keypoint_head``
``keypoint_predictor``  ``model.roi_heads.keypoint_predictor``
==================  ===========================================================

The graph the pass sees has no module names, so a layer is recognized by its weight: each
output channel's (column's) normalized first and third moments, sorted, which do not change when
the weight is transposed, its rows or columns permuted (layout conversion, a transposed conv as
a 1x1 conv) or its columns scaled (batch norm folded into the conv).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from .policy import REDUCED

#: the names :func:`parse_fp32_layers` takes, and the torchvision module each stands for
FP32_LAYERS = {
    "backbone": "backbone.body",
    "fpn": "backbone.fpn",
    "rpn": "rpn.head",
    "box_head": "roi_heads.box_head",
    "box_predictor": "roi_heads.box_predictor",
    "mask_head": "roi_heads.mask_head",
    "mask_predictor": "roi_heads.mask_predictor",
    "keypoint_head": "roi_heads.keypoint_head",
    "keypoint_predictor": "roi_heads.keypoint_predictor",
}

#: the layers a bf16 or int8 detector keeps in fp32 unless told otherwise, by precision: the box
#: predictor (the class scores that NMS and the detection cap rank; see docs/precision.md), and for
#: int8 the RPN head too, whose proposals the final boxes are refined from: with it in int8 the
#: synthetic reference Mask R-CNN kept 91.7% of fp32's confident detections at box IoU >= 0.9 (every
#: miss a box moved by a pixel or two, IoU 0.72-0.90), with it in fp32 95.6%, issue 44's bound being
#: 95% (the box head in fp32 instead: 93.4%; docs/int8.md). Its 3x3 conv then runs as fp32 Winograd.
DEFAULT_FP32_LAYERS = {"bf16": ("box_predictor",), "int8": ("box_predictor", "rpn")}

#: relative tolerance of two weights' fingerprints (fp32 rounding of a folded batch norm)
_RTOL = 1e-4


def parse_fp32_layers(value, option: str = "fp32_layers", precision: str = "bf16") -> tuple[str, ...]:
    """The layer names of ``value`` (a comma-separated string or an iterable of names;
    ``"none"`` or empty: none; None: :data:`DEFAULT_FP32_LAYERS` of ``precision``), or a one-line
    ``ValueError`` naming ``option`` and the choices."""
    if value is None:
        return DEFAULT_FP32_LAYERS.get(precision, DEFAULT_FP32_LAYERS["bf16"])
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [str(n).strip() for n in names if str(n).strip()]
    if names == ["none"]:
        return ()
    unknown = [n for n in names if n not in FP32_LAYERS]
    if unknown:
        raise ValueError(
            f"{option} must be 'none' or a comma-separated list of {', '.join(FP32_LAYERS)}; "
            f"got {unknown[0]!r}"
        )
    return tuple(dict.fromkeys(names))


def weight_matrices(model, layers: Iterable[str]) -> list[np.ndarray]:
    """The weights of the convolutions and linear layers under ``model``'s modules ``layers``
    (names of :data:`FP32_LAYERS`), each as a matrix with one column per output channel.
    ``model``: a torch module or an exported program (its ``state_dict``); a 4-D weight is
    taken both as a convolution's ``[out, in, kh, kw]`` and a transposed one's ``[in, out, kh, kw]``."""
    prefixes = tuple(FP32_LAYERS[name] + "." for name in layers)
    state = model.state_dict() if callable(getattr(model, "state_dict", None)) else model.state_dict
    out = []
    for name, weight in state.items():
        if not (name.startswith(prefixes) and name.endswith(".weight")) or weight.ndim not in (2, 4):
            continue
        w = weight.detach().double().numpy()
        out.append(w.reshape(w.shape[0], -1).T)
        if w.ndim == 4:
            out.append(w.reshape(w.shape[0], -1))
    return out


def fingerprint(matrix: np.ndarray) -> tuple:
    """``(size, sorted |m1|, sorted |m3|)`` of a ``[K, N]`` weight: per column, the normalized
    first and third moments (unchanged by permuting rows, by permuting columns once sorted, and
    by scaling a column)."""
    m = np.asarray(matrix, np.float64).reshape(matrix.shape[0], -1)
    m2 = np.sqrt((m * m).sum(axis=0))
    safe = np.where(m2 > 0, m2, 1.0)
    m1 = np.abs(m.sum(axis=0)) / safe
    m3 = np.abs((m**3).sum(axis=0)) / safe**3
    return m.size, np.sort(m1), np.sort(m3)


def keeps_fp32(model, layers: Iterable[str]) -> Callable[[np.ndarray], bool] | None:
    """A predicate for :class:`~tvm_roialign.passes.BF16Contractions` (``keep_fp32``): True for
    a weight matrix of one of ``model``'s ``layers``; None when there are none."""
    prints = [fingerprint(m) for m in weight_matrices(model, layers)]
    if not prints:
        return None

    def keep(matrix: np.ndarray) -> bool:
        size, m1, m3 = fingerprint(matrix)
        return any(
            size == s and len(m1) == len(a)
            and np.allclose(m1, a, rtol=_RTOL, atol=1e-7)
            and np.allclose(m3, b, rtol=_RTOL, atol=1e-7)
            for s, a, b in prints
        )

    return keep


def detector_plan(precision, target, fp32_layers=None, pieces: bool = False):
    """``(plan, layers kept in fp32)`` of a detector built for ``target``: ``precision`` a
    :class:`~.policy.PrecisionPlan` made by the caller, or what was asked for, resolved here
    (:func:`~.policy.resolve` without bf16 on AVX512-BF16 alone; its notes as warnings);
    ``fp32_layers`` by :func:`parse_fp32_layers`. ``pieces``: a detector run in pieces with PyTorch
    glue (``TVMMaskRCNN``), which int8 does not calibrate (a one-line ValueError)."""
    from .policy import PrecisionPlan, resolve

    asked = precision.asked if isinstance(precision, PrecisionPlan) else precision
    if pieces and asked == "int8":
        raise ValueError(
            "precision int8: TVMMaskRCNN's pieces are not calibrated; build the detector as one "
            "artifact (compile_detector, or tvm-roialign compile NAME --precision int8)"
        )
    if isinstance(precision, PrecisionPlan):
        return precision, parse_fp32_layers(fp32_layers, precision=precision.precision)
    plan = resolve(target, precision, avx512_bf16=False)
    kept = parse_fp32_layers(fp32_layers, precision=plan.precision)  # a bad value fails before the notes
    for note in plan.notes:
        warnings.warn(note, stacklevel=3)
    return plan, kept


def precision_options(model, plan, fp32_layers, calibration=None) -> dict:
    """The build options of a detector of ``plan`` (:func:`detector_plan`): ``precision`` (the
    plan) and, for bf16 and int8, ``keep_fp32`` (:func:`keeps_fp32` of ``fp32_layers``, parsed by
    :func:`parse_fp32_layers`); for int8 ``calibration`` (photos for the artifact's photo
    function: None for the sample photos, a directory, or a list of ``[H, W, 3]`` uint8 arrays)."""
    if plan.precision not in REDUCED:
        return {"precision": plan}
    kept = parse_fp32_layers(fp32_layers, precision=plan.precision)
    options = {"precision": plan, "keep_fp32": keeps_fp32(model, kept)}
    if plan.precision == "int8":
        if calibration is not None and not isinstance(calibration, (str, Path)):
            calibration = [[np.ascontiguousarray(photo, dtype=np.uint8)] for photo in calibration]
        options["calibration"] = calibration
    return options


__all__ = [
    "DEFAULT_FP32_LAYERS",
    "FP32_LAYERS",
    "detector_plan",
    "fingerprint",
    "keeps_fp32",
    "parse_fp32_layers",
    "precision_options",
    "weight_matrices",
]
