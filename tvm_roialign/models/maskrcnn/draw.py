"""The picture: masks and boxes drawn with ``torchvision.utils``, labels that do not overlap, a caption.

Masks of a model with random weights are checkerboards (the mask predictor's stride-2 transposed
convolution with untrained weights alternates high and low logits), and thresholding them draws a
lattice that looks like a rendering bug. Each mask is therefore drawn as the region where its
probability, averaged over one period of that pattern, clears the threshold: a trained model's masks (smooth)
look the same either way, a random model's become solid regions.
"""

from __future__ import annotations

import torch

from .torch_model import category_names

#: Colour per drawn detection (distinct, readable under white text).
PALETTE = [
    (230, 25, 75),
    (60, 180, 75),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (0, 128, 128),
    (240, 50, 230),
    (128, 128, 0),
    (170, 110, 40),
    (0, 0, 128),
]


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: bitmap font, one size
        return ImageFont.load_default()


def _regions(masks: torch.Tensor, boxes: torch.Tensor, threshold: float) -> torch.Tensor:
    """``[N, H, W]`` probabilities -> boolean regions: each mask averaged over a window of two
    mask cells (1/14 of its box, one period of the checkerboard) before the threshold."""
    out = torch.zeros(masks.shape, dtype=torch.bool)
    for i, (mask, box) in enumerate(zip(masks, boxes)):
        kh = max(1, int((box[3] - box[1]) / 14)) | 1
        kw = max(1, int((box[2] - box[0]) / 14)) | 1
        pooled = torch.nn.functional.avg_pool2d(
            mask[None, None],
            (kh, kw),
            stride=1,
            padding=(kh // 2, kw // 2),
            count_include_pad=False,
        )
        out[i] = pooled[0, 0] > threshold
    return out


def _wrap(draw, text: str | None, font, width: int) -> list[str]:
    """``text`` broken at spaces into lines no wider than ``width`` pixels."""
    lines: list[str] = []
    for word in (text or "").split():
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines


def _overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _place_labels(draw, boxes, texts, font, width, height, pad):
    """One rectangle per label: above its box, else inside its top, else further down, not
    overlapping an earlier label; the first candidate when all overlap."""
    placed = []
    for (x1, y1, _x2, y2), text in zip(boxes, texts):
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        w, h = right - left + 2 * pad, bottom - top + 2 * pad
        x = min(max(0, int(x1)), max(0, width - w))
        candidates = [int(y1) - h, int(y1)]
        candidates += list(range(int(y1) + h, int(y2) - h + 1, h))
        candidates += [int(y2), int(y2) + h]
        rects = [(x, min(max(0, y), height - h), x + w, min(max(0, y), height - h) + h) for y in candidates]
        free = [r for r in rects if not any(_overlaps(r, p) for p in placed)]
        placed.append(free[0] if free else rects[0])
    return placed


def draw_detections(
    image,
    detections: dict,
    path,
    top: int = 8,
    mask_threshold: float = 0.5,
    caption: str | None = None,
    alpha: float = 0.45,
) -> None:
    """Save ``image`` ``[3, H, W]`` (floats in [0, 1]) with its ``top`` best detections.

    Masks (``alpha``-blended, see the module docstring) and boxes are drawn by
    ``torchvision.utils``; each label (``name score``) sits on a filled tag of its box's colour,
    placed so that tags do not overlap; ``caption`` (e.g. :meth:`MaskRCNNReport.caption`) is
    written in a strip below the photo.
    """
    from PIL import Image, ImageDraw
    from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

    names = category_names()
    height, width = image.shape[-2:]
    n = min(top, int(detections["boxes"].shape[0]))
    colors = [PALETTE[i % len(PALETTE)] for i in range(n)]
    picture = (image.clamp(0, 1) * 255).round().to(torch.uint8)
    if n:
        masks = _regions(detections["masks"][:n, 0].float(), detections["boxes"][:n].float(), mask_threshold)
        picture = draw_segmentation_masks(picture, masks, alpha=alpha, colors=colors)
        line = max(2, round(min(height, width) / 256))
        picture = draw_bounding_boxes(picture, detections["boxes"][:n].float(), colors=colors, width=line)
    font_px = max(12, round(min(height, width) / 32))
    pad = max(2, font_px // 6)
    font = _font(font_px)
    lines = _wrap(ImageDraw.Draw(Image.new("RGB", (1, 1))), caption, font, width - 4 * pad)
    line_h = font_px + pad
    canvas = Image.new(
        "RGB", (width, height + len(lines) * line_h + 2 * pad if lines else height), (24, 24, 24)
    )
    canvas.paste(Image.fromarray(picture.permute(1, 2, 0).numpy()), (0, 0))
    draw = ImageDraw.Draw(canvas)
    texts = []
    for i in range(n):
        label = int(detections["labels"][i])
        name = names[label] if names and label < len(names) else str(label)
        texts.append(f"{name} {float(detections['scores'][i]):.2f}")
    boxes = detections["boxes"][:n].tolist()
    for rect, text, color in zip(_place_labels(draw, boxes, texts, font, width, height, pad), texts, colors):
        draw.rectangle(rect, fill=color)
        draw.text((rect[0] + pad, rect[1] + pad), text, fill=(255, 255, 255), font=font, anchor="lt")
    for i, text in enumerate(lines):
        draw.text((2 * pad, height + pad + i * line_h), text, fill=(235, 235, 235), font=font, anchor="lt")
    canvas.save(path)


__all__ = ["PALETTE", "draw_detections"]
