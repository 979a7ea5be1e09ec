"""TE compute definitions (one file per op)."""

from .multiscale_roi_align import (
    multiscale_roi_align,
    multiscale_roi_align_nchw,
    multiscale_roi_align_nhwc,
)
from .ps_roi_align import ps_roi_align, ps_roi_align_nchw, ps_roi_align_nhwc
from .quantized_roi_align import (
    quantized_roi_align,
    quantized_roi_align_nchw,
    quantized_roi_align_nhwc,
)
from .roi_align import roi_align, roi_align_nchw, roi_align_nhwc
from .roi_align_rotated import roi_align_rotated, roi_align_rotated_nchw, roi_align_rotated_nhwc

__all__ = [
    "multiscale_roi_align",
    "multiscale_roi_align_nchw",
    "multiscale_roi_align_nhwc",
    "ps_roi_align",
    "ps_roi_align_nchw",
    "ps_roi_align_nhwc",
    "quantized_roi_align",
    "quantized_roi_align_nchw",
    "quantized_roi_align_nhwc",
    "roi_align",
    "roi_align_nchw",
    "roi_align_nhwc",
    "roi_align_rotated",
    "roi_align_rotated_nchw",
    "roi_align_rotated_nhwc",
]
