"""PyTorch's intra-op thread count for a block (the glue of :class:`~.detector.TVMMaskRCNN`)."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def torch_threads(count: int | None):
    """PyTorch's intra-op thread count set to ``count`` inside the block and restored after it
    (None: left alone)."""
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(count))
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["torch_threads"]
