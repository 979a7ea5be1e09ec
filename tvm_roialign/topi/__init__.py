"""TE compute definitions (one file per op)."""

from .multiscale_roi_align import (
    multiscale_roi_align,
    multiscale_roi_align_nchw,
    multiscale_roi_align_nhwc,
)
from .roi_align import roi_align, roi_align_nchw, roi_align_nhwc

__all__ = [
    "multiscale_roi_align",
    "multiscale_roi_align_nchw",
    "multiscale_roi_align_nhwc",
    "roi_align",
    "roi_align_nchw",
    "roi_align_nhwc",
]
