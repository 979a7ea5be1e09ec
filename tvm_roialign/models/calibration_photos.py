"""Calibration inputs for ``precision="int8"``: photos prepared as a classifier's input, or as
they are for a detector artifact's photo function.

A model whose ``main`` takes one float32 image batch, ``[N, 3, H, W]`` or ``[N, H, W, 3]`` with
static ``H`` and ``W``, is calibrated on photos: the package's sample photos
(:data:`~tvm_roialign.models.detector_reference.SAMPLE_PHOTOS`) or every photo of a directory,
each resized to ``H x W`` (bilinear), scaled to [0, 1] and normalized with ImageNet's mean and
standard deviation (torchvision's preprocessing), ``N`` photos a batch (the list repeated to fill
the last one). Other models take their calibration inputs as arrays.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from .detector_reference import SAMPLE_PHOTOS, sample_photo

_MEAN = np.array((0.485, 0.456, 0.406), np.float32)
_STD = np.array((0.229, 0.224, 0.225), np.float32)

#: the suffixes of the files a calibration directory's photos are read from
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def _image_layout(mod: tvm.IRModule) -> tuple[str, list[int]] | None:
    """``("NCHW" | "NHWC", shape)`` of ``main``'s one image parameter, else None."""
    params = mod["main"].params
    if len(params) != 1 or not isinstance(params[0].ty, relax.TensorType):
        return None
    ty = params[0].ty
    if str(ty.dtype) != "float32" or not isinstance(ty.shape, relax.ShapeExpr) or ty.ndim != 4:
        return None
    dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in ty.shape.values]
    if None in dims:
        return None
    if dims[1] == 3:
        return "NCHW", dims
    if dims[3] == 3:
        return "NHWC", dims
    return None


def _directory_photos(directory) -> list[np.ndarray]:
    from ..runtime import read_image

    path = Path(directory)
    if not path.is_dir():
        raise ValueError(f"calibrate: {directory} is not a directory of photos")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in PHOTO_SUFFIXES)
    if not files:
        raise ValueError(f"calibrate: {directory} holds no photos ({', '.join(PHOTO_SUFFIXES)})")
    return [read_image(str(p)) for p in files]


def _photos(source) -> list[np.ndarray]:
    """The RGB photos of ``source``: None, the package's sample photos; else a directory's."""
    return [sample_photo(n) for n in SAMPLE_PHOTOS] if source is None else _directory_photos(source)


def prepare_photo(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """``[3, height, width]`` float32: ``rgb`` (``[H, W, 3]`` uint8) resized and normalized."""
    from PIL import Image

    resized = Image.fromarray(rgb).resize((width, height), Image.BILINEAR)
    return ((np.asarray(resized, np.float32) / 255.0 - _MEAN) / _STD).transpose(2, 0, 1)


def calibration_entry(mod: tvm.IRModule) -> str:
    """The function of ``mod`` calibration runs: ``main``, or a detector artifact's photo function
    (:data:`~tvm_roialign.models.detector_photo.PHOTO_FUNCTION`, which takes a photo as it is)."""
    from .detector_photo import PHOTO_FUNCTION

    names = {gvar.name_hint for gvar in mod.get_global_vars()}
    return PHOTO_FUNCTION if "main" not in names and PHOTO_FUNCTION in names else "main"


def calibration_inputs(mod: tvm.IRModule, source=None) -> list[list[np.ndarray]]:
    """The calibration runs of ``mod``'s :func:`calibration_entry`, each a list of its arguments:
    ``source`` None (the sample photos), a directory of photos, or a sequence of runs (each an array
    or a list of arrays), taken as they are. A detector's photo function takes each photo as it is
    (``[H, W, 3]`` uint8); a ``main`` of one image batch, each photo resized and normalized. A
    ValueError (one line) for photos and a model that takes no image."""
    if source is not None and not isinstance(source, (str, Path)):
        return [list(run) if isinstance(run, (list, tuple)) else [run] for run in source]
    if calibration_entry(mod) != "main":
        return [[np.ascontiguousarray(p, dtype=np.uint8)] for p in _photos(source)]
    layout = _image_layout(mod)
    if layout is None:
        raise ValueError(
            "calibrate: int8 calibration on photos needs a model of one float32 input "
            "[N, 3, H, W] or [N, H, W, 3] (static); pass calibration inputs as arrays instead"
        )
    kind, dims = layout
    height, width = (dims[2], dims[3]) if kind == "NCHW" else (dims[1], dims[2])
    photos = _photos(source)
    images = [prepare_photo(p, height, width) for p in photos]
    batch = dims[0]
    runs = []
    for start in range(0, len(images), batch):
        chunk = [images[(start + i) % len(images)] for i in range(batch)]
        array = np.stack(chunk)
        runs.append([np.ascontiguousarray(array if kind == "NCHW" else array.transpose(0, 2, 3, 1))])
    return runs


__all__ = ["PHOTO_SUFFIXES", "calibration_entry", "calibration_inputs", "prepare_photo"]
