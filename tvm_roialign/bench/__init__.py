"""The measuring harness: what the ``maskrcnn`` command and ``benchmarks/`` time and report.

Not the library's API (that is :mod:`tvm_roialign.models`: the detector
:class:`~tvm_roialign.models.maskrcnn.TVMMaskRCNN`, its pipeline, and the comparison of detections
:func:`~tvm_roialign.models.compare.compare_detections`); this subpackage measures them:

* :mod:`.job`: the main job, the TVM detector, PyTorch eager and ONNX Runtime on one photo, runs
  interleaved (:func:`run_maskrcnn_report`, :func:`compile_maskrcnn_report`, :class:`JobConfig`);
* :mod:`.report`: what it measured (:class:`MaskRCNNReport`, ``result.json`` with its schema);
* :mod:`.timing`: PyTorch eager on the same pieces, RoIAlign ours vs stock TVM;
* :mod:`.onnxruntime_peer`: the whole model through ``torch.onnx.export`` in ONNX Runtime.

Needs torch and torchvision (the ``torch`` extra); ONNX Runtime only for its peer (the ``onnx`` extra).
"""

from __future__ import annotations

from .job import JobConfig, compile_maskrcnn_report, run_maskrcnn_report
from .onnxruntime_peer import OnnxRuntimeDetector
from .onnxruntime_peer import available as onnxruntime_available
from .report import MaskRCNNReport
from .timing import time_roi_align, time_torch_pieces

__all__ = [
    "JobConfig",
    "MaskRCNNReport",
    "OnnxRuntimeDetector",
    "compile_maskrcnn_report",
    "onnxruntime_available",
    "run_maskrcnn_report",
    "time_roi_align",
    "time_torch_pieces",
]
