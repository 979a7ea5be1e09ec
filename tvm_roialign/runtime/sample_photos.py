"""Photos for calibration and tests, read as the ``[H, W, 3]`` uint8 RGB arrays the detectors
take: the sample photos that installed packages ship (:func:`sample_photo`), every photo of a
directory (:func:`directory_photos`), and a photo as a classifier's input (:func:`prepare_photo`:
torchvision's resize and ImageNet normalization).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .photo import read_image

#: Photos that installed packages ship: scikit-image's and matplotlib's.
SAMPLE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "grace_hopper")

#: the suffixes of the files a directory's photos are read from
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")

_MEAN = np.array((0.485, 0.456, 0.406), np.float32)
_STD = np.array((0.229, 0.224, 0.225), np.float32)


def sample_photo(name: str):
    """An RGB photo ``[H, W, 3]`` uint8 that an installed package ships: scikit-image's
    ``astronaut`` (512x512), ``coffee`` (400x600), ``chelsea`` (300x451), ``rocket`` (427x640),
    or matplotlib's ``grace_hopper`` (600x512)."""
    if name == "grace_hopper":
        from matplotlib import cbook

        return read_image(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    if name not in SAMPLE_PHOTOS:
        raise ValueError(
            f"unknown sample photo {name!r}: use one of {', '.join(SAMPLE_PHOTOS)}"
        )
    from skimage import data

    return np.ascontiguousarray(getattr(data, name)(), dtype=np.uint8)


def directory_photos(directory, what: str = "calibrate") -> list[np.ndarray]:
    """Every photo of ``directory`` (by :data:`PHOTO_SUFFIXES`, in name order); a one-line
    ValueError, naming ``what``, for a path that is no directory or holds no photo."""
    path = Path(directory)
    if not path.is_dir():
        raise ValueError(f"{what}: {directory} is not a directory of photos")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in PHOTO_SUFFIXES)
    if not files:
        raise ValueError(f"{what}: {directory} holds no photos ({', '.join(PHOTO_SUFFIXES)})")
    return [read_image(str(p)) for p in files]


def photos(source=None) -> list[np.ndarray]:
    """The RGB photos of ``source``: None, the sample photos; else a directory's."""
    return [sample_photo(n) for n in SAMPLE_PHOTOS] if source is None else directory_photos(source)


def prepare_photo(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """``[3, height, width]`` float32: ``rgb`` (``[H, W, 3]`` uint8) resized (bilinear) and
    normalized with ImageNet's mean and standard deviation, as torchvision's classifiers take it."""
    from PIL import Image

    resized = Image.fromarray(rgb).resize((width, height), Image.BILINEAR)
    return ((np.asarray(resized, np.float32) / 255.0 - _MEAN) / _STD).transpose(2, 0, 1)


__all__ = ["PHOTO_SUFFIXES", "SAMPLE_PHOTOS", "directory_photos", "photos", "prepare_photo", "sample_photo"]
