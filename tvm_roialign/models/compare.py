"""Detections of a compiled model against a reference (PyTorch eager): the one pass criterion.

Both model routes judge their detections here: the three-piece Mask R-CNN
(:mod:`tvm_roialign.models.maskrcnn`, the ``maskrcnn`` command's report) and the standalone
detector artifact (:mod:`tvm_roialign.models.detection`). A reduced-precision (bf16) build is
judged against the fp32 build by :func:`match_confident` instead (confident detections matched
by label and box IoU, not equality). A detection dict holds ``boxes [n, 4]``,
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


#: A confident detection (:func:`match_confident`): score at least this.
CONFIDENT_SCORE = 0.5
#: Least box IoU of a same-label pair that :func:`match_confident` counts as matched.
MATCH_IOU = 0.9


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a [n, 4]`` with every box of ``b [m, 4]`` (x1, y1, x2, y2): ``[n, m]``."""
    a, b = _array(a, np.float64).reshape(-1, 4), _array(b, np.float64).reshape(-1, 4)
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=-1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=-1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _confident_pairs(src: dict, dst: dict, score: float, iou: float) -> tuple[int, list]:
    """``(count, pairs)``: ``src``'s detections of score >= ``score``, each (highest score first)
    paired with the unused ``dst`` detection (any score) of its label and the highest box IoU,
    when that IoU is >= ``iou``; ``pairs`` holds ``(i, j)`` index pairs."""
    scores, labels = _array(src["scores"], np.float64), _array(src["labels"])
    other = _array(dst["labels"])
    ious = box_iou(src["boxes"], dst["boxes"])
    free = np.ones(other.shape[0], bool)
    confident = [int(i) for i in np.argsort(-scores, kind="stable") if scores[i] >= score]
    pairs = []
    for i in confident:
        candidates = np.where(free & (other == labels[i]), ious[i], -1.0)
        j = int(np.argmax(candidates)) if candidates.size else -1
        if j >= 0 and candidates[j] >= iou:
            free[j] = False
            pairs.append((i, j))
    return len(confident), pairs


def _mask_ious(src: dict, dst: dict, pairs: list) -> list[float]:
    if not pairs or src.get("masks") is None or dst.get("masks") is None:
        return []
    ms, md = _array(src["masks"]), _array(dst["masks"])
    out = []
    for i, j in pairs:
        a, b = ms[i] > MASK_THRESHOLD, md[j] > MASK_THRESHOLD
        union = np.logical_or(a, b).sum()
        out.append(float(np.logical_and(a, b).sum() / union) if union else 1.0)
    return out


def match_confident(ref: dict, ours: dict, score: float = CONFIDENT_SCORE, iou: float = MATCH_IOU) -> dict:
    """How well ``ours`` (a bf16 build's detections) keeps ``ref``'s (the fp32 build's) confident
    ones, for one image: ``ref_confident`` (detections of score >= ``score``) and ``ref_matched``
    (of those, the ones paired with a detection of ``ours`` of the same label at box IoU >= ``iou``),
    the same both ways round (``ours_confident``, ``ours_matched``), and over the pairs of ``ref``'s
    confident detections: ``mask_iou_min``/``mask_iou_mean`` (masks at :data:`MASK_THRESHOLD`;
    absent without masks) and ``score_diff_max``/``score_diff_mean`` (absolute). Sum the counts
    over images with :func:`sum_matches`."""
    n_ref, pairs = _confident_pairs(ref, ours, score, iou)
    n_ours, back = _confident_pairs(ours, ref, score, iou)
    result = {
        "score": score, "iou": iou, "ref_confident": n_ref, "ref_matched": len(pairs),
        "ours_confident": n_ours, "ours_matched": len(back),
    }
    diffs = [
        abs(float(_array(ref["scores"])[i]) - float(_array(ours["scores"])[j])) for i, j in pairs
    ]
    if diffs:
        result.update(score_diff_max=max(diffs), score_diff_mean=float(np.mean(diffs)))
    mask_ious = _mask_ious(ref, ours, pairs)
    if mask_ious:
        result.update(mask_iou_min=min(mask_ious), mask_iou_mean=float(np.mean(mask_ious)))
    return result


def sum_matches(results: list[dict]) -> dict:
    """:func:`match_confident` of several images together: counts summed, the shares
    ``ref_share``/``ours_share`` (1 where nothing was confident), the worst minimum and maximum,
    means weighted by pairs."""
    keys = ("ref_confident", "ref_matched", "ours_confident", "ours_matched")
    total = {k: sum(r[k] for r in results) for k in keys}
    if results:
        total.update(score=results[0]["score"], iou=results[0]["iou"])
    total["ref_share"] = total["ref_matched"] / total["ref_confident"] if total["ref_confident"] else 1.0
    total["ours_share"] = (
        total["ours_matched"] / total["ours_confident"] if total["ours_confident"] else 1.0
    )
    for name, worst in (("score_diff", max), ("mask_iou", min)):
        rows = [r for r in results if f"{name}_mean" in r]
        if rows:
            limit = "max" if worst is max else "min"
            total[f"{name}_{limit}"] = worst(r[f"{name}_{limit}"] for r in rows)
            weights = [r["ref_matched"] for r in rows]
            total[f"{name}_mean"] = float(np.average([r[f"{name}_mean"] for r in rows], weights=weights))
    return total


__all__ = [
    "BOX_TOL",
    "CONFIDENT_SCORE",
    "CRITERIA",
    "KEYPOINT_TOL",
    "MASK_AGREEMENT",
    "MASK_THRESHOLD",
    "MATCH_IOU",
    "SCORE_TOL",
    "box_iou",
    "compare_detections",
    "match_confident",
    "pair_detections",
    "passed",
    "sum_matches",
]
