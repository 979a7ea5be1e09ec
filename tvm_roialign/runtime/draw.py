"""Drawing detections with Pillow and NumPy (no PyTorch): masks, boxes, labels that do not overlap,
a caption strip below the photo.

Masks of a model with random weights are checkerboards (the mask predictor's stride-2 transposed
convolution with untrained weights alternates high and low logits), and thresholding them draws a
lattice that looks like a rendering bug. Each mask is therefore drawn as the region where its
probability, averaged over one period of that pattern (:func:`mask_regions`), clears the
threshold: a trained model's masks (smooth) look the same either way, a random model's become
solid regions. :mod:`tvm_roialign.models.maskrcnn.draw` (``torchvision.utils`` for masks and boxes)
uses the same regions, labels and caption.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PALETTE", "draw_detections", "draw_labels_and_caption", "mask_regions"]

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


def _window_mean(mask: np.ndarray, kh: int, kw: int) -> np.ndarray:
    """Mean of ``mask`` over a ``kh x kw`` window centred on each pixel (odd sizes; the window is
    cut at the edges and the mean taken over what is inside)."""
    padded = np.pad(mask.astype(np.float64), ((kh // 2 + 1, kh // 2), (kw // 2 + 1, kw // 2)))
    ones = np.pad(np.ones(mask.shape), ((kh // 2 + 1, kh // 2), (kw // 2 + 1, kw // 2)))

    def window_sum(a):
        c = a.cumsum(0).cumsum(1)
        return c[kh:, kw:] - c[:-kh, kw:] - c[kh:, :-kw] + c[:-kh, :-kw]

    return window_sum(padded) / window_sum(ones)


def mask_regions(masks, boxes, threshold: float = 0.5) -> np.ndarray:
    """``masks [N, H, W]`` probabilities -> boolean regions ``[N, H, W]``: each mask averaged over
    a window of two mask cells (1/14 of its box, one period of the checkerboard) before the
    threshold."""
    masks = np.asarray(masks, dtype=np.float32)
    out = np.zeros(masks.shape, dtype=bool)
    for i, (mask, box) in enumerate(zip(masks, np.asarray(boxes, dtype=np.float32))):
        kh = max(1, int((box[3] - box[1]) / 14)) | 1
        kw = max(1, int((box[2] - box[0]) / 14)) | 1
        out[i] = _window_mean(mask, kh, kw) > threshold
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


def draw_labels_and_caption(picture: np.ndarray, boxes, texts, caption: str | None = None):
    """A ``PIL.Image`` of ``picture [H, W, 3]`` uint8 (masks and boxes drawn already) with one
    filled tag per ``texts[i]`` in ``PALETTE[i]`` near ``boxes[i]`` (tags do not overlap) and
    ``caption`` in a strip below."""
    from PIL import Image, ImageDraw

    height, width = picture.shape[:2]
    font_px = max(12, round(min(height, width) / 32))
    pad = max(2, font_px // 6)
    font = _font(font_px)
    lines = _wrap(ImageDraw.Draw(Image.new("RGB", (1, 1))), caption, font, width - 4 * pad)
    line_h = font_px + pad
    canvas = Image.new(
        "RGB", (width, height + len(lines) * line_h + 2 * pad if lines else height), (24, 24, 24)
    )
    canvas.paste(Image.fromarray(picture), (0, 0))
    draw = ImageDraw.Draw(canvas)
    rects = _place_labels(draw, [list(map(float, b)) for b in boxes], texts, font, width, height, pad)
    for i, (rect, text) in enumerate(zip(rects, texts)):
        draw.rectangle(rect, fill=PALETTE[i % len(PALETTE)])
        draw.text((rect[0] + pad, rect[1] + pad), text, fill=(255, 255, 255), font=font, anchor="lt")
    for i, text in enumerate(lines):
        draw.text((2 * pad, height + pad + i * line_h), text, fill=(235, 235, 235), font=font, anchor="lt")
    return canvas


def draw_detections(
    rgb: np.ndarray,
    detections: dict,
    names=None,
    top: int = 8,
    mask_threshold: float = 0.5,
    caption: str | None = None,
    alpha: float = 0.45,
):
    """A ``PIL.Image`` of ``rgb [H, W, 3]`` uint8 with the ``top`` best detections.

    ``detections`` holds ``boxes [n, 4]``, ``labels [n]``, ``scores [n]`` and optionally
    ``masks [n, H, W]`` (probabilities; drawn as :func:`mask_regions`, ``alpha``-blended);
    ``names`` maps a label to its category name; ``caption`` goes in a strip below the photo.
    """
    from PIL import Image, ImageDraw

    picture = np.asarray(rgb, dtype=np.float32).copy()
    height, width = picture.shape[:2]
    count = min(int(top), len(detections["boxes"]))
    boxes = np.asarray(detections["boxes"][:count], dtype=np.float32)
    masks = detections.get("masks")
    if masks is not None and count:
        for i, region in enumerate(mask_regions(masks[:count], boxes, mask_threshold)):
            color = np.asarray(PALETTE[i % len(PALETTE)], np.float32)
            picture[region] = (1 - alpha) * picture[region] + alpha * color
    image = Image.fromarray(picture.round().clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    line = max(2, round(min(height, width) / 256))
    for i, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
        draw.rectangle([x1, y1, x2, y2], outline=PALETTE[i % len(PALETTE)], width=line)
    texts = []
    for i in range(count):
        label = int(detections["labels"][i])
        name = names[label] if names is not None and 0 <= label < len(names) else str(label)
        texts.append(f"{name} {float(detections['scores'][i]):.2f}")
    return draw_labels_and_caption(np.asarray(image), boxes, texts, caption)
