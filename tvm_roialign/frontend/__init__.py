"""Importers with correct RoIAlign: the stock TVM importers plus tvm-roialign's converters.

* :func:`from_exported_program` (``torch.export``): torchvision ``roi_align`` with the half-pixel
  shift applied after scaling and to the coordinates only, and torchvision's ``MultiScaleRoIAlign``
  as the fused op ``relax.vision.multiscale_roi_align`` (export the model with :func:`export`, or
  inside :func:`fuse_multiscale_roi_align`, so that the pooler reaches the graph as one op).
* the RoI family through torch.export: torchvision ``ps_roi_align``, and rotated RoIAlign custom ops
  with the converters of :func:`roi_align_rotated_convert_map`;
* :func:`from_onnx`: ONNX ``RoiAlign`` opset 10 (``output_half_pixel``) and 16+ (``half_pixel``
  by default), int32/int64 ``batch_indices``, adaptive sampling, and ONNX's ``max`` mode; mmdeploy's
  ``mmcv::MMCVRoIAlignRotated`` as ``relax.vision.roi_align_rotated``.

The torch and ONNX parts are imported on first use, so that ``import tvm_roialign`` needs neither.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "from_exported_program": "torch",
    "export": "torch",
    "fuse_multiscale_roi_align": "torch",
    "convert_map": "torch",
    "roi_align_rotated_convert_map": "torch",
    "roi_align_rotated_converter": "torch",
    "from_onnx": "onnx",
    "RoiAlignConverter": "onnx",
    "RoiAlignRotatedConverter": "onnx",
}

__all__ = [
    "RoiAlignConverter",
    "RoiAlignRotatedConverter",
    "convert_map",
    "export",
    "from_exported_program",
    "from_onnx",
    "fuse_multiscale_roi_align",
    "onnx",
    "roi_align_rotated_convert_map",
    "roi_align_rotated_converter",
    "torch",
]


def __getattr__(name):
    if name in ("torch", "onnx"):
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
