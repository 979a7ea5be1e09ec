"""The PyTorch side: torchvision's Mask R-CNN (seeded random or loaded weights) and the photo.

The model is built, and a weights file checked, by :mod:`tvm_roialign.models._torchvision` (shared
with the standalone detectors of :mod:`tvm_roialign.models.detection`); photos are read by
:func:`tvm_roialign.runtime.detector.read_image`. Errors name the file and what is wrong with it,
never a command-line flag (the CLI adds its own).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...runtime.detector import read_image
from .._torchvision import RCNNConfig, build_rcnn, category_names, load_state_dict

#: What the JSON report and the picture say for the default photo.
DEFAULT_IMAGE = "skimage.data.astronaut()"


@dataclass
class MaskRCNNConfig(RCNNConfig):
    """How the torchvision model is built.

    ``seed`` seeds the random weights (``weights=None, weights_backbone=None``: no download),
    ``weights`` is a state_dict file to load instead; ``min_size``/``max_size`` are torchvision's
    resize bounds (default 512: the astronaut photo is used at its own size);
    ``rpn_pre_nms_top_n_test``/``rpn_post_nms_top_n_test`` the proposals kept before/after the RPN's
    NMS (box-branch rois); ``box_detections_per_img`` the most detections (mask-branch rois);
    ``box_score_thresh`` torchvision's score threshold.
    """


def build_torch_model(config: MaskRCNNConfig | None = None):
    """torchvision ``maskrcnn_resnet50_fpn`` in eval mode, seeded or loaded from ``config.weights``.

    Raises
    ------
    FileNotFoundError, ValueError
        ``config.weights`` does not exist or is not a state_dict of this model
        (see :func:`load_state_dict`).
    """
    return build_rcnn("maskrcnn_resnet50_fpn", config or MaskRCNNConfig())


def load_image(path: str | None = None):
    """A ``[3, H, W]`` float32 tensor in [0, 1]: ``path`` (any PIL format) or scikit-image's astronaut.

    Raises
    ------
    FileNotFoundError, ValueError
        ``path`` does not exist or is not an image.
    """
    import torch

    if path is None:
        from skimage import data

        array = data.astronaut()
    else:
        array = read_image(path)
    return torch.from_numpy(np.array(array, dtype=np.uint8)).permute(2, 0, 1).float() / 255.0


__all__ = [
    "DEFAULT_IMAGE",
    "MaskRCNNConfig",
    "build_torch_model",
    "category_names",
    "load_image",
    "load_state_dict",
]
