"""torchvision's R-CNN detectors as both model routes build them: no download, a seed or a file.

:class:`RCNNConfig` holds torchvision's own keyword arguments and the weights; it is the base of
:class:`~tvm_roialign.models.maskrcnn.MaskRCNNConfig` (the three-piece Mask R-CNN) and of
:class:`~tvm_roialign.models.detection.DetectorConfig` (the standalone artifact, any detector).
:func:`build_rcnn` builds a named model from one, :func:`load_state_dict` checks a weights file
against the model. torch and torchvision are imported when a model is built, not on import
(``tvm_roialign.models.detection``, which uses this module, must import without them).

Errors name the file and what is wrong with it, never a command-line flag (the CLI adds its own).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from pathlib import Path


@dataclass
class RCNNConfig:
    """How a torchvision R-CNN is built (see the subclasses for the fields)."""

    seed: int = 3
    weights: str | None = None
    min_size: int = 512
    max_size: int = 512
    rpn_pre_nms_top_n_test: int = 1000
    rpn_post_nms_top_n_test: int = 1000
    box_detections_per_img: int = 100
    box_score_thresh: float = 0.05

    def torchvision_kwargs(self) -> dict:
        """The fields that are keyword arguments of torchvision's builder: all of this base class's
        but ``seed`` and ``weights`` (a subclass's own fields, as ``extra``, are not)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(RCNNConfig)
            if f.name not in ("seed", "weights")
        }

    def weights_origin(self) -> str:
        """Where the weights come from, short: :func:`weights_origin` of this config."""
        return weights_origin(self.weights, self.seed)

    def describe_weights(self) -> str:
        """One line: the weights file, or how the random weights were made."""
        if self.weights is not None:
            return str(self.weights)
        return f"random (weights=None, weights_backbone=None, seed {self.seed})"


def file_origin(path) -> str:
    """``NAME, sha256 PREFIX``: a file's name and the first 12 hex digits of its sha256, which
    tell two weights files apart where their names do not."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return f"{Path(path).name}, sha256 {digest.hexdigest()[:12]}"


def weights_origin(weights, seed) -> str:
    """A detector's weights in a few words, for its metadata, ``run``'s line and the picture's
    caption: ``random, seed N`` or the state_dict's :func:`file_origin`."""
    return f"random, seed {seed}" if weights is None else file_origin(weights)


def load_state_dict(path: str, model, name: str = "maskrcnn_resnet50_fpn") -> dict:
    """The state_dict in ``path`` checked against ``model``'s (torchvision's ``name``) parameter
    names and shapes.

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
        raise ValueError(f"weights file {path!r} is not a {name} state_dict: {', '.join(parts)}")
    return state


def build_rcnn(name: str, config: RCNNConfig, **extra):
    """torchvision's ``torchvision.models.detection.<name>`` in eval mode, built with ``config``
    (and ``extra`` keyword arguments): seeded random weights, or ``config.weights`` loaded.

    Raises
    ------
    FileNotFoundError, ValueError
        ``config.weights`` does not exist or is not a state_dict of this model
        (see :func:`load_state_dict`).
    """
    import torch
    import torchvision

    if config.weights is not None and "num_classes" not in extra:
        extra = {**extra, **head_sizes(str(config.weights))}
    # the seeded initialisation draws from torch's global generator: on a fork of it, so that the
    # caller's random state is as it was (the same seed gives the same weights as before)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = getattr(torchvision.models.detection, name)(
            weights=None, weights_backbone=None, **config.torchvision_kwargs(), **extra
        )
    if config.weights is not None:
        model.load_state_dict(load_state_dict(str(config.weights), model, name))
    return model.eval()


def head_sizes(path: str) -> dict:
    """``num_classes`` (and a Keypoint R-CNN's ``num_keypoints``) of the weights file ``path``,
    so that a model trained for other classes than COCO's (as the reference detectors of
    :mod:`tvm_roialign.datasets.reference`) is built to take it; ``{}`` where the file does not
    say (:func:`load_state_dict` then names what is wrong)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - load_state_dict reports it
        return {}
    state = state.get("model", state) if isinstance(state, dict) else {}
    out = {}
    classes = state.get("roi_heads.box_predictor.cls_score.weight")
    if isinstance(classes, torch.Tensor):
        out["num_classes"] = int(classes.shape[0])
    keypoints = state.get("roi_heads.keypoint_predictor.kps_score_lowres.weight")
    if isinstance(keypoints, torch.Tensor):
        out["num_keypoints"] = int(keypoints.shape[1])
    return out


def category_names() -> list[str] | None:
    """COCO category names of torchvision's detection models (index = label), or None without
    torchvision (or where its metadata moved)."""
    try:
        from torchvision.models.detection import MaskRCNN_ResNet50_FPN_Weights

        return list(MaskRCNN_ResNet50_FPN_Weights.DEFAULT.meta["categories"])
    except Exception:  # noqa: BLE001 - no torchvision, or its weights metadata changed
        return None


def _out_features(module, attribute: str) -> int | None:
    return getattr(getattr(module, attribute, None), "out_features", None)


def detector_names(model) -> dict:
    """The names a detector's metadata carries: ``categories`` (index = label; COCO's 91 for a
    model with 91 classes, background and person for a two-class Keypoint R-CNN, else None),
    and for a head of COCO's 17 person keypoints ``keypoint_names`` and ``keypoint_skeleton``
    (pairs of keypoint indices)."""
    from ..runtime.keypoints import COCO_KEYPOINT_NAMES, COCO_PERSON_CATEGORIES, COCO_SKELETON

    heads = model.roi_heads
    classes = _out_features(heads.box_predictor, "cls_score")
    keypoint_predictor = getattr(heads, "keypoint_predictor", None)
    num_keypoints = getattr(keypoint_predictor, "out_channels", None)
    names = category_names()
    if keypoint_predictor is not None and classes == len(COCO_PERSON_CATEGORIES):
        names = list(COCO_PERSON_CATEGORIES)
    out: dict = {"categories": names if names is not None and classes == len(names) else None}
    if num_keypoints == len(COCO_KEYPOINT_NAMES):
        out["keypoint_names"] = list(COCO_KEYPOINT_NAMES)
        out["keypoint_skeleton"] = [list(pair) for pair in COCO_SKELETON]
    return out


__all__ = [
    "RCNNConfig",
    "build_rcnn",
    "category_names",
    "detector_names",
    "head_sizes",
    "load_state_dict",
]
