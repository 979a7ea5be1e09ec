"""A bf16 build's detections against fp32's (the fp32 build or PyTorch eager, which the fp32
build equals by :data:`~.compare.CRITERIA`): the bf16 criterion, beside the exact and fast
modes' of :mod:`tvm_roialign.models.compare`.

bf16 rounds every convolution's and matmul's inputs to 8 significant bits, so boxes and scores
move by more than float noise and detections whose scores or overlaps are near a tie (NMS, the
score threshold, the detection cap) may come out differently. The criterion is therefore on
confident detections (:data:`BF16_SCORE`) matched by label and box IoU (:func:`~.compare.match_confident`),
both ways, with bounds on the matched pairs' masks and scores (:data:`BF16_CRITERIA`).
"""

from __future__ import annotations

import numpy as np

from .compare import MASK_THRESHOLD, match_confident

#: A confident detection: score at least this.
BF16_SCORE = 0.5
#: Least box IoU of a same-label pair counted as matched.
BF16_BOX_IOU = 0.9
#: Least share of each side's confident detections matched on the other side.
BF16_MATCHED = 0.99
#: Least mean IoU (masks at :data:`~.compare.MASK_THRESHOLD`) of the matched pairs.
BF16_MASK_IOU = 0.8
#: Largest score difference of a matched pair.
BF16_SCORE_TOL = 0.05

#: What a bf16 build's comparison must show to pass (:func:`bf16_passed`).
BF16_CRITERIA = (
    f"at least one detection scored >= {BF16_SCORE:g}; >= {100 * BF16_MATCHED:g}% of those of "
    f"each side matched on the other by one of the same label with box IoU >= {BF16_BOX_IOU:g}; "
    f"matched pairs: mean mask IoU (at {MASK_THRESHOLD:g}) >= {BF16_MASK_IOU:g}, scores within "
    f"{BF16_SCORE_TOL:g}"
)


#: An int8 build's least share of each side's confident detections matched on the other side
#: (issue 44's bound; bf16's own is :data:`BF16_MATCHED`); its other bounds are bf16's.
INT8_MATCHED = 0.95

#: What an int8 build's comparison must show to pass (:func:`reduced_passed` with ``"int8"``).
INT8_CRITERIA = BF16_CRITERIA.replace(f">= {100 * BF16_MATCHED:g}%", f">= {100 * INT8_MATCHED:g}%")

#: precision -> (least matched share, criteria in words)
REDUCED_CRITERIA = {"bf16": (BF16_MATCHED, BF16_CRITERIA), "int8": (INT8_MATCHED, INT8_CRITERIA)}


def _shares(matches: dict) -> tuple[float, float]:
    """The matched shares of both sides (1 where a side has nothing confident)."""
    ref = matches["ref_matched"] / matches["ref_confident"] if matches["ref_confident"] else 1.0
    ours = matches["ours_matched"] / matches["ours_confident"] if matches["ours_confident"] else 1.0
    return ref, ours


def bf16_passed(matches: dict) -> bool:
    """Whether :func:`~.compare.match_confident` of one image, or
    :func:`~.compare.sum_matches` of several, at :data:`BF16_SCORE` and :data:`BF16_BOX_IOU`,
    meets :data:`BF16_CRITERIA`."""
    return reduced_passed(matches, "bf16")


def reduced_passed(matches: dict, precision: str) -> bool:
    """:func:`bf16_passed` with the matched share of ``precision`` (:data:`REDUCED_CRITERIA`)."""
    ref_share, ours_share = _shares(matches)
    return bool(
        matches["ref_confident"] > 0
        and min(ref_share, ours_share) >= REDUCED_CRITERIA[precision][0]
        and matches.get("mask_iou_mean", 1.0) >= BF16_MASK_IOU
        and matches.get("score_diff_max", 0.0) <= BF16_SCORE_TOL
    )


def compare_bf16(ours: dict, ref: dict, precision: str = "bf16") -> dict:
    """``ours`` (a bf16 build) against ``ref`` (fp32) for one image, by :data:`BF16_CRITERIA`:
    ``num_detections_tvm``/``num_detections_torch``, ``score_threshold``, ``box_iou`` (the
    bounds), ``confident_torch``/``matched_torch`` (``ref``'s confident detections, and those
    matched in ``ours``), ``confident_tvm``/``matched_tvm`` (the other way),
    ``min_mask_iou``/``mean_mask_iou`` and ``max_score_diff`` of the pairs, ``passed``,
    ``mode`` (``"bf16"``) and ``criteria``. ``precision="int8"``: an int8 build, by
    :data:`INT8_CRITERIA` (``mode`` ``"int8"``)."""
    m = match_confident(ref, ours, score=BF16_SCORE, iou=BF16_BOX_IOU)
    return {
        "num_detections_tvm": len(np.asarray(ours["scores"])),
        "num_detections_torch": len(np.asarray(ref["scores"])),
        "score_threshold": BF16_SCORE,
        "box_iou": BF16_BOX_IOU,
        "confident_torch": m["ref_confident"],
        "matched_torch": m["ref_matched"],
        "confident_tvm": m["ours_confident"],
        "matched_tvm": m["ours_matched"],
        "min_mask_iou": m.get("mask_iou_min"),
        "mean_mask_iou": m.get("mask_iou_mean"),
        "max_score_diff": m.get("score_diff_max"),
        "passed": reduced_passed(m, precision),
        "mode": precision,
        "criteria": REDUCED_CRITERIA[precision][1],
    }


__all__ = [
    "BF16_BOX_IOU",
    "BF16_CRITERIA",
    "BF16_MASK_IOU",
    "BF16_MATCHED",
    "BF16_SCORE",
    "BF16_SCORE_TOL",
    "INT8_CRITERIA",
    "INT8_MATCHED",
    "REDUCED_CRITERIA",
    "bf16_passed",
    "compare_bf16",
    "reduced_passed",
]
