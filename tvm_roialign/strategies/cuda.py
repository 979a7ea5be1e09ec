"""CUDA strategy: the GPU schedule of :mod:`.gpu` (one thread per output element)."""

from __future__ import annotations

import tvm

from .gpu import RoIAlignGPU

#: Threads per block, capped by the target's ``max_num_threads``. A RoIAlign thread holds 32-40
#: registers (ptxas, sm_90): 1024-thread blocks would fit one block (50% occupancy) in an SM's 64K
#: registers, 256-thread blocks fit six (75%).
CUDA_THREADS = 256


def is_cuda(target: tvm.target.Target) -> bool:
    return target.kind.name == "cuda"


class RoIAlignCUDA(RoIAlignGPU):
    """The GPU rule with at most :data:`CUDA_THREADS` threads per block."""

    def __init__(self, bind_threads: bool = True):
        super().__init__(CUDA_THREADS, bind_threads)
