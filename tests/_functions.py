"""A function of tensors as a ``torch.nn.Module``, for ``torch.export`` and ``torch.onnx.export``."""

from __future__ import annotations

import torch


class FunctionModule(torch.nn.Module):
    """``forward(x) = fn(x)``."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)
