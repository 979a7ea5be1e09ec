"""The torchvision detectors a name builds (:data:`DETECTORS`), their COCO category names, and
detector programs read from a ``.pt2`` file (parts of :mod:`tvm_roialign.models.detection`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ._torchvision import RCNNConfig, build_rcnn

#: Model names :func:`build_torch_detector` knows (torchvision builders).
DETECTORS = (
    "maskrcnn_resnet50_fpn",
    "fasterrcnn_resnet50_fpn",
    "maskrcnn_resnet50_fpn_v2",
    "fasterrcnn_resnet50_fpn_v2",
    "fasterrcnn_mobilenet_v3_large_fpn",
    "keypointrcnn_resnet50_fpn",
)


@dataclass
class DetectorConfig(RCNNConfig):
    """How a named torchvision detector is built (torchvision's own keyword arguments).

    Weights: ``weights=None, weights_backbone=None`` and ``seed`` (nothing is downloaded), or a
    state_dict file. ``min_size`` / ``max_size`` are torchvision's resize bounds (512 here, so
    that the 512x512 astronaut photo is used at its own size); the caps are torchvision's.
    ``extra``: further keyword arguments of the torchvision builder. The fields other than
    ``extra`` are those of :class:`tvm_roialign.models.maskrcnn.MaskRCNNConfig` (one base).
    """

    extra: dict = field(default_factory=dict)


def build_torch_detector(name: str, config: DetectorConfig | None = None):
    """torchvision's detector ``name`` (one of :data:`DETECTORS`) in eval mode.

    Raises
    ------
    ValueError
        Unknown name, or ``config.weights`` is not a state_dict of this model.
    FileNotFoundError
        ``config.weights`` does not exist.
    """
    if name not in DETECTORS:
        raise ValueError(
            f"unknown detector {name!r}: use one of {', '.join(DETECTORS)}"
        )
    config = config or DetectorConfig()
    return build_rcnn(name, config, **config.extra)


def load_program(path: Path):
    """The ``torch.export`` program in ``path`` (a ``.pt2``), with tvm-roialign's ops registered."""
    import torch

    from ..frontend import detection  # noqa: F401 - registers tvm_roialign::batched_nms

    if not path.is_file():
        raise FileNotFoundError(f"model file {str(path)!r} does not exist")
    try:
        return torch.export.load(str(path))
    except Exception as err:  # noqa: BLE001
        first = (
            str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        )
        raise ValueError(
            f"cannot read {str(path)!r} as a torch.export program: {first}"
        ) from None


__all__ = ["DETECTORS", "DetectorConfig", "build_torch_detector", "load_program"]
