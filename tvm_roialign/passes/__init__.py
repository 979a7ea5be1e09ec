"""Relax passes of tvm-roialign.

* :mod:`.layout`: ``FRelaxInferLayout`` for ``relax.vision.roi_align`` (and RoIAlign-like ops,
  :func:`~.layout.infer_layout_roi_align_like`), registered on import of the package;
* :class:`ConvertLayout`: Relay-style ``ConvertLayout`` (Relay op names, ``"default"``, no
  conversion to layouts without legalization) followed by :class:`FoldPermuteDims` and
  :class:`FoldFlattenPermute`.
"""

from . import layout
from .convert_layout import ConvertLayout, FoldPermuteDims
from .fold_flatten_permute import FoldFlattenPermute
from .layout import register

__all__ = ["ConvertLayout", "FoldFlattenPermute", "FoldPermuteDims", "layout", "register"]


# the whole-model CPU pipeline's passes (see tvm_roialign.pipeline)
from .fold_batch_norm import FoldBatchNorm
from .fold_constant_numpy import FoldConstantNumPy
from .fold_layout_rewrite import FoldLayoutRewrite
from .pad_channels import PadChannels
from .winograd import WinogradConv2D

__all__ += [
    "FoldBatchNorm",
    "FoldConstantNumPy",
    "FoldLayoutRewrite",
    "PadChannels",
    "WinogradConv2D",
]
