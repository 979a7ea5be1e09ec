"""The PyTorch side: torchvision's Mask R-CNN (seeded random or loaded weights) and the photo.

Errors name the file and what is wrong with it, never a command-line flag (the CLI adds its own).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: What the JSON report and the picture say for the default photo.
DEFAULT_IMAGE = "skimage.data.astronaut()"


@dataclass
class MaskRCNNConfig:
    """How the torchvision model is built.

    ``seed`` seeds the random weights (``weights=None, weights_backbone=None``: no download),
    ``weights`` is a state_dict file to load instead; ``min_size``/``max_size`` are torchvision's
    resize bounds (default 512: the astronaut photo is used at its own size);
    ``rpn_pre_nms_top_n_test``/``rpn_post_nms_top_n_test`` the proposals kept before/after the RPN's
    NMS (box-branch rois); ``box_detections_per_img`` the most detections (mask-branch rois);
    ``box_score_thresh`` torchvision's score threshold.
    """

    seed: int = 3
    weights: str | None = None
    min_size: int = 512
    max_size: int = 512
    rpn_pre_nms_top_n_test: int = 1000
    rpn_post_nms_top_n_test: int = 1000
    box_detections_per_img: int = 100
    box_score_thresh: float = 0.05

    def describe_weights(self) -> str:
        """One line: the weights file, or how the random weights were made."""
        if self.weights is not None:
            return str(self.weights)
        return f"random (weights=None, weights_backbone=None, seed {self.seed})"


def load_state_dict(path: str, model) -> dict:
    """The state_dict in ``path`` checked against ``model``'s parameter names and shapes.

    A ``{"model": state_dict}`` checkpoint (torchvision's reference scripts) is unwrapped.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        ``path`` was not written by ``torch.save``, holds something other than a dict of tensors,
        or its names or shapes are not those of ``model``.
    """
    import torch

    how = "write one with torch.save(model.state_dict(), path)"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"weights file {path!r} does not exist") from None
    except Exception:  # noqa: BLE001 - torch raises KeyError, UnpicklingError, RuntimeError...
        raise ValueError(
            f"weights file {path!r} is not a PyTorch file written by torch.save ({how})"
        ) from None
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(
            f"weights file {path!r} holds a {type(state).__name__}, not a state_dict "
            f"(a dict of parameter names to tensors; {how})"
        )
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        parts = []
        for what, keys in (("missing", missing), ("unexpected", unexpected), ("misshapen", wrong)):
            if keys:
                parts.append(f"{len(keys)} {what} (e.g. {keys[0]})")
        raise ValueError(
            f"weights file {path!r} is not a maskrcnn_resnet50_fpn state_dict: {', '.join(parts)}"
        )
    return state


def build_torch_model(config: MaskRCNNConfig | None = None):
    """torchvision ``maskrcnn_resnet50_fpn`` in eval mode, seeded or loaded from ``config.weights``.

    Raises
    ------
    FileNotFoundError, ValueError
        ``config.weights`` does not exist or is not a state_dict of this model
        (see :func:`load_state_dict`).
    """
    import torch
    import torchvision

    config = config or MaskRCNNConfig()
    torch.manual_seed(config.seed)
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(
        weights=None,
        weights_backbone=None,
        min_size=config.min_size,
        max_size=config.max_size,
        rpn_pre_nms_top_n_test=config.rpn_pre_nms_top_n_test,
        rpn_post_nms_top_n_test=config.rpn_post_nms_top_n_test,
        box_detections_per_img=config.box_detections_per_img,
        box_score_thresh=config.box_score_thresh,
    )
    if config.weights is not None:
        model.load_state_dict(load_state_dict(config.weights, model))
    return model.eval()


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
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as img:
                array = np.asarray(img.convert("RGB"))
        except FileNotFoundError:
            raise FileNotFoundError(f"image {path!r} does not exist") from None
        except (UnidentifiedImageError, OSError) as err:
            raise ValueError(f"image {path!r} is not a readable image: {err}") from None
    return torch.from_numpy(np.array(array, dtype=np.uint8)).permute(2, 0, 1).float() / 255.0


def category_names() -> list[str] | None:
    """COCO category names of torchvision's detection models (index = label), or None."""
    try:
        from torchvision.models.detection import MaskRCNN_ResNet50_FPN_Weights
    except ImportError:
        return None
    return list(MaskRCNN_ResNet50_FPN_Weights.DEFAULT.meta["categories"])


__all__ = [
    "DEFAULT_IMAGE",
    "MaskRCNNConfig",
    "build_torch_model",
    "category_names",
    "load_image",
    "load_state_dict",
]
