"""Relax passes of tvm-roialign.

* :mod:`.layout`: ``FRelaxInferLayout`` for ``relax.vision.roi_align`` (and RoIAlign-like ops,
  :func:`~.layout.infer_layout_roi_align_like`), registered on import of the package;
* :class:`ConvertLayout`: Relay-style ``ConvertLayout`` (Relay op names, ``"default"``, no
  conversion to layouts without legalization) followed by :class:`FoldPermuteDims`.
"""

from . import layout
from .convert_layout import ConvertLayout, FoldPermuteDims
from .layout import register

__all__ = ["ConvertLayout", "FoldPermuteDims", "layout", "register"]
