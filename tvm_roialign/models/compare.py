"""Detections of a compiled model against a reference (PyTorch eager): the one pass criterion.

Both model routes judge their detections here: the three-piece Mask R-CNN
(:mod:`tvm_roialign.models.maskrcnn`, the ``maskrcnn`` command's report) and the standalone
detector artifact (:mod:`tvm_roialign.models.detection`). A detection dict holds ``boxes [n, 4]``,
``labels [n]``, ``scores [n]`` and optionally ``masks`` (``[n, H, W]`` or ``[n, 1, H, W]``
probabilities) and ``keypoints [n, K, 3]``, as NumPy arrays or CPU tensors. Only NumPy is needed.
"""

from __future__ import annotations

import numpy as np

#: Largest box coordinate difference of a pair, input pixels.
BOX_TOL = 1e-2
#: Largest score difference of a pair.
SCORE_TOL = 1e-4
#: Least fraction of mask pixels equal after thresholding at :data:`MASK_THRESHOLD`.
MASK_AGREEMENT = 0.999
MASK_THRESHOLD = 0.5
#: Largest keypoint (x, y) difference of a pair, input pixels.
KEYPOINT_TOL = 1e-2

#: What a comparison must show to pass (:func:`passed`).
CRITERIA = (
    f"at least one detection, same count and labels, boxes within {BOX_TOL:g} px, scores within "
    f"{SCORE_TOL:g}, >= {100 * MASK_AGREEMENT:g}% of mask pixels equal at {MASK_THRESHOLD:g}, "
    f"keypoints within {KEYPOINT_TOL:g} px"
)


def _array(value, dtype=None) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, without importing torch
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype)


def _box_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max())


def pair_detections(ours: dict, ref: dict) -> list[int]:
    """For each of ``ours``' detections, the index of its reference detection (same counts).

    In order where labels agree and boxes are within :data:`BOX_TOL` (both are sorted by score);
    otherwise (scores closer than float noise come out swapped) each detection takes the unused
    reference detection of the same label and nearest box.
    """
    ob, rb = _array(ours["boxes"], np.float64), _array(ref["boxes"], np.float64)
    ol, rl = _array(ours["labels"]), _array(ref["labels"])
    n = ob.shape[0]
    if n == 0 or (np.array_equal(ol, rl) and _box_diff(ob, rb) < BOX_TOL):
        return list(range(n))
    used: set[int] = set()
    order = []
    for i in range(n):
        cands = [j for j in range(n) if j not in used and int(rl[j]) == int(ol[i])]
        j = min(cands or [j for j in range(n) if j not in used], key=lambda j: _box_diff(ob[i], rb[j]))
        used.add(j)
        order.append(j)
    return order


def _mask_agreement(ours: dict, ref: dict, order: list[int], threshold: float) -> float:
    n = len(order)
    if n == 0 or ours.get("masks") is None or ref.get("masks") is None:
        return 1.0
    om = _array(ours["masks"]).reshape(n, -1) > threshold
    rm = _array(ref["masks"])[order].reshape(n, -1) > threshold
    return float((om == rm).mean()) if om.size else 1.0


def compare_detections(ours: dict, ref: dict, mask_threshold: float = MASK_THRESHOLD) -> dict:
    """``ours`` (TVM) against ``ref`` (PyTorch eager) for one image: paired with
    :func:`pair_detections`, returns ``num_detections_tvm``, ``num_detections_torch``,
    ``same_labels``, ``reordered_pairs``, ``max_box_diff`` (input pixels), ``max_score_diff``,
    ``mask_pixel_agreement`` (fraction of pixels of all masks equal after thresholding at
    ``mask_threshold``; 1 without masks),
    ``max_keypoint_diff`` (only where ``ref`` has keypoints) and ``passed`` (:func:`passed`)."""
    ob, rb = _array(ours["boxes"], np.float64), _array(ref["boxes"], np.float64)
    n = ob.shape[0]
    result = {"num_detections_tvm": int(n), "num_detections_torch": int(rb.shape[0])}
    if n != rb.shape[0]:
        result.update(same_labels=False, max_box_diff=float("inf"), mask_pixel_agreement=0.0)
        result["passed"] = False
        return result
    order = pair_detections(ours, ref)
    labels_equal = np.array_equal(_array(ours["labels"]), _array(ref["labels"])[order])
    scores = _array(ours["scores"], np.float64) - _array(ref["scores"], np.float64)[order]
    result.update(
        same_labels=bool(labels_equal),
        reordered_pairs=sum(1 for i, j in enumerate(order) if i != j),
        max_box_diff=_box_diff(ob, rb[order]) if n else 0.0,
        max_score_diff=float(np.abs(scores).max()) if n else 0.0,
        mask_pixel_agreement=_mask_agreement(ours, ref, order, mask_threshold),
    )
    if "keypoints" in ref:
        ok, rk = _array(ours["keypoints"], np.float64), _array(ref["keypoints"], np.float64)
        result["max_keypoint_diff"] = _box_diff(ok[..., :2], rk[order][..., :2]) if n else 0.0
    result["passed"] = passed(result)
    return result


def passed(cmp: dict) -> bool:
    """Whether a comparison (from :func:`compare_detections`) meets :data:`CRITERIA`. A comparison
    of no detections does not pass: it compared nothing."""
    return bool(
        cmp["num_detections_tvm"] == cmp["num_detections_torch"] > 0
        and cmp["same_labels"]
        and cmp["max_box_diff"] <= BOX_TOL
        and cmp.get("max_score_diff", 0.0) <= SCORE_TOL
        and cmp["mask_pixel_agreement"] >= MASK_AGREEMENT
        and cmp.get("max_keypoint_diff", 0.0) <= KEYPOINT_TOL
    )


__all__ = [
    "BOX_TOL",
    "CRITERIA",
    "KEYPOINT_TOL",
    "MASK_AGREEMENT",
    "MASK_THRESHOLD",
    "SCORE_TOL",
    "compare_detections",
    "pair_detections",
    "passed",
]
