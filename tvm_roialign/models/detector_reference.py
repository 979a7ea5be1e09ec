"""Sample photos (:mod:`tvm_roialign.runtime.sample_photos`) and torchvision eager's detections on a photo:
what tests and benchmarks compare a detector artifact against (re-exported by
:mod:`tvm_roialign.models.detection`)."""

from __future__ import annotations

from ..runtime.sample_photos import SAMPLE_PHOTOS, sample_photo


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
