"""The trained reference detectors: torchvision's ``maskrcnn_resnet50_fpn`` and
``keypointrcnn_resnet50_fpn`` (the shipped ResNet-50 FPN architecture, ``weights=None,
weights_backbone=None``: every weight trained here from scratch) on the synthetic dataset
(:mod:`.synthetic`), at its image size.

:class:`TrainConfig` holds what decides the weights (data, iterations, optimizer, seed);
:func:`weights_path` names them by a hash of it under ``~/.cache/tvm-roialign/reference/``
(``$TVM_ROIALIGN_CACHE`` overrides the root). ``tools/train_reference.py`` writes them; the
accuracy benchmark (``benchmarks/bench_accuracy.py``) reads them. Nothing in the tests needs them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .synthetic import CLASSES, CLASSIFIER_DATA, NUM_KEYPOINTS, SyntheticConfig

MODELS = {"maskrcnn": "maskrcnn_resnet50_fpn", "keypointrcnn": "keypointrcnn_resnet50_fpn"}
#: the reference classifiers (torchvision's, the classes of :data:`.synthetic.CLASSES` less the
#: background), trained on :data:`.synthetic.CLASSIFIER_DATA`
CLASSIFIERS = {"resnet18": "resnet18"}

#: torchvision's training-time sampling, smaller than its defaults for speed (not architecture)
TRAIN_SAMPLING = dict(
    rpn_pre_nms_top_n_train=400,
    rpn_post_nms_top_n_train=100,
    rpn_batch_size_per_image=128,
    box_batch_size_per_image=32,
)
#: the Keypoint R-CNN's: fewer RoIs a photo, since its keypoint head (eight 3x3 convolutions of 512
#: channels at 14x14 per positive RoI) costs about 8x the mask head's
KEYPOINT_SAMPLING = {**TRAIN_SAMPLING, "box_batch_size_per_image": 8}


def train_sampling(model: str) -> dict:
    """torchvision's training-time sampling settings of ``model`` (not architecture)."""
    return KEYPOINT_SAMPLING if model == "keypointrcnn" else TRAIN_SAMPLING
#: the backbone's parameters left at their seeded values: none (with the stem and the first two
#: stages frozen, 500 steps gave box mAP 5.5 points on 30 held-out images: the box and mask heads
#: read P2, whose lateral input is the first stage's output)
FROZEN: tuple[str, ...] = ()
#: what the Keypoint R-CNN trains: its keypoint head, on the trained Mask R-CNN's backbone, RPN and
#: box head (the same architecture and classes), which it starts from and keeps as they are
#: (BatchNorm in eval mode): the heads on a trained backbone, in a fifth of Mask R-CNN's steps
KEYPOINT_TRAINED = ("roi_heads.keypoint_head.", "roi_heads.keypoint_predictor.")


@dataclass(frozen=True)
class TrainConfig:
    """What decides the trained weights: the model, the data, the optimizer's schedule."""

    model: str = "maskrcnn"
    data: SyntheticConfig = field(default_factory=SyntheticConfig)
    train_images: int = 4000
    iterations: int = 3000
    batch: int = 4
    lr: float = 5e-4
    weight_decay: float = 1e-4
    warmup: int = 30
    #: the share of the iterations after which the rate drops tenfold (the boxes' last pixels)
    decay_at: float = 0.8
    #: train-split batches that re-estimate BatchNorm's statistics after training (0: none)
    bn_batches: int = 50
    seed: int = 0

    @classmethod
    def defaults(cls, model: str = "maskrcnn") -> TrainConfig:
        """The reference's schedule for ``model``: Mask R-CNN 3000 steps from scratch; Keypoint
        R-CNN 400 steps of its keypoint head on the Mask R-CNN (:meth:`base`)."""
        if model == "keypointrcnn":
            return cls(model=model, iterations=400, bn_batches=0)
        if model in CLASSIFIERS:
            return cls(model=model, data=CLASSIFIER_DATA, iterations=600, batch=32, lr=1e-3, bn_batches=20)
        return cls(model=model)

    def base(self) -> TrainConfig | None:
        """The trained detector this one starts from (Keypoint R-CNN: the default Mask R-CNN of
        the same data and seed), or None (trained from scratch)."""
        if self.model == "keypointrcnn":
            return TrainConfig(data=self.data, seed=self.seed)
        return None

    def key(self) -> str:
        """12 hex digits naming the weights this config trains."""
        fields = {"v": 2, **asdict(self), **train_sampling(self.model), "frozen": FROZEN}
        base = self.base()
        if base is not None:
            fields.update(base=base.key(), trained=KEYPOINT_TRAINED)
        text = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_dir() -> Path:
    root = os.environ.get("TVM_ROIALIGN_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "tvm-roialign") / "reference"


def weights_path(config: TrainConfig) -> Path:
    return cache_dir() / f"{config.model}-{config.data.size}px-{config.key()}.pth"


def build_model(model: str = "maskrcnn", size: int = 128, seed: int = 0, weights: str | None = None):
    """A classifier of :data:`CLASSIFIERS` (the classes less the background), or
    torchvision's detector for the synthetic classes (``num_classes`` = 4 + background; the
    Keypoint R-CNN with :data:`NUM_KEYPOINTS` keypoints on all of them), resizing to ``size``,
    torchvision's test-time settings otherwise; seeded random weights, or ``weights`` loaded.
    In eval mode."""
    if model in CLASSIFIERS:
        return _classifier(model, seed, weights)
    from ..models._torchvision import RCNNConfig, build_rcnn

    extra: dict = dict(num_classes=len(CLASSES), **train_sampling(model))
    if model == "keypointrcnn":
        extra["num_keypoints"] = NUM_KEYPOINTS
    config = RCNNConfig(seed=seed, weights=weights, min_size=size, max_size=size)
    return build_rcnn(MODELS[model], config, **extra)


def _classifier(model: str, seed: int, weights: str | None):
    import torch
    import torchvision

    torch.manual_seed(seed)
    net = getattr(torchvision.models, CLASSIFIERS[model])(weights=None, num_classes=len(CLASSES) - 1)
    if weights is not None:
        net.load_state_dict(torch.load(weights, map_location="cpu"))
    return net.eval()


def load_path(config: TrainConfig) -> Path:
    """:func:`weights_path` of ``config`` when the file is there, else a FileNotFoundError (one
    line) naming the command that trains it."""
    path = weights_path(config)
    if not path.exists():
        hint = "" if config.iterations == TrainConfig.defaults(config.model).iterations else (
            f" --iterations {config.iterations}")
        command = f"python tools/train_reference.py --model {config.model}{hint}"
        raise FileNotFoundError(f"no trained {config.model} at {path}: run {command}")
    return path


def load_reference(config: TrainConfig):
    """The trained detector of ``config`` in eval mode (:func:`load_path`'s error when it is not
    cached)."""
    return build_model(config.model, config.data.size, weights=str(load_path(config)))


__all__ = [
    "CLASSIFIERS",
    "FROZEN",
    "KEYPOINT_TRAINED",
    "MODELS",
    "TRAIN_SAMPLING",
    "TrainConfig",
    "build_model",
    "load_path",
    "load_reference",
    "train_sampling",
    "weights_path",
]
