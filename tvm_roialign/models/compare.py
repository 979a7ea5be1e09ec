"""Detections of a compiled model against a reference (PyTorch eager): the pass criteria of the
two build modes.

Both model routes judge their detections here: the three-piece Mask R-CNN
(:mod:`tvm_roialign.models.maskrcnn`, the ``maskrcnn`` command's report) and the standalone
detector artifact (:mod:`tvm_roialign.models.detection`). A reduced-precision (bf16) build is
judged against the fp32 build by :func:`match_confident` instead (confident detections matched
by label and box IoU, not equality). A detection dict holds ``boxes [n, 4]``,
``labels [n]``, ``scores [n]`` and optionally ``masks`` (``[n, H, W]`` or ``[n, 1, H, W]``
probabilities) and ``keypoints [n, K, 3]``, as NumPy arrays or CPU tensors. Only NumPy is needed.

An exact build (direct convolutions) is judged by :func:`compare_detections` (:data:`CRITERIA`:
every detection equal to eager's); a fast build (Winograd convolutions, the default mode) by
:func:`compare_fast` (:data:`FAST_CRITERIA`: the detections scored at least
:data:`FAST_SCORE_THRESHOLD` found on both sides with nearly the same box);
:func:`compare_for_mode` picks the one of a mode. A bf16 build is judged against fp32 by
:func:`tvm_roialign.models.compare_bf16.compare_bf16` (:data:`~.compare_bf16.BF16_CRITERIA`).
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


# --------------------------------------------------------------------------------------------------
# the fast mode's criterion

#: Detections scored at least this (on either side) must be found on the other side: twice
#: torchvision's ``box_score_thresh`` (0.05), so that none is checked whose presence rounding
#: decides at that threshold.
FAST_SCORE_THRESHOLD = 0.1
#: Least box IoU of a detection and the one it is matched with (same label).
FAST_BOX_IOU = 0.99
#: Largest score difference of a matched pair; also how close to the lowest score of a full
#: list (``detections_per_img`` reached) a score must be to tie with the first one left out.
FAST_SCORE_TOL = 1e-3
#: Least IoU of a matched pair's masks (thresholded at :data:`MASK_THRESHOLD`). The paste rounds
#: a box's edges to whole pixels (as torchvision's ``paste_masks_in_image``), so a box that moves
#: by a thousandth of a pixel across a pixel edge moves its mask by a pixel: a fifth of a box
#: 5 px wide. Over all matched masks, :data:`MASK_AGREEMENT` of the pixels must be equal.
FAST_MASK_IOU = 0.5
#: Largest keypoint (x, y) difference of a matched pair, input pixels.
FAST_KEYPOINT_TOL = 1.0
#: How close (IoU) to the box NMS threshold a detection's overlap with a better detection of its
#: label must be for NMS's decision on it to be a near tie.
FAST_NMS_MARGIN = 1e-3

#: What a fast build's comparison must show to pass (:func:`compare_fast`).
FAST_CRITERIA = (
    f"every detection scored >= {FAST_SCORE_THRESHOLD:g} on either side matched on the other by "
    f"one of the same label with box IoU >= {FAST_BOX_IOU:g} (at least one such detection), "
    f"except near ties (box IoU with a better detection of its label within {FAST_NMS_MARGIN:g} "
    f"of the NMS threshold; when both lists are full, as many of the lowest as the other side "
    f"has such near ties, and those scored below the other's lowest + {FAST_SCORE_TOL:g}); "
    f"matched scores within {FAST_SCORE_TOL:g}, masks at {MASK_THRESHOLD:g}: IoU >= "
    f"{FAST_MASK_IOU:g} each and >= {100 * MASK_AGREEMENT:g}% of their pixels equal, keypoints "
    f"within {FAST_KEYPOINT_TOL:g} px"
)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[n, m]`` IoU of the boxes ``a [n, 4]`` and ``b [m, 4]`` (x1, y1, x2, y2); 0 where both
    are empty."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    area = lambda v: np.clip(v[:, 2] - v[:, 0], 0, None) * np.clip(v[:, 3] - v[:, 1], 0, None)
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=2)
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def match_detections(a: dict, b: dict, threshold: float, min_iou: float) -> dict[int, int]:
    """``{i: j}``: each of ``a``'s detections scored at least ``threshold`` (best first) and the
    detection of ``b`` (any score) of the same label with the highest box IoU, at least
    ``min_iou``, among those not yet taken; a detection without such a partner is left out."""
    ab, bb = _array(a["boxes"], np.float64).reshape(-1, 4), _array(b["boxes"], np.float64).reshape(-1, 4)
    al, bl = _array(a["labels"]), _array(b["labels"])
    scores = _array(a["scores"], np.float64)
    iou = box_iou(ab, bb)
    iou[al[:, None] != bl[None, :]] = -1.0
    pairs: dict[int, int] = {}
    for i in np.argsort(-scores, kind="stable"):
        if scores[i] < threshold:
            break
        j = int(np.argmax(iou[i])) if iou.shape[1] else -1
        if j >= 0 and iou[i, j] >= min_iou:
            pairs[int(i)] = j
            iou[:, j] = -1.0
    return pairs


def _mask_overlap(ours: dict, ref: dict, pairs: dict[int, int], threshold: float) -> tuple:
    """``(least IoU, fraction of pixels equal)`` of the thresholded masks of the pairs ``{ref
    index: ours index}``, the fraction over all of them; ``(1, 1)`` without masks (two empty
    masks agree)."""
    if not pairs or ours.get("masks") is None or ref.get("masks") is None:
        return 1.0, 1.0
    ref_masks, our_masks = _array(ref["masks"]), _array(ours["masks"])
    least, equal, total = 1.0, 0, 0
    for i, j in pairs.items():
        r, o = ref_masks[i].reshape(-1) > threshold, our_masks[j].reshape(-1) > threshold
        union = np.count_nonzero(r | o)
        least = min(least, np.count_nonzero(r & o) / union if union else 1.0)
        equal += np.count_nonzero(r == o)
        total += r.size
    return float(least), (float(equal / total) if total else 1.0)


def nms_near_ties(dets: dict, nms_threshold: float) -> set[int]:
    """The detections whose box IoU with a better-scored detection of the same label is within
    :data:`FAST_NMS_MARGIN` of ``nms_threshold``: whether NMS keeps them is a near tie."""
    boxes = _array(dets["boxes"], np.float64).reshape(-1, 4)
    labels, scores = _array(dets["labels"]), _array(dets["scores"], np.float64)
    iou = box_iou(boxes, boxes)
    near = (
        (np.abs(iou - nms_threshold) <= FAST_NMS_MARGIN)
        & (labels[:, None] == labels[None, :])
        & (scores[None, :] > scores[:, None])
    )
    return {int(i) for i in np.nonzero(near.any(axis=1))[0]}


def _excused(dets: dict, own_ties: set, other: dict, other_ties: int, cap: int | None) -> set[int]:
    """The detections of one side that need not be found on the ``other``: its NMS near ties
    and, when both lists are full (``cap`` detections), its ``other_ties`` lowest-scored (each
    near tie kept on the other side pushes one out of this list) and those scored below the
    other's lowest + :data:`FAST_SCORE_TOL` (cut from the other's list, or tied with its last)."""
    scores = _array(dets["scores"], np.float64)
    other_scores = _array(other["scores"], np.float64)
    excused = set(own_ties)
    if cap is not None and min(len(scores), len(other_scores)) >= cap > 0:
        excused |= {int(i) for i in np.argsort(scores, kind="stable")[:other_ties]}
        excused |= {int(i) for i in np.nonzero(scores <= other_scores.min() + FAST_SCORE_TOL)[0]}
    return excused


def _unmatched(dets: dict, pairs: dict, excused: set, threshold: float) -> int:
    scores = _array(dets["scores"], np.float64)
    return sum(1 for i in np.nonzero(scores >= threshold)[0] if i not in pairs and i not in excused)


def compare_fast(
    ours: dict,
    ref: dict,
    mask_threshold: float = MASK_THRESHOLD,
    nms_threshold: float = 0.5,
    max_detections: int | None = 100,
) -> dict:
    """``ours`` (a fast build) against ``ref`` (PyTorch eager) for one image, by
    :data:`FAST_CRITERIA`: returns ``num_detections_tvm``, ``num_detections_torch``,
    ``score_threshold``, ``checked_torch`` / ``checked_tvm`` (detections scored at least it),
    ``near_ties_torch`` / ``near_ties_tvm`` (of those, the excused near ties: NMS's, at the box
    IoU ``nms_threshold``, and the list's cut at ``max_detections``; torchvision's defaults),
    ``unmatched_torch`` / ``unmatched_tvm`` (of the others, found on the other side by no
    detection of the same label with box IoU >= :data:`FAST_BOX_IOU`), ``min_box_iou``,
    ``max_score_diff``,
    ``min_mask_iou`` and ``mask_pixel_agreement`` of the matched pairs (eager's checked
    detections and theirs), ``max_keypoint_diff`` (only where ``ref`` has keypoints) and
    ``passed``."""
    threshold = FAST_SCORE_THRESHOLD
    to_ours = match_detections(ref, ours, threshold, FAST_BOX_IOU)
    to_ref = match_detections(ours, ref, threshold, FAST_BOX_IOU)
    checked_torch = int(np.count_nonzero(_array(ref["scores"]) >= threshold))
    checked_tvm = int(np.count_nonzero(_array(ours["scores"]) >= threshold))
    ties_ref, ties_ours = nms_near_ties(ref, nms_threshold), nms_near_ties(ours, nms_threshold)
    excused_ref = _excused(ref, ties_ref, ours, len(ties_ours), max_detections)
    excused_ours = _excused(ours, ties_ours, ref, len(ties_ref), max_detections)
    rows, cols = list(to_ours), list(to_ours.values())
    iou = box_iou(_array(ref["boxes"]).reshape(-1, 4)[rows], _array(ours["boxes"]).reshape(-1, 4)[cols])
    scores = _array(ref["scores"], np.float64)[rows] - _array(ours["scores"], np.float64)[cols]
    result = {
        "num_detections_tvm": len(_array(ours["scores"])),
        "num_detections_torch": len(_array(ref["scores"])),
        "score_threshold": threshold,
        "checked_torch": checked_torch,
        "checked_tvm": checked_tvm,
        "near_ties_torch": checked_torch - _unmatched(ref, {}, excused_ref, threshold),
        "near_ties_tvm": checked_tvm - _unmatched(ours, {}, excused_ours, threshold),
        "unmatched_torch": _unmatched(ref, to_ours, excused_ref, threshold),
        "unmatched_tvm": _unmatched(ours, to_ref, excused_ours, threshold),
        "min_box_iou": float(np.diag(iou).min()) if rows else 1.0,
        "max_score_diff": float(np.abs(scores).max()) if rows else 0.0,
    }
    result["min_mask_iou"], result["mask_pixel_agreement"] = _mask_overlap(
        ours, ref, to_ours, mask_threshold
    )
    if "keypoints" in ref:
        rk = _array(ref["keypoints"], np.float64)[rows][..., :2]
        ok = _array(ours["keypoints"], np.float64)[cols][..., :2]
        result["max_keypoint_diff"] = _box_diff(ok, rk) if rows else 0.0
    result["passed"] = bool(
        checked_torch > 0
        and result["unmatched_torch"] == 0
        and result["unmatched_tvm"] == 0
        and result["max_score_diff"] <= FAST_SCORE_TOL
        and result["min_mask_iou"] >= FAST_MASK_IOU
        and result["mask_pixel_agreement"] >= MASK_AGREEMENT
        and result.get("max_keypoint_diff", 0.0) <= FAST_KEYPOINT_TOL
    )
    return result


def model_limits(model) -> dict:
    """The ``limits`` of :func:`compare_fast` / :func:`compare_for_mode` that a torchvision
    detector's heads set: their NMS IoU threshold and their detection cap."""
    heads = model.roi_heads
    return {"nms_threshold": heads.nms_thresh, "max_detections": heads.detections_per_img}


def compare_for_mode(ours: dict, ref: dict, mode: str = "exact", **limits) -> dict:
    """:func:`compare_detections` of an ``"exact"`` build, :func:`compare_fast` of a ``"fast"``
    one (given ``limits``: ``nms_threshold``, ``max_detections``), with ``mode`` and
    ``criteria`` (what ``passed`` required) added."""
    if mode not in ("exact", "fast"):
        raise ValueError(f"mode must be 'exact' or 'fast', got {mode!r}")
    fast = mode == "fast"
    result = compare_fast(ours, ref, **limits) if fast else compare_detections(ours, ref)
    return {**result, "mode": mode, "criteria": FAST_CRITERIA if fast else CRITERIA}


#: A confident detection (:func:`match_confident`): score at least this.
CONFIDENT_SCORE = 0.5
#: Least box IoU of a same-label pair that :func:`match_confident` counts as matched.
MATCH_IOU = 0.9


def _confident_pairs(src: dict, dst: dict, score: float, iou: float) -> tuple[int, list]:
    """``(count, pairs)``: how many of ``src``'s detections score at least ``score``, and their
    :func:`match_detections` pairs ``(i, j)`` in ``dst``."""
    count = int((_array(src["scores"], np.float64) >= score).sum())
    return count, sorted(match_detections(src, dst, score, iou).items())


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
    "FAST_BOX_IOU",
    "FAST_CRITERIA",
    "FAST_KEYPOINT_TOL",
    "FAST_MASK_IOU",
    "FAST_NMS_MARGIN",
    "FAST_SCORE_THRESHOLD",
    "FAST_SCORE_TOL",
    "KEYPOINT_TOL",
    "MASK_AGREEMENT",
    "MASK_THRESHOLD",
    "MATCH_IOU",
    "SCORE_TOL",
    "box_iou",
    "compare_detections",
    "compare_fast",
    "compare_for_mode",
    "match_confident",
    "match_detections",
    "model_limits",
    "nms_near_ties",
    "pair_detections",
    "passed",
    "sum_matches",
]
