"""ARM strategy (aarch64): the bin-major CPU schedule of :mod:`.cpu`, vectorized to NEON's width.

Rois x bin rows run in parallel on TVM's thread pool; each bin's sampling positions and weights are
computed once and shared across channels, and the channel loop is vectorized (as on x86).

Lanes are counted in *data* elements of one 128-bit NEON register: 2 for float64, 4 for float32,
8 for float16. float16 data are accumulated in float32, so a float16 vector of 8 lanes is one 128-bit
load (and store) of data widened to two float32 registers (``fcvtl``/``fcvtl2``) that take one
``fmla`` each; counting in accumulator elements instead would halve the loads to 64 bits.
"""

from __future__ import annotations

import tvm

from .cpu import schedule_cpu

#: NEON vector registers are 128 bits wide (SVE is not used: its width is not known at compile time).
NEON_BITS = 128

_DTYPE_BITS = {"float16": 16, "float32": 32, "float64": 64}


def is_arm(target: tvm.target.Target) -> bool:
    """An llvm target for an ARM CPU (TVM gives it the key ``arm_cpu``, e.g. mtriple aarch64-*)."""
    return target.kind.name == "llvm" and "arm_cpu" in [str(key) for key in target.keys]


def neon_lanes(dtype: str) -> int:
    """Vector lanes for ``dtype`` data: one 128-bit NEON register of data elements."""
    return max(NEON_BITS // _DTYPE_BITS.get(str(dtype), 32), 1)


def schedule_arm(func, target):
    """Schedule rule ``(PrimFunc, Target) -> Schedule | None`` for aarch64 / ARM llvm targets."""
    dtype = str(func.params[0].dtype) if func.params else "float32"  # data is the first param
    return schedule_cpu(func, target, max_lanes=neon_lanes(dtype))
