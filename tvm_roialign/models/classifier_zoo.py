"""torchvision classifiers with random weights whose activations stay normal floats: what the
model-zoo test and benchmark compile and compare with eager.

torchvision initializes a batch norm's statistics to mean 0, variance 1; with random weights the
activations then shrink layer after layer (mobilenet's outputs reach 1e-10, denormal floats, which
slow every runtime, eager most). :func:`build_classifier` runs ``calibration_passes`` forward passes
in train mode on the package's sample photos first, the batch norms averaging their batches'
statistics, so that each normalizes what it actually sees. Classifier layers torchvision starts at
zero (``vit_b_16``'s head) get small random weights, so the output depends on every layer.
"""

from __future__ import annotations

from .detector_reference import SAMPLE_PHOTOS, sample_photo

#: Model names :func:`build_classifier` knows (torchvision builders).
CLASSIFIERS = (
    "resnet18",
    "resnet50",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "convnext_tiny",
    "vit_b_16",
    "swin_t",
    "resnext50_32x4d",
)

#: ImageNet's per-channel mean and standard deviation (torchvision's preprocessing).
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


def photo_batch(names=SAMPLE_PHOTOS, size: int = 224):
    """``[len(names), 3, size, size]`` float32: the sample photos resized and normalized as
    torchvision's classifiers expect."""
    import torch

    images = []
    for name in names:
        rgb = torch.from_numpy(sample_photo(name)).permute(2, 0, 1).float()[None] / 255.0
        images.append(torch.nn.functional.interpolate(rgb, (size, size), mode="bilinear", antialias=True))
    batch = torch.cat(images)
    mean = torch.tensor(_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(_STD).view(1, 3, 1, 1)
    return ((batch - mean) / std).contiguous()


def _start_zero_layers(model, generator) -> None:
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and not module.weight.any():
            with torch.no_grad():
                module.weight.normal_(0.0, 0.02, generator=generator)


def calibrate_batch_norms(model, batch, passes: int = 3) -> None:
    """Give every batch norm of ``model`` the mean and variance of what it sees on ``batch``
    (``passes`` train-mode forward passes, each flipped left-right from the one before, averaged);
    ``model`` is left in eval mode."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average of the passes' statistics
    model.train()
    with torch.no_grad():
        for i in range(passes):
            model(batch.flip(-1) if i % 2 else batch)
    for norm, momentum in zip(norms, momenta):
        norm.momentum = momentum
    model.eval()


def build_classifier(name: str, seed: int = 0, calibration_passes: int = 3):
    """torchvision's classifier ``name`` (one of :data:`CLASSIFIERS`), random weights of ``seed``,
    batch norms calibrated on the sample photos (:func:`calibrate_batch_norms`), in eval mode.

    Raises
    ------
    ValueError
        Unknown name.
    """
    import torch
    import torchvision

    if name not in CLASSIFIERS:
        raise ValueError(f"unknown classifier {name!r}: use one of {', '.join(CLASSIFIERS)}")
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(weights=None)
    _start_zero_layers(model, torch.Generator().manual_seed(seed))
    calibrate_batch_norms(model, photo_batch(), calibration_passes)
    return model


def example_input(size: int = 224):
    """``[1, 3, size, size]``: the astronaut photo as :func:`photo_batch` prepares it."""
    return photo_batch(("astronaut",), size)


__all__ = [
    "CLASSIFIERS",
    "build_classifier",
    "calibrate_batch_norms",
    "example_input",
    "photo_batch",
]
