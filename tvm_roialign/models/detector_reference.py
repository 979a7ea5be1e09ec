"""Sample photos that installed packages ship and torchvision eager's detections on a photo: what
tests and benchmarks compare a detector artifact against (re-exported by
:mod:`tvm_roialign.models.detection`)."""

from __future__ import annotations

from ..runtime.detector import read_image

#: Photos that installed packages ship: scikit-image's and matplotlib's.
SAMPLE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "grace_hopper")


def sample_photo(name: str):
    """An RGB photo ``[H, W, 3]`` uint8 that an installed package ships: scikit-image's
    ``astronaut`` (512x512), ``coffee`` (400x600), ``chelsea`` (300x451), ``rocket`` (427x640),
    or matplotlib's ``grace_hopper`` (600x512)."""
    import numpy as np

    if name == "grace_hopper":
        from matplotlib import cbook

        return read_image(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    if name not in SAMPLE_PHOTOS:
        raise ValueError(
            f"unknown sample photo {name!r}: use one of {', '.join(SAMPLE_PHOTOS)}"
        )
    from skimage import data

    return np.ascontiguousarray(getattr(data, name)(), dtype=np.uint8)


def torch_detections(model, rgb) -> dict:
    """torchvision eager on an RGB uint8 photo (as a ``[3, H, W]`` float tensor in [0, 1]), as
    NumPy arrays: ``boxes``, ``labels``, ``scores`` and, for Mask R-CNN, ``masks [n, H, W]``,
    for Keypoint R-CNN ``keypoints [n, K, 3]`` and ``keypoints_scores [n, K]``."""
    import numpy as np
    import torch

    image = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float() / 255.0
    with torch.no_grad():
        (result,) = model([image])
    return detections_as_numpy(result)


def detections_as_numpy(result) -> dict:
    """One image's result of a torchvision detector as the NumPy arrays of
    :func:`torch_detections` (a mask without its channel axis)."""
    out = {key: result[key].numpy() for key in ("boxes", "labels", "scores")}
    if "masks" in result:
        out["masks"] = result["masks"][:, 0].numpy()
    for key in ("keypoints", "keypoints_scores"):
        if key in result:
            out[key] = result[key].numpy()
    return out


__all__ = ["SAMPLE_PHOTOS", "detections_as_numpy", "sample_photo", "torch_detections"]
