"""A build's precision: fp32, bf16 or int8 for a target, decided once (:func:`resolve`, a
:class:`PrecisionPlan` that the caller hands down to the pipeline), the layers kept in fp32
(:mod:`.layers`), int8's calibration inputs (:mod:`.calibration`) and the graph phase of an ONNX
QDQ model (:mod:`.qdq`)."""

from .policy import (
    FP32,
    PRECISION_CHOICES,
    PRECISIONS,
    REDUCED,
    PrecisionPlan,
    auto_precision,
    check_keep_fp32,
    check_precision,
    generic_int8,
    int8_kernels,
    qdq_note,
    resolve,
)

__all__ = [
    "FP32",
    "PRECISIONS",
    "PRECISION_CHOICES",
    "REDUCED",
    "PrecisionPlan",
    "auto_precision",
    "check_keep_fp32",
    "check_precision",
    "generic_int8",
    "int8_kernels",
    "qdq_note",
    "resolve",
]
