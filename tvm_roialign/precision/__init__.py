"""A build's precision: fp32, bf16 or int8 for a target, decided once (:func:`resolve`, a
:class:`PrecisionPlan` that the caller hands down to the pipeline), the layers kept in fp32
(:mod:`.layers`), int8's calibration inputs (:mod:`.calibration`) and the graph phase of an ONNX
QDQ model (:mod:`.qdq`)."""

from . import policy
from .policy import *  # noqa: F403 - the policy's names are the package's

__all__ = policy.__all__
