"""What ``run DETECTOR.so --image`` writes: every output of the model in its JSON and picture.

The JSON of a Keypoint R-CNN artifact carries each detection's 17 keypoints by COCO name, equal
to torchvision eager's, and its label's category name; the picture shows the keypoints. The
drawing itself is checked on synthetic inputs (no model): label tags never overlap one another,
and a mask is drawn clearly (blended strongly, outlined in its colour).

Cost: one static build of a small Keypoint R-CNN (tests/_tiny_rcnn.py, 17 keypoints) at the
coffee photo's padded size; the drawing tests take no compile.
"""

from __future__ import annotations

import json
from itertools import combinations

import numpy as np
import pytest

from tvm_roialign.runtime.draw import (
    KEYPOINT_COLOR,
    MASK_ALPHA,
    PALETTE,
    draw_detections,
    place_labels,
)
from tvm_roialign.runtime.keypoints import COCO_KEYPOINT_NAMES


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.parametrize(
    "boxes",
    [
        [(100, 100, 300, 300)] * 12,  # one box twelve times: every tag wants the same place
        [(10 * i, 5 * i, 10 * i + 60, 5 * i + 40) for i in range(15)],  # a staircase
        [(-50, -20, 40, 30), (600, 500, 700, 520), (0, 0, 640, 480), (630, 470, 640, 480)],
        [(200, 470, 260, 480)] * 6 + [(0, 0, 640, 20)] * 6,  # at the bottom and top edges
    ],
    ids=["same-box", "staircase", "edges-and-outside", "rows-at-edges"],
)
def test_label_tags_do_not_overlap(boxes):
    """Tags of 90x18 pixels for crowded, repeated and out-of-picture boxes on a 640x480 picture:
    each tag lies inside the picture and no two overlap."""
    width, height = 640, 480
    rects = place_labels(boxes, [(90, 18)] * len(boxes), width, height)
    assert len(rects) == len(boxes)
    for left, top, right, bottom in rects:
        assert right - left == 90 and bottom - top == 18
        assert 0 <= left and right <= width and 0 <= top and bottom <= height
    for a, b in combinations(rects, 2):
        assert not _overlap(a, b), (a, b)


def test_label_tag_sits_above_its_box_when_free():
    """A lone box with room above gets its tag right above its top-left corner."""
    (rect,) = place_labels([(100, 200, 300, 400)], [(80, 20)], 640, 480)
    assert rect == (100, 180, 180, 200)


def _mask_scene(seed: int):
    """A textured 240x320 photo, a box (60..240, 40..200) and a solid mask (100..220, 70..170)
    inside it (the mask's border away from the box's lines)."""
    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)
    mask = np.zeros((1, 240, 320), np.float32)
    mask[0, 70:170, 100:220] = 1.0
    detections = {
        "boxes": np.array([[60.0, 40.0, 240.0, 200.0]], np.float32),
        "labels": np.array([1]),
        "scores": np.array([0.9], np.float32),
    }
    return rgb, mask, detections


#: Inside the mask, away from its border: (rows, columns).
_INSIDE = (slice(80, 160), slice(110, 210))


def test_mask_is_drawn_clearly():
    """A solid synthetic mask on a textured photo: inside it every pixel moves from the photo
    ``MASK_ALPHA`` (at least half) of the way to the mask's colour; its border (2 pixels here)
    is the colour itself; outside the mask and the box the photo is untouched."""
    rgb, mask, detections = _mask_scene(0)
    picture = np.asarray(draw_detections(rgb, {**detections, "masks": mask}, top=1))[:240]
    color = np.array(PALETTE[0], np.float64)
    moved = picture[_INSIDE].astype(np.float64) - rgb[_INSIDE]
    np.testing.assert_allclose(moved, MASK_ALPHA * (color - rgb[_INSIDE]), atol=1.0)
    assert MASK_ALPHA >= 0.5
    for row, column in ((120, 100), (120, 101), (120, 219), (70, 150), (169, 150)):
        assert (picture[row, column] == color).all(), (row, column, picture[row, column])
    assert not (picture[120, 102] == color).all()  # the border is two pixels thick here
    assert (picture[205:] == rgb[205:]).all()  # below the box: the photo untouched


def test_torchvision_drawer_draws_masks_as_clearly(tmp_path):
    """``maskrcnn``'s picture (torchvision.utils) blends and outlines masks as the runner does."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from PIL import Image

    from tvm_roialign.models.maskrcnn import draw_detections as torch_draw

    rgb, mask, detections = _mask_scene(1)
    ours = np.asarray(draw_detections(rgb, {**detections, "masks": mask}, top=1))[:240]
    tensors = {k: torch.from_numpy(v) for k, v in detections.items()}
    tensors["masks"] = torch.from_numpy(mask)[:, None]
    image = torch.from_numpy(rgb).permute(2, 0, 1).float() / 255
    torch_draw(image, tensors, tmp_path / "p.png", top=1)
    with Image.open(tmp_path / "p.png") as picture:
        theirs = np.asarray(picture.convert("RGB"))[:240]
    assert np.abs(theirs[_INSIDE].astype(int) - ours[_INSIDE]).max() <= 1
    for row, column in ((120, 100), (120, 101), (70, 150)):
        assert (theirs[row, column] == PALETTE[0]).all(), (row, column, theirs[row, column])


# --------------------------------------------------------------------------------------------------
# a Keypoint R-CNN artifact through ``run``


@pytest.fixture(scope="session")
def keypoint_run(tiny_keypoint_detector, tmp_path_factory):
    """A small Keypoint R-CNN with COCO's 17 keypoints and two classes, compiled for any photo
    size and run by ``run --image`` on the coffee photo: (model, photo, JSON, picture)."""
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from PIL import Image

    from tvm_roialign import cli
    from tvm_roialign.models import detection as det

    root = tmp_path_factory.mktemp("keypoints")
    library, model = tiny_keypoint_detector
    rgb = det.sample_photo("coffee")
    Image.fromarray(rgb).save(root / "coffee.png")
    argv = ["--quiet", "run", str(library), "--image", str(root / "coffee.png"), "--out",
            str(root / "out.png"), "--draw-top", "3"]
    assert cli.main(argv) == 0
    report = json.loads((root / "out.json").read_text())
    with Image.open(root / "out.png") as picture:
        drawn = np.asarray(picture.convert("RGB"))
    return model, rgb, report, drawn


def test_keypoints_in_json_equal_eager(keypoint_run):
    """Each detection's JSON entry has its 17 keypoints named as COCO names them, at eager
    torchvision's positions (within 1e-2 px), with eager's scores; its category is "person"."""
    from tvm_roialign.models import detection as det

    model, rgb, report, _ = keypoint_run
    ref = det.torch_detections(model, rgb)
    entries = report["detections"]
    assert len(entries) == len(ref["boxes"]) == 12
    for entry, box, keypoints, scores in zip(
        entries, ref["boxes"], ref["keypoints"], ref["keypoints_scores"]
    ):
        assert entry["label"] == 1 and entry["name"] == "person"
        np.testing.assert_allclose(entry["box"], box, atol=1e-2)
        assert [k["name"] for k in entry["keypoints"]] == list(COCO_KEYPOINT_NAMES)
        ours = np.array([[k["x"], k["y"]] for k in entry["keypoints"]])
        np.testing.assert_allclose(ours, keypoints[:, :2], atol=1e-2, rtol=0)
        np.testing.assert_allclose([k["score"] for k in entry["keypoints"]], scores, atol=1e-3)


def test_keypoints_in_picture(keypoint_run):
    """The picture has the keypoint colour at the keypoints of the drawn detections (a dot on
    each; a label tag may hide a few) and many more pixels of it than the photo."""
    _, rgb, report, drawn = keypoint_run
    points = [
        (int(k["y"]), int(k["x"]))
        for entry in report["detections"][:3]
        for k in entry["keypoints"]
    ]
    height, width = rgb.shape[:2]
    points = [(y, x) for y, x in points if 0 <= y < height and 0 <= x < width]
    colored = [(drawn[y, x] == KEYPOINT_COLOR).all() for y, x in points]
    assert sum(colored) >= 0.8 * len(points), (sum(colored), len(points))
    photo_has = int((rgb == KEYPOINT_COLOR).all(-1).sum())
    assert int((drawn[:height] == KEYPOINT_COLOR).all(-1).sum()) > photo_has + 3 * len(points)
