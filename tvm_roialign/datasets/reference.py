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

from .synthetic import CLASSES, NUM_KEYPOINTS, SyntheticConfig

MODELS = {"maskrcnn": "maskrcnn_resnet50_fpn", "keypointrcnn": "keypointrcnn_resnet50_fpn"}

#: torchvision's training-time sampling, smaller than its defaults for speed (not architecture)
TRAIN_SAMPLING = dict(
    rpn_pre_nms_top_n_train=400,
    rpn_post_nms_top_n_train=100,
    rpn_batch_size_per_image=128,
    box_batch_size_per_image=16,
)
#: the backbone's parameters left at their seeded values (the stem and the first two stages:
#: random filters keep the colours and edges the shapes need, and skipping their gradients takes
#: the backbone's most expensive backward away); their BatchNorm statistics still follow the data
FROZEN = ("backbone.body.conv1.", "backbone.body.bn1.", "backbone.body.layer1.", "backbone.body.layer2.")


@dataclass(frozen=True)
class TrainConfig:
    """What decides the trained weights: the model, the data, the optimizer's schedule."""

    model: str = "maskrcnn"
    data: SyntheticConfig = field(default_factory=SyntheticConfig)
    train_images: int = 4000
    iterations: int = 400
    batch: int = 4
    lr: float = 5e-4
    weight_decay: float = 1e-4
    warmup: int = 30
    seed: int = 0

    def key(self) -> str:
        """12 hex digits naming the weights this config trains."""
        text = json.dumps({"v": 1, **asdict(self), **TRAIN_SAMPLING, "frozen": FROZEN}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_dir() -> Path:
    root = os.environ.get("TVM_ROIALIGN_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "tvm-roialign") / "reference"


def weights_path(config: TrainConfig) -> Path:
    return cache_dir() / f"{config.model}-{config.data.size}px-{config.key()}.pth"


def build_model(model: str = "maskrcnn", size: int = 128, seed: int = 0, weights: str | None = None):
    """torchvision's detector for the synthetic classes (``num_classes`` = 4 + background; the
    Keypoint R-CNN with :data:`NUM_KEYPOINTS` keypoints on all of them), resizing to ``size``,
    torchvision's test-time settings otherwise; seeded random weights, or ``weights`` loaded.
    In eval mode."""
    from ..models._torchvision import RCNNConfig, build_rcnn

    extra: dict = dict(num_classes=len(CLASSES), **TRAIN_SAMPLING)
    if model == "keypointrcnn":
        extra["num_keypoints"] = NUM_KEYPOINTS
    config = RCNNConfig(seed=seed, weights=weights, min_size=size, max_size=size)
    return build_rcnn(MODELS[model], config, **extra)


def load_reference(config: TrainConfig):
    """The trained detector of ``config`` in eval mode; a FileNotFoundError (one line) naming the
    command that trains it when it is not cached."""
    path = weights_path(config)
    if not path.exists():
        raise FileNotFoundError(
            f"no trained {config.model} at {path}: run python tools/train_reference.py --model {config.model}"
        )
    return build_model(config.model, config.data.size, weights=str(path))


__all__ = [
    "FROZEN", "MODELS", "TRAIN_SAMPLING", "TrainConfig", "build_model", "load_reference", "weights_path",
]
