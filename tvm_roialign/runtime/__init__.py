"""Running compiled detectors without PyTorch: TVM's runtime, NumPy and Pillow only.

Nothing in this package imports PyTorch or the compile-time parts of tvm-roialign, so a machine
with the core install (``apache-tvm``, ``numpy``, ``pillow``) runs a detector artifact::

    from tvm_roialign.runtime import Detector, read_image
    result = Detector("model.so")(read_image("photo.jpg"))   # boxes, labels, scores, masks

``Detector`` compares the library with the size and sha256 in ``model.so.json`` before loading
it (:func:`check_library`; ``verify=False`` for a library built elsewhere).

What it still needs: ``tvm`` itself, whose ``import`` loads all of TVM's Python side (the 0.27
wheel has no runtime-only package; where torch is installed, ``import tvm`` also imports it), and
the package's ``__init__`` (Python runs it before any subpackage), which registers the ops (about
0.15 s on top of ``import tvm``). Cores and host checks come from :mod:`tvm_roialign.host`
(standard library only).
"""

from .artifact_check import ArtifactError, check_library
from .bilinear import bilinear_weights, resize_bilinear
from .detector import (
    METADATA_KIND,
    Detector,
    detect_to_files,
    is_detector,
    read_image,
    read_metadata,
)
from .draw import draw_detections
from .loaded_vm import LoadedVM
from .masks import expand_boxes, paste_masks

__all__ = [
    "METADATA_KIND",
    "ArtifactError",
    "Detector",
    "LoadedVM",
    "bilinear_weights",
    "check_library",
    "detect_to_files",
    "draw_detections",
    "expand_boxes",
    "is_detector",
    "paste_masks",
    "read_image",
    "read_metadata",
    "resize_bilinear",
]
