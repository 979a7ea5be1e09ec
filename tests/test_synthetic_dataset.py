"""The synthetic detection dataset (tvm_roialign.datasets.synthetic) is exact by construction,
and its COCO ground truth reads back through pycocotools: each mask's pixel extent is its box,
keypoints fall on mask pixels, objects do not overlap, images are drawn the same whatever the
order, and pycocotools scores the ground truth itself as perfect (AP 1) and a shifted box lower."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_roialign.datasets import synthetic
from tvm_roialign.datasets.evaluation import coco_scores, confident_matches, score_separation

CONFIG = synthetic.SyntheticConfig()


@pytest.mark.parametrize("split", ["train", "val"])
def test_boxes_masks_and_keypoints_agree(split):
    seen = set()
    for index in range(12):
        image, target = synthetic.sample(CONFIG, split, index)
        assert image.shape == (CONFIG.size, CONFIG.size, 3) and image.dtype == np.uint8
        n = len(target["labels"])
        assert 1 <= n <= CONFIG.max_objects
        assert target["masks"].shape == (n, CONFIG.size, CONFIG.size)
        assert target["keypoints"].shape == (n, synthetic.NUM_KEYPOINTS, 3)
        assert target["masks"].sum(axis=0).max() == 1, "objects overlap"
        for box, label, mask, points in zip(*(target[k] for k in ("boxes", "labels", "masks", "keypoints"))):
            ys, xs = np.nonzero(mask)
            assert box.tolist() == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
            assert CONFIG.min_side - 2 <= max(box[2] - box[0], box[3] - box[1]) <= CONFIG.max_side + 2
            for x, y, v in points:
                assert v == 2 and mask[int(y), int(x)] == 1, (index, label, x, y)
            seen.add(int(label))
    assert seen == set(range(1, len(synthetic.CLASSES)))


def test_images_are_seeded_per_index_and_split():
    a = synthetic.sample(CONFIG, "val", 7)
    synthetic.sample(CONFIG, "val", 3)
    b = synthetic.sample(CONFIG, "val", 7)
    assert np.array_equal(a[0], b[0]) and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])
    assert not np.array_equal(a[0], synthetic.sample(CONFIG, "train", 7)[0])
    with pytest.raises(ValueError, match="split must be one of train, val"):
        synthetic.sample(CONFIG, "test", 0)


def _truth_as_detections(count: int, shift: float = 0.0) -> list[dict]:
    out = []
    for index in range(count):
        _, t = synthetic.sample(CONFIG, "val", index)
        boxes = t["boxes"] + np.float32(shift)
        out.append({
            "boxes": boxes, "labels": t["labels"], "scores": np.ones(len(boxes), np.float32),
            "masks": t["masks"].astype(np.float32), "keypoints": t["keypoints"],
        })
    return out


def test_pycocotools_scores_the_ground_truth_as_perfect():
    truth = _truth_as_detections(6)
    scores = coco_scores(truth, CONFIG, "val", keypoints=True)
    assert scores["box_map"] == pytest.approx(1.0)
    assert scores["mask_map"] == pytest.approx(1.0)
    assert scores["keypoint_ap"] == pytest.approx(1.0)
    shifted = coco_scores(_truth_as_detections(6, shift=4.0), CONFIG, "val")
    assert shifted["box_map"] < 0.9 and shifted["box_ap50"] == pytest.approx(1.0)
    # a Keypoint R-CNN gives no masks: no mask mAP (pycocotools would score its boxes' polygons)
    unmasked = [{k: v for k, v in d.items() if k != "masks"} for d in truth]
    scores = coco_scores(unmasked, CONFIG, "val", keypoints=True)
    assert "mask_map" not in scores and scores["keypoint_ap"] == pytest.approx(1.0)


def test_confident_matches_and_score_separation():
    truth = _truth_as_detections(4)
    assert confident_matches(truth, truth)["ref_share"] == 1.0
    shifted = _truth_as_detections(4, shift=6.0)
    assert confident_matches(truth, shifted)["ref_share"] < 1.0
    sep = score_separation([{"scores": np.array([0.95, 0.9, 0.45, 0.1])}])
    assert (sep["confident"], sep["others"], sep["near"]) == (2, 2, 1)


def test_bounds_judge_the_drop_and_the_share():
    from tvm_roialign.datasets.evaluation import PRECISION_BOUNDS, judge

    ref = {"box_map": 0.60, "mask_map": 0.55}
    kept = {"ref_share": 0.96}
    assert judge("int8", {"box_map": 0.595, "mask_map": 0.545, "matched": kept}, ref)["holds"]
    assert not judge("bf16", {"box_map": 0.594, "mask_map": 0.55, "matched": kept}, ref)["holds"]
    low_share = {"box_map": 0.60, "mask_map": 0.55, "matched": {"ref_share": 0.94}}
    assert not judge("ort-int8", low_share, ref)["holds"]
    fast = judge("fast", {"box_map": 0.598, "mask_map": 0.56, "matched": {"ref_share": 0.99}}, ref)
    assert fast["holds"]
    assert fast["box_drop"] == pytest.approx(0.2) and fast["mask_drop"] == pytest.approx(-1.0)
    assert PRECISION_BOUNDS["fast"] == {"points": 0.3, "share": 0.99}


def test_classification_samples_are_one_object_images_of_every_class():
    """The reference classifier's data: each image holds exactly one object, whose class (counted
    from 0, the background left out) is the label; every class occurs."""
    data = synthetic.CLASSIFIER_DATA
    labels = set()
    for index in range(16):
        image, label = synthetic.classification_sample(data, "train", index)
        _, target = synthetic.sample(data, "train", index)
        assert image.shape == (data.size, data.size, 3) and len(target["labels"]) == 1
        assert label == int(target["labels"][0]) - 1
        labels.add(label)
    assert labels == set(range(len(synthetic.CLASSES) - 1))
    images, classes = synthetic.classification_batch(data, "train", [3, 0])
    assert images.shape == (2, 3, data.size, data.size) and images.dtype == np.float32
    for image, label, index in zip(images, classes, [3, 0]):
        rgb, expected = synthetic.classification_sample(data, "train", index)
        assert label == expected and np.array_equal(image * 255.0, rgb.transpose(2, 0, 1))
