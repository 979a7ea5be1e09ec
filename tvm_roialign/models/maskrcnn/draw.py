"""The picture: masks and boxes drawn with ``torchvision.utils``; the mask regions (smoothed over
the checkerboard of a random model), the label tags that do not overlap and the caption strip are
:mod:`tvm_roialign.runtime.draw`'s, shared with the PyTorch-free runner.
"""

from __future__ import annotations

import torch

from ...runtime.draw import MASK_ALPHA, PALETTE, draw_labels_and_caption, mask_outlines, mask_regions
from .torch_model import category_names


def draw_detections(
    image,
    detections: dict,
    path,
    top: int = 8,
    mask_threshold: float = 0.5,
    caption: str | None = None,
    alpha: float = MASK_ALPHA,
) -> None:
    """Save ``image`` ``[3, H, W]`` (floats in [0, 1]) with its ``top`` best detections.

    Masks (``alpha``-blended and outlined regions, :func:`~tvm_roialign.runtime.draw.mask_regions`) and
    boxes are drawn by ``torchvision.utils``; each label (``name score``) sits on a filled tag of
    its box's colour, placed so that tags do not overlap; ``caption`` (e.g.
    :meth:`MaskRCNNReport.caption`) is written in a strip below the photo.
    """
    from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

    names = category_names()
    height, width = image.shape[-2:]
    n = min(top, int(detections["boxes"].shape[0]))
    colors = [PALETTE[i % len(PALETTE)] for i in range(n)]
    picture = (image.clamp(0, 1) * 255).round().to(torch.uint8)
    boxes = detections["boxes"][:n].float()
    if n:
        regions = mask_regions(detections["masks"][:n, 0].float().numpy(), boxes.numpy(), mask_threshold)
        line = max(2, round(min(height, width) / 256))
        picture = draw_segmentation_masks(picture, torch.from_numpy(regions), alpha=alpha, colors=colors)
        outlines = torch.from_numpy(mask_outlines(regions, line))
        picture = draw_segmentation_masks(picture, outlines, alpha=1.0, colors=colors)
        picture = draw_bounding_boxes(picture, boxes, colors=colors, width=line)
    texts = []
    for i in range(n):
        label = int(detections["labels"][i])
        name = names[label] if names and label < len(names) else str(label)
        texts.append(f"{name} {float(detections['scores'][i]):.2f}")
    canvas = draw_labels_and_caption(picture.permute(1, 2, 0).numpy(), boxes.tolist(), texts, caption)
    canvas.save(path)


__all__ = ["PALETTE", "draw_detections"]
