"""Every detector name ``compile`` accepts builds and equals torchvision eager.

Artifact as ``compile NAME --exact -o m.so`` (the defaults but the exact mode, whose detections are
eager's by the exact criterion; the default fast mode: tests/test_fast_mode.py): seeded random
weights, min / max size 512, one function for every padded size, NHWC. Each name below is
compiled once (for the generic ``llvm`` target, as tests/test_detector.py does, so float32
rounding stays PyTorch's) and that one artifact runs two photo sizes (the astronaut, 512x512,
and coffee, 400x600 padded to 352x512).

Which test covers which name:

* ``maskrcnn_resnet50_fpn``: tests/test_detector.py (``full``), by default;
* ``fasterrcnn_resnet50_fpn``: tests/test_detector.py (``full``), with
  ``TVM_ROIALIGN_ALL_DETECTORS=1`` (Mask R-CNN's full build runs its backbone, RPN and box head,
  and the name below a Faster R-CNN without a mask head at the full-size settings);
* ``fasterrcnn_mobilenet_v3_large_fpn``: here, by default (its FPN returns two levels and
  ``pool``, fewer than its box pooler's four names);
* ``maskrcnn_resnet50_fpn_v2``, ``fasterrcnn_resnet50_fpn_v2``: here, with
  ``TVM_ROIALIGN_ALL_DETECTORS=1`` (a ResNet-50 compile each: minutes);
* ``keypointrcnn_resnet50_fpn``: tests/test_detector.py, with ``TVM_ROIALIGN_ALL_PHOTOS=1``.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from tvm_roialign.models import detection as det
from tvm_roialign.runtime import Detector

ALL_DETECTORS = bool(os.environ.get("TVM_ROIALIGN_ALL_DETECTORS"))
#: one xdist worker runs this module (`--dist loadgroup`), so each artifact is compiled once
pytestmark = pytest.mark.xdist_group("detector_names")

#: The two photo sizes each artifact runs, and their padded sizes.
PHOTOS = {"astronaut": (512, 512), "coffee": (352, 512)}

#: Names covered by tests/test_detector.py.
ELSEWHERE = ("maskrcnn_resnet50_fpn", "fasterrcnn_resnet50_fpn", "keypointrcnn_resnet50_fpn")
#: Names compiled here by default.
HERE = ("fasterrcnn_mobilenet_v3_large_fpn",)
#: Names compiled here with TVM_ROIALIGN_ALL_DETECTORS=1.
OPT_IN = ("maskrcnn_resnet50_fpn_v2", "fasterrcnn_resnet50_fpn_v2")


def _with_signal(model):
    """``model`` with features worth comparing. With seeded random weights the MobileNetV3
    backbone's activations fade through its BatchNorms (running variance 1) to ~1e-8: every
    proposal gets the same scores, and a comparison would order ties, not detections. Its
    BatchNorm statistics are therefore taken from the two compared photos (features of about
    unit spread on both), and its class logits scaled by 12 so that the scores spread over
    0.07-0.95, clear of the 0.05 threshold, with 100 detections on each photo."""
    norms = [m for m in model.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None  # a plain average over the batches
            norm.train()
        for name in PHOTOS:
            photo = torch.from_numpy(det.sample_photo(name)).permute(2, 0, 1).float() / 255
            images, _ = model.transform([photo])
            model.backbone(images.tensors)
        for norm in norms:
            norm.eval()
        model.roi_heads.box_predictor.cls_score.weight.mul_(12.0)
    return model


#: How each name's random model is given detections worth comparing.
PREPARE = {"fasterrcnn_mobilenet_v3_large_fpn": _with_signal}


def test_every_name_has_a_test():
    """A name added to the CLI's list needs a place in one of the lists above."""
    assert sorted(det.DETECTORS) == sorted(ELSEWHERE + HERE + OPT_IN)


@pytest.fixture(
    scope="session",
    params=[
        *HERE,
        *(
            pytest.param(n, marks=pytest.mark.skipif(
                not ALL_DETECTORS, reason="a ResNet-50 compile: TVM_ROIALIGN_ALL_DETECTORS=1"
            ))
            for n in OPT_IN
        ),
    ],
)
def default_artifact(request, tmp_path_factory):
    """(model, Detector) of the name, compiled once (exact) for any photo size."""
    name = request.param
    model = PREPARE.get(name, lambda m: m)(det.build_torch_detector(name))
    library = tmp_path_factory.mktemp(name) / f"{name}.so"
    det.compile_detector(model, None, target="llvm", fast=False).export(library)
    return model, Detector(library)


@pytest.mark.parametrize("photo_name", list(PHOTOS))
def test_default_artifact_equals_eager(default_artifact, photo_name):
    """The artifact's detections on the photo at its own size are eager torchvision's (same
    labels, boxes within 1e-2 px, scores within 1e-4: :func:`det.compare`)."""
    model, detector = default_artifact
    rgb = det.sample_photo(photo_name)
    ref = det.torch_detections(model, rgb)
    assert len(ref["boxes"]) == model.roi_heads.detections_per_img
    ours = detector(rgb)
    assert ours["padded"] == PHOTOS[photo_name]
    result = det.compare(ours, ref)
    assert result["passed"], result
