"""Rewrites of torchvision modules into equivalent forms that TVM compiles better, shared by both
model routes (the three-piece Mask R-CNN, :mod:`tvm_roialign.models.maskrcnn`, and the standalone
detector artifact, :mod:`tvm_roialign.models.detection`)."""

from __future__ import annotations

import contextlib

import torch


def _is_transposed_conv(module, kernel: int, stride: int, padding: int) -> bool:
    """Whether ``module`` is a square ``ConvTranspose2d`` of these sizes (one group, no dilation,
    no output padding)."""
    return (
        isinstance(module, torch.nn.ConvTranspose2d)
        and tuple(module.kernel_size) == (kernel, kernel)
        and tuple(module.stride) == (stride, stride)
        and tuple(module.padding) == (padding, padding)
        and tuple(module.output_padding) == (0, 0)
        and tuple(module.dilation) == (1, 1)
        and module.groups == 1
    )


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
        self.padding = 0

    @staticmethod
    def applies_to(module) -> bool:
        return _is_transposed_conv(module, kernel=2, stride=2, padding=0)

    def forward(self, x, activation=None):
        height, width = x.shape[-2:]
        y = torch.nn.functional.conv2d(x, self.weight, self.bias, padding=self.padding)
        y = y.permute(0, 2, 3, 1).reshape(-1, height, width, self.cout, 2, 2)
        y = y.permute(0, 1, 4, 2, 5, 3).reshape(-1, 2 * height, 2 * width, self.cout)
        if activation is not None:
            y = activation(y)
        return y.permute(0, 3, 1, 2)


#: For a 4x4 / stride-2 / padding-1 transposed conv, per output phase ``a`` (row parity) the kernel
#: row that each row of a 3x3 window (offsets -1, 0, +1) takes: output row ``2m + a`` sums input
#: rows ``m`` and ``m - 1`` (kernel rows 1 and 3) for ``a = 0``, ``m + 1`` and ``m`` (0 and 2) for
#: ``a = 1``; likewise for columns.
_PHASE_TAPS = ({0: 3, 1: 1}, {1: 2, 2: 0})


class ConvTranspose4x4(ConvTranspose2x2):
    """A ``ConvTranspose2d`` with kernel 4, stride 2, padding 1 (Keypoint R-CNN's predictor) as a
    3x3 conv (padding 1) to ``4 x cout`` channels, one per output phase, plus the same
    depth-to-space: ``out[co, 2m+a, 2n+b] = bias[co] + sum over the phase's 2x2 taps``. Legalized
    as itself, the transposed conv ran in 3.9 s of the 5.2 s of a Keypoint R-CNN artifact."""

    def __init__(self, conv: torch.nn.ConvTranspose2d):
        torch.nn.Module.__init__(self)  # the 2x2 weights of the base are not wanted
        cin, cout = conv.weight.shape[:2]
        self.cout = cout
        source = conv.weight.detach()
        weight = torch.zeros((cout, 2, 2, cin, 3, 3), dtype=source.dtype)
        for a, rows in enumerate(_PHASE_TAPS):
            for b, columns in enumerate(_PHASE_TAPS):
                for ry, ky in rows.items():
                    for rx, kx in columns.items():
                        weight[:, a, b, :, ry, rx] = source[:, :, ky, kx].t()
        bias = conv.bias.detach() if conv.bias is not None else torch.zeros(cout)
        self.weight = torch.nn.Parameter(weight.reshape(cout * 4, cin, 3, 3), requires_grad=False)
        self.bias = torch.nn.Parameter(bias.repeat_interleave(4), requires_grad=False)
        self.padding = 1

    @staticmethod
    def applies_to(module) -> bool:
        return _is_transposed_conv(module, kernel=4, stride=2, padding=1)


def conv_transpose_as_conv(module) -> ConvTranspose2x2 | None:
    """:class:`ConvTranspose2x2` for a 2x2/stride-2 ``ConvTranspose2d`` (no padding, one group),
    :class:`ConvTranspose4x4` for a 4x4/stride-2/padding-1 one, else None."""
    for kind in (ConvTranspose2x2, ConvTranspose4x4):
        if kind.applies_to(module):
            return kind(module)
    return None


#: The transposed convs that :func:`tvm_friendly` rewrites: (head of ``roi_heads``, attribute).
_TRANSPOSED_CONVS = (("mask_predictor", "conv5_mask"), ("keypoint_predictor", "kps_score_lowres"))


@contextlib.contextmanager
def tvm_friendly(model):
    """Within the block, the mask predictor's 2x2 / stride-2 ConvTranspose2d runs as a 1x1
    convolution plus depth-to-space (same sums, a quarter of the work in TVM, and a form
    ConvertLayout moves to NHWC), and the keypoint predictor's 4x4 / stride-2 one as a 3x3
    convolution plus depth-to-space; the model is restored on exit."""
    replaced = []
    for head_name, attribute in _TRANSPOSED_CONVS:
        head = getattr(model.roi_heads, head_name, None)
        original = getattr(head, attribute, None)
        replacement = conv_transpose_as_conv(original) if original is not None else None
        if replacement is not None:
            setattr(head, attribute, replacement)
            replaced.append((head, attribute, original))
    try:
        yield model
    finally:
        for head, attribute, original in replaced:
            setattr(head, attribute, original)


__all__ = ["ConvTranspose2x2", "ConvTranspose4x4", "conv_transpose_as_conv", "tvm_friendly"]
