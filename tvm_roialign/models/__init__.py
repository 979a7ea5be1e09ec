"""Models through TVM with tvm-roialign: torchvision's Mask R-CNN (:mod:`.maskrcnn`).

The torch-dependent modules are imported on first use, so that ``import tvm_roialign.models``
needs neither torch nor torchvision.
"""

from __future__ import annotations

import importlib

__all__ = ["maskrcnn"]


def __getattr__(name):
    if name == "maskrcnn":
        return importlib.import_module(f"{__name__}.maskrcnn")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
