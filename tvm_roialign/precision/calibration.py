"""Calibration inputs for ``precision="int8"``: photos prepared as a classifier's input, or as
they are for a detector artifact's photo function.

A model whose ``main`` takes one float32 image batch, ``[N, 3, H, W]`` or ``[N, H, W, 3]`` with
static ``H`` and ``W``, is calibrated on photos: the package's sample photos
(:data:`~tvm_roialign.runtime.sample_photos.SAMPLE_PHOTOS`) or every photo of a directory,
each resized to ``H x W`` and normalized as torchvision's classifiers take it
(:func:`~tvm_roialign.runtime.sample_photos.prepare_photo`), ``N`` photos a batch (the list repeated to fill
the last one). Other models take their calibration inputs as arrays.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from ..runtime.sample_photos import photos as read_photos
from ..runtime.sample_photos import prepare_photo


def image_layout(mod: tvm.IRModule) -> tuple[str, list[int]] | None:
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


def calibration_entry(mod: tvm.IRModule) -> str:
    """The function of ``mod`` calibration runs: ``main``, or a detector artifact's photo function
    (:data:`~tvm_roialign.runtime.detector.PHOTO_FUNCTION`, which takes a photo as it is)."""
    from ..runtime.detector import PHOTO_FUNCTION

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
        return [[np.ascontiguousarray(p, dtype=np.uint8)] for p in read_photos(source)]
    layout = image_layout(mod)
    if layout is None:
        raise ValueError(
            "calibrate: int8 calibration on photos needs a model of one float32 input "
            "[N, 3, H, W] or [N, H, W, 3] (static); pass calibration inputs as arrays instead"
        )
    kind, dims = layout
    height, width = (dims[2], dims[3]) if kind == "NCHW" else (dims[1], dims[2])
    photos = read_photos(source)
    images = [prepare_photo(p, height, width) for p in photos]
    batch = dims[0]
    runs = []
    for start in range(0, len(images), batch):
        chunk = [images[(start + i) % len(images)] for i in range(batch)]
        array = np.stack(chunk)
        runs.append([np.ascontiguousarray(array if kind == "NCHW" else array.transpose(0, 2, 3, 1))])
    return runs


__all__ = ["calibration_entry", "calibration_inputs"]
