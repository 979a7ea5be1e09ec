"""Metal strategy: the GPU schedule of :mod:`.gpu`, at most 256 threads per threadgroup.

Metal has no 64-bit floating point type: float64 RoIAlign raises ValueError for Metal targets.
"""

from __future__ import annotations

import tvm

from .gpu import schedule_gpu, target_max_threads

#: Threads per threadgroup: the target's ``max_num_threads``, never more than 256.
METAL_MAX_THREADS = 256


def is_metal(target: tvm.target.Target) -> bool:
    return target.kind.name == "metal"


def check_metal_dtypes(func, target) -> None:
    """Raise ValueError when a buffer of ``func`` is float64 (Metal Shading Language has no double)."""
    for param in func.params:
        if str(param.dtype) == "float64":
            raise ValueError(
                f"roi_align: dtype float64 is not supported by target {target.kind.name!r} "
                "(Metal has no 64-bit floating point); use float32 or float16 data and rois"
            )


def schedule_metal(func, target):
    """Schedule rule ``(PrimFunc, Target) -> Schedule | None`` for Metal targets.

    Raises ValueError for float64 data (unsupported by Metal).
    """
    check_metal_dtypes(func, target)
    return schedule_gpu(func, target, target_max_threads(target, METAL_MAX_THREADS))
