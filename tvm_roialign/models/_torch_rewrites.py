"""Rewrites of torchvision modules into equivalent forms that TVM compiles better, shared by both
model routes (the three-piece Mask R-CNN, :mod:`tvm_roialign.models.maskrcnn`, and the standalone
detector artifact, :mod:`tvm_roialign.models.detection`)."""

from __future__ import annotations

import torch


class ConvTranspose2x2(torch.nn.Module):
    """A ``ConvTranspose2d`` with kernel = stride = 2 as a 1x1 conv plus a depth-to-space.

    ``out[k, co, 2i+a, 2j+b] = bias[co] + sum_ci x[k, ci, i, j] w[ci, co, a, b]``. The depth-to-space
    is written channels-last, and an elementwise ``activation`` is applied before its last permute:
    once ConvertLayout has moved the convs to NHWC, the permutes at its edges cancel against the
    layout transposes, leaving only its own 6-D permute.
    """

    def __init__(self, conv: torch.nn.ConvTranspose2d):
        super().__init__()
        cin, cout = conv.weight.shape[:2]
        self.cout = cout
        weight = conv.weight.detach().permute(1, 2, 3, 0).reshape(cout * 4, cin, 1, 1)
        bias = conv.bias.detach() if conv.bias is not None else torch.zeros(cout)
        self.weight = torch.nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = torch.nn.Parameter(bias.repeat_interleave(4), requires_grad=False)

    @staticmethod
    def applies_to(module) -> bool:
        return (
            isinstance(module, torch.nn.ConvTranspose2d)
            and tuple(module.kernel_size) == (2, 2)
            and tuple(module.stride) == (2, 2)
            and tuple(module.padding) == (0, 0)
            and tuple(module.output_padding) == (0, 0)
            and tuple(module.dilation) == (1, 1)
            and module.groups == 1
        )

    def forward(self, x, activation=None):
        height, width = x.shape[-2:]
        y = torch.nn.functional.conv2d(x, self.weight, self.bias)
        y = y.permute(0, 2, 3, 1).reshape(-1, height, width, self.cout, 2, 2)
        y = y.permute(0, 1, 4, 2, 5, 3).reshape(-1, 2 * height, 2 * width, self.cout)
        if activation is not None:
            y = activation(y)
        return y.permute(0, 3, 1, 2)


def conv_transpose_as_conv(module) -> ConvTranspose2x2 | None:
    """:class:`ConvTranspose2x2` for a 2x2/stride-2 ``ConvTranspose2d`` (no padding, one group), else None."""
    return ConvTranspose2x2(module) if ConvTranspose2x2.applies_to(module) else None


__all__ = ["ConvTranspose2x2", "conv_transpose_as_conv"]
