"""ARM targets (aarch64): the bin-major CPU schedule of :mod:`.cpu`, vectorized to NEON's 128 bits
(SVE is scheduled as NEON: its width is not known at compile time; see
:func:`tvm_roialign.schedules.target_info.cpu_info`).

Rois x bin rows run in parallel on TVM's thread pool; each bin's sampling positions and weights are
computed once and shared across channels, and the channel loop is vectorized (as on x86).
"""

from __future__ import annotations

import tvm


def is_arm(target: tvm.target.Target) -> bool:
    """An llvm target for an ARM CPU (TVM gives it the key ``arm_cpu``, e.g. mtriple aarch64-*)."""
    return target.kind.name == "llvm" and "arm_cpu" in [str(key) for key in target.keys]
