"""Metal strategy: the GPU schedule of :mod:`.gpu`, at most 256 threads per threadgroup.

Metal has no 64-bit floating point type: float64 RoIAlign raises ValueError for Metal targets.
"""

from __future__ import annotations

import tvm

from .base import buffer_dtypes
from .gpu import RoIAlignGPU

#: Threads per threadgroup: the target's ``max_num_threads``, never more than 256.
METAL_MAX_THREADS = 256


def is_metal(target: tvm.target.Target) -> bool:
    return target.kind.name == "metal"


def check_metal_dtypes(func, target) -> None:
    """Raise ValueError when a buffer of ``func`` is float64 (Metal Shading Language has no double)."""
    for dtype in buffer_dtypes(func):
        if dtype == "float64":
            raise ValueError(
                f"roi_align: dtype float64 is not supported by target {target.kind.name!r} "
                "(Metal has no 64-bit floating point); use float32 or float16 data and rois"
            )


class RoIAlignMetal(RoIAlignGPU):
    """The GPU rule with at most :data:`METAL_MAX_THREADS` threads per threadgroup; raises
    ValueError for float64 data (unsupported by Metal)."""

    def __init__(self, bind_threads: bool = True):
        super().__init__(METAL_MAX_THREADS, bind_threads)

    def apply(self, func, target, tunable=False):
        check_metal_dtypes(func, target)
        return super().apply(func, target, tunable)
