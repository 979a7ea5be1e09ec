"""A deterministic synthetic detection dataset: shapes on varied backgrounds, with exact boxes,
masks and keypoints, in COCO format.

Each image (``size x size`` RGB, uint8; 128 by default) holds 1-3 non-overlapping objects of four classes told
apart by their outline -- 1 ellipse, 2 rectangle (rotated), 3 triangle, 4 star (a concave
polygon) -- filled with a solid colour, stripes, a gradient or a sharp crop of a bundled photo
(scikit-image's astronaut, coffee, chelsea and rocket, matplotlib's grace_hopper), on a background
of noise, a gradient or a blurred crop of a photo. The ground truth is exact by construction: the
mask is the rasterized outline (the only thing pasted), the box is the mask's pixel extent
(``[x0, y0, x1 + 1, y1 + 1]``, COCO's convention of pixel edges), and each object carries
:data:`NUM_KEYPOINTS` keypoints inside its mask (landmarks of the outline pulled towards its
centre; visibility 2). Objects do not overlap, so no mask is occluded.

Every image is drawn from its own generator, seeded by ``(seed, split, index)``, so an image
does not depend on how many were drawn before it; the train and held-out (``"val"``) splits use
different seeds. :func:`coco_ground_truth` writes the split as a COCO dict for pycocotools (masks
as RLE), :func:`fingerprint` names the data (a hash of the settings and :data:`VERSION`) for the
trained weights' cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import asdict, dataclass

import numpy as np

#: bumped whenever drawing changes, so cached weights of older data are not reused
VERSION = 1
#: class index -> name (0 is the background, as torchvision's detectors count)
CLASSES = ("__background__", "ellipse", "rectangle", "triangle", "star")
NUM_KEYPOINTS = 3
KEYPOINT_NAMES = ("first", "second", "third")
SPLITS = {"train": 1, "val": 2}
#: the photos pasted and blurred (as :data:`tvm_roialign.models.detector_reference.SAMPLE_PHOTOS`)
PHOTO_NAMES = ("astronaut", "coffee", "chelsea", "rocket", "grace_hopper")


@dataclass(frozen=True)
class SyntheticConfig:
    """The dataset's settings: image side, objects per image, object sides (pixels), seed."""

    size: int = 128
    min_objects: int = 1
    max_objects: int = 3
    min_side: int = 22
    max_side: int = 60
    seed: int = 0


def fingerprint(config: SyntheticConfig, count: int, split: str = "train") -> str:
    """12 hex digits naming ``count`` images of ``split`` drawn with ``config`` at :data:`VERSION`."""
    text = json.dumps({"v": VERSION, "split": split, "count": count, **asdict(config)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@functools.cache
def photo(name: str) -> np.ndarray:
    """One of :data:`PHOTO_NAMES` as ``[H, W, 3]`` uint8 (bundled with scikit-image/matplotlib)."""
    from ..models.detector_reference import sample_photo

    return np.ascontiguousarray(sample_photo(name)[..., :3])


def _photo_crop(rng, side_h: int, side_w: int, blur: float = 0.0) -> np.ndarray:
    from PIL import Image, ImageFilter

    src = photo(PHOTO_NAMES[rng.integers(len(PHOTO_NAMES))])
    scale = rng.uniform(0.25, 0.9)
    ch = max(8, int(src.shape[0] * scale))
    cw = min(src.shape[1], max(8, int(ch * side_w / side_h)))
    y = rng.integers(0, src.shape[0] - ch + 1)
    x = rng.integers(0, src.shape[1] - cw + 1)
    img = Image.fromarray(src[y : y + ch, x : x + cw]).resize((side_w, side_h), Image.BILINEAR)
    if blur:
        img = img.filter(ImageFilter.GaussianBlur(blur))
    return np.asarray(img)


def _gradient(rng, h: int, w: int) -> np.ndarray:
    a, b = rng.integers(0, 256, (2, 3))
    angle = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    t = (xx * math.cos(angle) + yy * math.sin(angle)).ravel()
    t = ((t - t.min()) / max(np.ptp(t), 1.0)).reshape(h, w, 1)
    return (a * (1 - t) + b * t).astype(np.uint8)


def _background(rng, size: int) -> np.ndarray:
    kind = rng.integers(3)
    if kind == 0:
        base = rng.integers(0, 256, 3).astype(np.float32)
        noise = rng.normal(0, rng.uniform(5, 30), (size, size, 3))
        return np.clip(base + noise, 0, 255).astype(np.uint8)
    if kind == 1:
        return _gradient(rng, size, size)
    return _photo_crop(rng, size, size, blur=rng.uniform(2.0, 5.0))


def _fill(rng, h: int, w: int) -> np.ndarray:
    kind = rng.integers(4)
    if kind == 0:
        colour = rng.integers(0, 256, 3).astype(np.float32)
        return np.clip(colour + rng.normal(0, 6, (h, w, 3)), 0, 255).astype(np.uint8)
    if kind == 1:
        a, b = rng.integers(0, 256, (2, 3))
        period = int(rng.integers(4, 12))
        yy, xx = np.mgrid[0:h, 0:w]
        on = (((xx + yy) if rng.integers(2) else xx) // period) % 2 == 0
        return np.where(on[..., None], a, b).astype(np.uint8)
    if kind == 2:
        return _gradient(rng, h, w)
    return _photo_crop(rng, h, w)


def _outline(rng, label: int, cx: float, cy: float, r: float):
    """``("ellipse", bbox)`` or ``("polygon", points)`` of the class, and its landmarks."""
    if label == 1:
        rx, ry = r, r * rng.uniform(0.5, 1.0)
        marks = [(cx, cy), (cx - 0.5 * rx, cy), (cx + 0.5 * rx, cy)]
        return ("ellipse", [cx - rx, cy - ry, cx + rx, cy + ry]), marks
    angle = rng.uniform(0, 2 * math.pi)
    if label == 2:
        aspect = rng.uniform(0.45, 1.0)
        corners = [(1, aspect), (-1, aspect), (-1, -aspect), (1, -aspect)]
        radii = [(r * x / math.hypot(1, aspect), r * y / math.hypot(1, aspect)) for x, y in corners]
    elif label == 3:
        radii = [(r * math.cos(2 * math.pi * k / 3), r * math.sin(2 * math.pi * k / 3)) for k in range(3)]
    else:
        radii = [
            ((r if k % 2 == 0 else 0.45 * r) * math.cos(math.pi * k / 5),
             (r if k % 2 == 0 else 0.45 * r) * math.sin(math.pi * k / 5))
            for k in range(10)
        ]
    c, s = math.cos(angle), math.sin(angle)
    points = [(cx + x * c - y * s, cy + x * s + y * c) for x, y in radii]
    tips = points[::2] if label == 4 else points
    marks = [(cx + 0.5 * (x - cx), cy + 0.5 * (y - cy)) for x, y in tips[:NUM_KEYPOINTS]]
    return ("polygon", points), marks


def _rasterize(size: int, shape) -> np.ndarray:
    from PIL import Image, ImageDraw

    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    kind, geometry = shape
    if kind == "ellipse":
        draw.ellipse(geometry, fill=1)
    else:
        draw.polygon(geometry, fill=1)
    return np.asarray(canvas, np.uint8)


def _place(rng, config: SyntheticConfig, taken: np.ndarray):
    """A centre and radius whose square lies inside the image and clear of ``taken``, or None."""
    for _ in range(30):
        side = rng.uniform(config.min_side, config.max_side)
        r = side / 2
        cx, cy = rng.uniform(r + 1, config.size - r - 1, 2)
        x0, y0 = int(cx - r) - 2, int(cy - r) - 2
        x1, y1 = int(cx + r) + 3, int(cy + r) + 3
        if not taken[max(y0, 0) : y1, max(x0, 0) : x1].any():
            taken[max(y0, 0) : y1, max(x0, 0) : x1] = True
            return cx, cy, r
    return None


def sample(config: SyntheticConfig, split: str, index: int):
    """Image ``index`` of ``split``: ``(image [S, S, 3] uint8, target)``, the target a dict of
    NumPy arrays as torchvision's detectors take them in training: ``boxes [N, 4]`` float32
    (x0, y0, x1, y1 in pixel edges), ``labels [N]`` int64, ``masks [N, S, S]`` uint8,
    ``keypoints [N, K, 3]`` float32 (x, y, visibility 2; pixel centres at +0.5)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    rng = np.random.default_rng([config.seed, SPLITS[split], index])
    size = config.size
    image = _background(rng, size).copy()
    taken = np.zeros((size, size), bool)
    boxes, labels, masks, keypoints = [], [], [], []
    for _ in range(rng.integers(config.min_objects, config.max_objects + 1)):
        place = _place(rng, config, taken)
        if place is None:
            continue
        label = int(rng.integers(1, len(CLASSES)))
        shape, marks = _outline(rng, label, *place)
        mask = _rasterize(size, shape)
        ys, xs = np.nonzero(mask)
        y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        patch = _fill(rng, y1 - y0, x1 - x0)
        region = mask[y0:y1, x0:x1].astype(bool)
        image[y0:y1, x0:x1][region] = patch[region]
        boxes.append([x0, y0, x1, y1])
        labels.append(label)
        masks.append(mask)
        keypoints.append([[math.floor(x) + 0.5, math.floor(y) + 0.5, 2.0] for x, y in marks])
    target = {
        "boxes": np.asarray(boxes, np.float32).reshape(-1, 4),
        "labels": np.asarray(labels, np.int64),
        "masks": np.asarray(masks, np.uint8).reshape(-1, size, size),
        "keypoints": np.asarray(keypoints, np.float32).reshape(-1, NUM_KEYPOINTS, 3),
    }
    return image, target


def classification_sample(config: SyntheticConfig, split: str, index: int):
    """Image ``index`` of ``split`` as a classifier's example: ``(image, class)``, the class of its
    first object counted from 0 (``CLASSES[class + 1]``). Meant for a config of exactly one object
    an image (:data:`CLASSIFIER_DATA`), which always places it."""
    image, target = sample(config, split, index)
    if not len(target["labels"]):
        raise ValueError(f"image {index} of {split} holds no object: draw one object an image "
                         "(CLASSIFIER_DATA)")
    return image, int(target["labels"][0]) - 1


def classification_batch(config: SyntheticConfig, split: str, indices):
    """Images ``indices`` of ``split`` as a classifier's batch (:func:`classification_sample`):
    ``(images float32 [B, 3, S, S] in [0, 1], classes int64 [B])``, as torchvision's classifiers
    take them before normalization."""
    pairs = [classification_sample(config, split, int(i)) for i in indices]
    images = np.stack([rgb.transpose(2, 0, 1).astype(np.float32) / np.float32(255.0) for rgb, _ in pairs])
    return images, np.array([label for _, label in pairs], np.int64)


#: a classifier's data: one object in each 64 x 64 image, its class the label
CLASSIFIER_DATA = SyntheticConfig(size=64, min_objects=1, max_objects=1, min_side=28, max_side=60)


def coco_ground_truth(config: SyntheticConfig, split: str, count: int) -> dict:
    """The first ``count`` images of ``split`` as a COCO dataset dict (image ids 1..count; masks
    as RLE, keypoints with their names), for ``pycocotools.coco.COCO``."""
    from pycocotools import mask as mask_utils

    images, annotations = [], []
    for index in range(count):
        _, target = sample(config, split, index)
        images.append({"id": index + 1, "width": config.size, "height": config.size})
        for box, label, mask, points in zip(
            target["boxes"], target["labels"], target["masks"], target["keypoints"]
        ):
            rle = mask_utils.encode(np.asfortranarray(mask))
            rle["counts"] = rle["counts"].decode("ascii")
            x0, y0, x1, y1 = (float(v) for v in box)
            annotations.append({
                "id": len(annotations) + 1,
                "image_id": index + 1,
                "category_id": int(label),
                "bbox": [x0, y0, x1 - x0, y1 - y0],
                "area": float(mask.sum()),
                "segmentation": rle,
                "iscrowd": 0,
                "keypoints": [float(v) for v in points.ravel()],
                "num_keypoints": NUM_KEYPOINTS,
            })
    categories = [
        {"id": i, "name": name, "keypoints": list(KEYPOINT_NAMES), "skeleton": [[1, 2], [2, 3]]}
        for i, name in enumerate(CLASSES)
        if i
    ]
    return {"images": images, "annotations": annotations, "categories": categories}


__all__ = [
    "CLASSES",
    "CLASSIFIER_DATA",
    "KEYPOINT_NAMES",
    "NUM_KEYPOINTS",
    "PHOTO_NAMES",
    "SPLITS",
    "VERSION",
    "SyntheticConfig",
    "classification_batch",
    "classification_sample",
    "coco_ground_truth",
    "fingerprint",
    "photo",
    "sample",
]
