"""ONNX Runtime as a peer: the whole torchvision model through ``torch.onnx.export`` (TorchScript
exporter, opset 17), run on the CPU with as many threads as PyTorch uses.

The main job times it beside the TVM detector and PyTorch eager (same photo, runs interleaved);
``onnxruntime`` is an optional dependency (the ``onnx`` extra), :func:`available` says whether it is
installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
import time
import warnings

import numpy as np
import torch

#: opset of the export (the lowest at which torchvision's detection ops export cleanly)
OPSET = 17


def available() -> bool:
    """Whether ``onnxruntime`` and ``onnx`` are importable."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def cpu_session(path: str, threads: int):
    """An ONNX Runtime CPU session of the model at ``path``: ``threads`` intra-op threads, one
    inter-op thread, all graph optimizations, errors only in its log."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


@contextlib.contextmanager
def quantizer_workdir():
    """A temporary working directory for ONNX Runtime's quantizer, removed after: its
    pre-processing and ``quantize_static`` write scratch files (``sym_shape_infer_temp.onnx``,
    ``<uuid>.data`` of external weights) into the working directory. Paths given to the quantizer
    inside it must be absolute."""
    with tempfile.TemporaryDirectory(prefix="ort-quantize-") as tmp, contextlib.chdir(tmp):
        yield tmp


def quantized_int8(path: str, out: str, calibration: dict[str, list[np.ndarray]],
                   reduce_range: bool = False, op_types: list[str] | None = None) -> str:
    """ONNX Runtime's own int8 model of the ONNX file ``path``, written to ``out``:
    ``quantize_static`` after its pre-processing (skipped where its symbolic shape inference fails,
    as on vit_b_16's reshapes: ONNX Runtime calls it optional), QDQ, per-channel int8 weights, uint8
    activations, calibrated on ``calibration`` (input name -> one array per calibration call).
    ``reduce_range``: weights within +-64 (ONNX Runtime's option for CPUs without VNNI);
    ``op_types``: only these ops quantized and their tensors calibrated (``op_types_to_quantize``;
    None: ONNX Runtime's default, every op it can quantize, each tensor of the graph calibrated)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            count = len(next(iter(calibration.values())))
            self.feeds = iter([{k: v[i] for k, v in calibration.items()} for i in range(count)])

        def get_next(self):
            return next(self.feeds, None)

    path, out = os.path.abspath(path), os.path.abspath(out)
    with quantizer_workdir() as tmp:
        prepared = os.path.join(tmp, "prepared.onnx")
        try:
            quant_pre_process(path, prepared)
        except Exception:  # noqa: BLE001 - ONNX Runtime's shape inference: the file as it is
            prepared = path
        quantize_static(prepared, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        reduce_range=reduce_range, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8, op_types_to_quantize=op_types)
    return out


class OnnxRuntimeDetector:
    """``model`` (eval mode) exported to ONNX for one photo's size and opened in ONNX Runtime.

    Calling it on an image ``[3, H, W]`` returns torchvision's ``boxes, labels, scores, masks``
    as NumPy arrays. ``export_s`` and ``session_s`` say how long the export and the session
    creation took.
    """

    def __init__(self, model, image: torch.Tensor, threads: int | None = None):
        threads = threads or torch.get_num_threads()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "maskrcnn.onnx")
            t0 = time.perf_counter()
            # the TorchScript exporter warns about every trace-time constant of the detection code
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(model, ([image],), path, dynamo=False, opset_version=OPSET)
            self.export_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            self.session = cpu_session(path, threads)
            self.session_s = time.perf_counter() - t0
        self.threads = threads
        self._input = self.session.get_inputs()[0].name

    def __call__(self, image: torch.Tensor) -> list[np.ndarray]:
        return self.session.run(None, {self._input: image.numpy()})


def max_box_diff(ort_outputs, reference: dict) -> float | None:
    """Largest box difference of ONNX Runtime's detections from ``reference`` (torchvision's
    output), None where the detection counts differ."""
    boxes = np.asarray(ort_outputs[0])
    ref = reference["boxes"].numpy()
    if boxes.shape != ref.shape:
        return None
    return float(np.abs(boxes - ref).max()) if boxes.size else 0.0


__all__ = [
    "OPSET",
    "OnnxRuntimeDetector",
    "available",
    "cpu_session",
    "max_box_diff",
    "quantized_int8",
    "quantizer_workdir",
]
