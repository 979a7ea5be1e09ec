"""A detector's output against torchvision eager's, in plain NumPy (independent of the package's
own comparison, :mod:`tvm_roialign.models.compare`): the same number of detections, each paired
with one of the same label and the nearest box, boxes, scores, keypoints and thresholded masks
within tolerance."""

from __future__ import annotations

import numpy as np

#: pixels (boxes, keypoints), score units, fraction of mask pixels equal at 0.5
BOX_ATOL, SCORE_ATOL, MASK_AGREEMENT = 1e-2, 1e-4, 0.999


def _numpy(detections: dict) -> dict:
    return {key: np.asarray(value.numpy() if hasattr(value, "numpy") else value)
            for key, value in detections.items()}


def _pairing(ours: dict, ref: dict) -> np.ndarray:
    """For each of eager's detections (in its order), the index of ours of the same label with the
    nearest box (each used once; its own index where none is left)."""
    free = list(range(len(ours["boxes"])))
    order = []
    for i, (box, label) in enumerate(zip(ref["boxes"], ref["labels"])):
        same = [j for j in free if ours["labels"][j] == label] or [i if i in free else free[0]]
        j = min(same, key=lambda j: np.abs(ours["boxes"][j] - box).max())
        free.remove(j)
        order.append(j)
    return np.array(order, dtype=int)


def assert_matches_eager(ours: dict, ref: dict, min_count: int = 1) -> None:
    """``ours`` (TVM) equals ``ref`` (torchvision eager) for one image."""
    ours, ref = _numpy(ours), _numpy(ref)
    count = len(ref["boxes"])
    assert len(ours["boxes"]) == count >= min_count, (len(ours["boxes"]), count)
    order = _pairing(ours, ref)
    np.testing.assert_array_equal(ours["labels"][order], ref["labels"])
    np.testing.assert_allclose(ours["boxes"][order], ref["boxes"], rtol=0, atol=BOX_ATOL)
    np.testing.assert_allclose(ours["scores"][order], ref["scores"], rtol=0, atol=SCORE_ATOL)
    if "keypoints" in ref:
        np.testing.assert_allclose(ours["keypoints"][order][..., :2], ref["keypoints"][..., :2],
                                   rtol=0, atol=BOX_ATOL)
    if "masks" in ref:
        mine = ours["masks"][order].reshape(count, -1) > 0.5
        theirs = ref["masks"].reshape(count, -1) > 0.5
        assert mine.shape == theirs.shape, (mine.shape, theirs.shape)
        assert (mine == theirs).mean() >= MASK_AGREEMENT, (mine == theirs).mean()
