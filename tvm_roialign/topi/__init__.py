"""TE compute definitions (one file per op)."""

from .roi_align import roi_align, roi_align_nchw, roi_align_nhwc

__all__ = ["roi_align", "roi_align_nchw", "roi_align_nhwc"]
