"""Drawing detections with Pillow: mask overlays, boxes, labels and a caption."""

from __future__ import annotations

import numpy as np

__all__ = ["PALETTE", "draw_detections"]

PALETTE = np.array(
    [
        [230, 25, 75],
        [60, 180, 75],
        [255, 225, 25],
        [0, 130, 200],
        [245, 130, 48],
        [145, 30, 180],
        [70, 240, 240],
        [240, 50, 230],
        [210, 245, 60],
        [250, 190, 190],
    ],
    dtype=np.float32,
)


def draw_detections(
    rgb: np.ndarray,
    detections: dict,
    names=None,
    top: int = 8,
    mask_threshold: float = 0.5,
    caption: str | None = None,
):
    """A ``PIL.Image`` of ``rgb [H, W, 3]`` uint8 with the ``top`` best detections.

    ``detections`` holds ``boxes [n, 4]``, ``labels [n]``, ``scores [n]`` and optionally
    ``masks [n, H, W]`` (probabilities); ``names`` maps a label to its category name.
    """
    from PIL import Image, ImageDraw

    picture = np.asarray(rgb, dtype=np.float32).copy()
    count = min(int(top), len(detections["boxes"]))
    masks = detections.get("masks")
    for i in range(count if masks is not None else 0):
        inside = masks[i] > mask_threshold
        picture[inside] = 0.55 * picture[inside] + 0.45 * PALETTE[i % len(PALETTE)]
    image = Image.fromarray(picture.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for i in range(count):
        x1, y1, x2, y2 = (float(v) for v in detections["boxes"][i])
        color = tuple(int(c) for c in PALETTE[i % len(PALETTE)])
        draw.rectangle([x1, y1, x2, y2], outline=color, width=2)
        label = int(detections["labels"][i])
        name = (
            names[label]
            if names is not None and 0 <= label < len(names)
            else str(label)
        )
        text = f"{name} {float(detections['scores'][i]):.2f}"
        left, top_, right, bottom = draw.textbbox((x1 + 3, y1 + 2), text)
        draw.rectangle([left - 1, top_ - 1, right + 1, bottom + 1], fill=(0, 0, 0))
        draw.text((x1 + 3, y1 + 2), text, fill=color)
    if caption:
        left, top_, right, bottom = draw.textbbox((4, image.height - 16), caption)
        draw.rectangle([0, top_ - 3, image.width, image.height], fill=(0, 0, 0))
        draw.text((4, image.height - 16), caption, fill=(255, 255, 255))
    return image
