"""Reading a photo file as the ``[H, W, 3]`` uint8 RGB array the detectors take.

Pillow opens the file; every failure is one ``ValueError`` line naming the file (``FileNotFoundError``
when there is none): not an image, a truncated or corrupt one, a picture over Pillow's
decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``; the header's size is checked before
anything is decoded), or pixels with no fixed range. The modes are converted as torchvision's
``read_image(path, ImageReadMode.RGB)`` converts them: palette, grey, 1-bit and CMYK expanded to RGB,
alpha dropped, and 16-bit samples (Pillow's ``I;16`` modes) reduced to 8 bits by keeping the high
byte, what ``torchvision.transforms.v2.functional.to_dtype(image, torch.uint8, scale=True)`` does
to the ``uint16`` image ``read_image`` gives.
"""

from __future__ import annotations

import re
import warnings

import numpy as np

__all__ = ["read_image"]

#: Modes with no fixed value range (32-bit integers, floats): refused rather than guessed.
_UNSCALED = {"I": "32-bit integer", "F": "32-bit float"}


def _to_rgb(img, name: str) -> np.ndarray:
    if img.mode.startswith("I;16"):
        grey = np.asarray(img).astype(np.uint16) >> 8
        return np.repeat(grey.astype(np.uint8)[:, :, None], 3, axis=2)
    if img.mode in _UNSCALED:
        raise ValueError(
            f"image {name!r} has {_UNSCALED[img.mode]} pixels (Pillow mode {img.mode!r}), whose "
            "range is not fixed; save it as an 8- or 16-bit image"
        )
    try:
        return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    except ValueError as err:  # a mode Pillow cannot convert to RGB (LAB, HSV...)
        raise ValueError(
            f"image {name!r} has the Pillow mode {img.mode!r}, which has no RGB conversion: {err}"
        ) from None


def _bomb_message(name: str, err) -> str:
    """Pillow's "Image size (N pixels) exceeds limit of M pixels..." as one line naming ``name``."""
    from PIL import Image

    found = re.search(r"\((\d+) pixels\)", str(err))
    pixels = f"{int(found.group(1)):,} pixels" if found else "more pixels than allowed"
    return (
        f"image {name!r} has {pixels}, over Pillow's decompression-bomb limit of "
        f"{Image.MAX_IMAGE_PIXELS:,} pixels (PIL.Image.MAX_IMAGE_PIXELS); resize the photo"
    )


def read_image(path) -> np.ndarray:
    """An RGB photo as ``[H, W, 3]`` uint8 (any format Pillow reads; see the module's doc)."""
    from PIL import Image, UnidentifiedImageError

    name = str(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                img.load()
                return _to_rgb(img, name)
    except FileNotFoundError:
        raise FileNotFoundError(f"image {name!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"image {name!r} is a folder, not a picture") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ValueError(_bomb_message(name, err)) from None
    except UnidentifiedImageError:
        raise ValueError(
            f"image {name!r} is not a readable image (not a picture, or a format Pillow "
            "does not know)"
        ) from None
    except (OSError, SyntaxError, EOFError) as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"image {name!r} is truncated or corrupt: {detail}") from None
