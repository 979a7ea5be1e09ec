"""Drawing detections with Pillow and NumPy (no PyTorch): masks (blended and outlined), boxes,
keypoints joined by their skeleton, labels that do not overlap, a caption strip below the photo.

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

__all__ = [
    "KEYPOINT_COLOR",
    "MASK_ALPHA",
    "MIN_CAPTION_WIDTH",
    "MIN_PICTURE_SIDE",
    "PALETTE",
    "draw_detections",
    "draw_keypoints",
    "draw_labels_and_caption",
    "mask_outlines",
    "mask_regions",
    "paint_masks",
    "picture_scale",
    "place_labels",
]

#: How much of a mask's colour covers the photo inside the mask (its border is drawn solid).
MASK_ALPHA = 0.6

#: The fill of keypoint dots (not a colour of :data:`PALETTE`).
KEYPOINT_COLOR = (255, 255, 0)

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


def _pieces(draw, word: str, font, width: int) -> list[str]:
    """``word`` cut into pieces no wider than ``width`` pixels: after its commas where it can
    (a target's ``-mattr=+a,+b,...``), else between characters."""
    pieces = [""]
    for part in word.replace(",", ",\0").split("\0"):
        for char in part if draw.textlength(part, font=font) > width else [part]:
            if pieces[-1] and draw.textlength(pieces[-1] + char, font=font) > width:
                pieces.append("")
            pieces[-1] += char
    return pieces


def _wrap(draw, text: str | None, font, width: int) -> list[str]:
    """``text`` broken at spaces into lines no wider than ``width`` pixels (a longer word cut
    into pieces, :func:`_pieces`)."""
    lines: list[str] = []
    for word in (text or "").split():
        for piece in _pieces(draw, word, font, width):
            if lines and draw.textlength(f"{lines[-1]} {piece}", font=font) <= width:
                lines[-1] += f" {piece}"
            else:
                lines.append(piece)
    return lines


def _overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _free_top(x, size, start, placed, height):
    """The first top at or below ``start`` where a ``size = (w, h)`` rectangle at ``x`` overlaps
    no rectangle of ``placed`` and fits in ``height``; None when there is none."""
    w, h = size
    y = start
    while y + h <= height:
        blocking = [p for p in placed if _overlaps((x, y, x + w, y + h), p)]
        if not blocking:
            return y
        y = max(p[3] for p in blocking)
    return None


def place_labels(boxes, sizes, width: int, height: int) -> list[tuple[int, int, int, int]]:
    """One rectangle ``(left, top, right, bottom)`` per label of ``sizes[i] = (w, h)`` pixels for
    ``boxes[i] = (x1, y1, x2, y2)``, in order, inside ``width x height``: above the box, else
    inside its top, else below it, each moved down past the labels placed before it until it
    overlaps none; then from the picture's top, then in other columns. Only when the picture
    has no free place left does a label overlap another (at its first candidate)."""
    placed: list[tuple[int, int, int, int]] = []
    for (x1, y1, _x2, y2), (w, h) in zip(boxes, sizes):
        w, h = int(w), int(h)
        x = min(max(0, int(x1)), max(0, width - w))
        tops = [min(max(0, y), max(0, height - h)) for y in (int(y1) - h, int(y1), int(y2))]
        column, top = _label_spot(x, (w, h), tops, placed, width, height) or (x, tops[0])
        placed.append((column, top, column + w, top + h))
    return placed


def _label_spot(x, size, tops, placed, width, height):
    """Where :func:`place_labels` puts a label of ``size``: a candidate top at ``x`` that is free as
    it is, else the first free top below a candidate (or the picture's top) at ``x``, else in a
    column beside a placed label; None when the picture has no free place."""
    w, h = size
    for top in tops:
        if _free_top(x, size, top, placed, top + h) is not None:
            return x, top
    columns = sorted(
        {min(max(0, c), max(0, width - w)) for p in placed for c in (p[2], p[0] - w)} - {x}
    )
    for column, start in [(x, t) for t in (*tops, 0)] + [(c, 0) for c in columns]:
        top = _free_top(column, size, start, placed, height)
        if top is not None:
            return column, top
    return None


#: The smallest side a photo is drawn at (a smaller one is scaled up, pixels as blocks).
MIN_PICTURE_SIDE = 128
#: The caption strip's least width (a 1x1 photo's picture was a 1-pixel strip of caption).
MIN_CAPTION_WIDTH = 320
#: A photo is not scaled up past this side (a 10x4000 strip stays as it is: its caption fits).
MAX_SCALED_SIDE = 4096


def picture_scale(height: int, width: int) -> int:
    """The whole factor a ``height x width`` photo is drawn at: 1, or for a photo with a side under
    :data:`MIN_PICTURE_SIDE` the least factor that brings it there, as long as its longer side
    stays within :data:`MAX_SCALED_SIDE`."""
    short, long = min(height, width), max(height, width)
    wanted = -(-MIN_PICTURE_SIDE // max(1, short))
    return max(1, min(wanted, MAX_SCALED_SIDE // max(1, long)))


def draw_labels_and_caption(picture: np.ndarray, boxes, texts, caption: str | None = None):
    """A ``PIL.Image`` of ``picture [H, W, 3]`` uint8 (masks and boxes drawn already) with one
    filled tag per ``texts[i]`` in ``PALETTE[i]`` near ``boxes[i]`` (tags do not overlap) and
    ``caption`` in a strip below. A small photo is scaled up (:func:`picture_scale`) and the strip
    is at least :data:`MIN_CAPTION_WIDTH` wide, so that the tags and caption stay readable."""
    from PIL import Image, ImageDraw

    factor = picture_scale(*picture.shape[:2])
    photo = Image.fromarray(picture)
    if factor > 1:
        photo = photo.resize((photo.width * factor, photo.height * factor), Image.NEAREST)
        boxes = [[float(v) * factor for v in b] for b in boxes]
    width, height = photo.size
    font_px = max(12, round(min(height, width) / 32))
    pad = max(2, font_px // 6)
    font = _font(font_px)
    strip = max(width, MIN_CAPTION_WIDTH)
    lines = _wrap(ImageDraw.Draw(Image.new("RGB", (1, 1))), caption, font, strip - 4 * pad)
    line_h = font_px + pad
    canvas = Image.new(
        "RGB", (strip if lines else width, height + len(lines) * line_h + 2 * pad if lines else height),
        (24, 24, 24),
    )
    canvas.paste(photo, (0, 0))
    draw = ImageDraw.Draw(canvas)
    sizes = []
    for text in texts:
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        sizes.append((right - left + 2 * pad, bottom - top + 2 * pad))
    rects = place_labels([list(map(float, b)) for b in boxes], sizes, width, height)
    for i, (rect, text) in enumerate(zip(rects, texts)):
        draw.rectangle(rect, fill=PALETTE[i % len(PALETTE)])
        draw.text((rect[0] + pad, rect[1] + pad), text, fill=(255, 255, 255), font=font, anchor="lt")
    for i, text in enumerate(lines):
        draw.text((2 * pad, height + pad + i * line_h), text, fill=(235, 235, 235), font=font, anchor="lt")
    return canvas


def mask_outlines(regions, thickness: int) -> np.ndarray:
    """The border of each boolean region ``[N, H, W]``: its pixels within ``thickness`` pixels
    (4-neighbour steps) of a pixel outside it or of the picture's edge."""
    regions = np.asarray(regions, dtype=bool)
    inner = regions.copy()
    for _ in range(max(1, int(thickness))):
        padded = np.pad(inner, ((0, 0), (1, 1), (1, 1)))
        inner = (
            padded[:, 1:-1, 1:-1] & padded[:, :-2, 1:-1] & padded[:, 2:, 1:-1]
            & padded[:, 1:-1, :-2] & padded[:, 1:-1, 2:]
        )
    return regions & ~inner


def paint_masks(picture: np.ndarray, regions, alpha: float, thickness: int) -> np.ndarray:
    """``picture [H, W, 3]`` with each region ``i`` blended with ``PALETTE[i]`` by ``alpha`` and
    outlined in that colour (``thickness`` pixels), as uint8."""
    out = np.asarray(picture, dtype=np.float32).copy()
    regions = np.asarray(regions, dtype=bool)
    for i, (region, outline) in enumerate(zip(regions, mask_outlines(regions, thickness))):
        color = np.asarray(PALETTE[i % len(PALETTE)], np.float32)
        out[region] = (1 - alpha) * out[region] + alpha * color
        out[outline] = color
    return out.round().clip(0, 255).astype(np.uint8)


def draw_keypoints(draw, keypoints, skeleton=None, radius: int = 3, line: int = 2) -> None:
    """``keypoints [n, K, 2+]`` (x, y in pixels) of ``n`` detections on a ``PIL.ImageDraw``: the
    ``skeleton`` pairs ``(a, b)`` of keypoint indices as lines in ``PALETTE[i]``, then each
    keypoint as a dot of ``KEYPOINT_COLOR`` with a dark rim."""
    for i, points in enumerate(np.asarray(keypoints, dtype=np.float32)):
        color = PALETTE[i % len(PALETTE)]
        for a, b in skeleton or ():
            draw.line([tuple(points[a, :2]), tuple(points[b, :2])], fill=color, width=line)
        for x, y in points[:, :2].tolist():
            draw.ellipse(
                [x - radius, y - radius, x + radius, y + radius],
                fill=KEYPOINT_COLOR,
                outline=(0, 0, 0),
            )


def draw_detections(
    rgb: np.ndarray,
    detections: dict,
    names=None,
    top: int = 8,
    mask_threshold: float = 0.5,
    caption: str | None = None,
    alpha: float = MASK_ALPHA,
    skeleton=None,
):
    """A ``PIL.Image`` of ``rgb [H, W, 3]`` uint8 with the ``top`` best detections.

    ``detections`` holds ``boxes [n, 4]``, ``labels [n]``, ``scores [n]`` and optionally
    ``masks [n, H, W]`` (probabilities; drawn as :func:`mask_regions`, ``alpha``-blended and
    outlined) and ``keypoints [n, K, 3]`` (dots, joined by the ``skeleton`` pairs of keypoint
    indices); ``names`` maps a label to its category name; ``caption`` goes in a strip below
    the photo.
    """
    from PIL import Image, ImageDraw

    picture = np.asarray(rgb, dtype=np.uint8)
    height, width = picture.shape[:2]
    count = min(int(top), len(detections["boxes"]))
    boxes = np.asarray(detections["boxes"][:count], dtype=np.float32)
    line = max(2, round(min(height, width) / 256))
    masks = detections.get("masks")
    if masks is not None and count:
        picture = paint_masks(picture, mask_regions(masks[:count], boxes, mask_threshold), alpha, line)
    image = Image.fromarray(picture)
    draw = ImageDraw.Draw(image)
    for i, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
        draw.rectangle([x1, y1, x2, y2], outline=PALETTE[i % len(PALETTE)], width=line)
    keypoints = detections.get("keypoints")
    if keypoints is not None and count:
        draw_keypoints(draw, keypoints[:count], skeleton, radius=line + 1, line=line)
    texts = []
    for i in range(count):
        label = int(detections["labels"][i])
        name = names[label] if names is not None and 0 <= label < len(names) else str(label)
        texts.append(f"{name} {float(detections['scores'][i]):.2f}")
    return draw_labels_and_caption(np.asarray(image), boxes, texts, caption)
