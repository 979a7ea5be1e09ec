"""COCO-style accuracy of detections on the synthetic dataset, by pycocotools (not our own AP
code), and how well a reduced-precision build keeps fp32's confident detections.

A detection dict is as :func:`tvm_roialign.models.detector_reference.torch_detections` returns:
``boxes [n, 4]`` (x0, y0, x1, y1), ``labels``, ``scores``, optionally ``masks [n, H, W]``
(probabilities at image size, thresholded at 0.5 as torchvision's) and ``keypoints [n, K, 3]``.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np

from ..models.compare import CONFIDENT_SCORE, match_confident, sum_matches
from .synthetic import SyntheticConfig, coco_ground_truth

#: ``iouType`` of pycocotools -> the keys of :func:`coco_scores`' result (AP at IoU 0.50:0.95, at 0.5)
IOU_TYPES = {
    "bbox": ("box_map", "box_ap50"),
    "segm": ("mask_map", "mask_ap50"),
    "keypoints": ("keypoint_ap", "keypoint_ap50"),
}


def torch_predict(model, rgb) -> dict:
    """torchvision eager's detections on ``rgb`` ``[H, W, 3]`` uint8, as NumPy arrays."""
    from ..models.detector_reference import torch_detections

    return torch_detections(model, rgb)


def coco_results(detections: list[dict]) -> list[dict]:
    """pycocotools' result records of the detections of images 1..len(detections)."""
    from pycocotools import mask as mask_utils

    records = []
    for image_id, det in enumerate(detections, 1):
        boxes = np.asarray(det["boxes"], np.float64).reshape(-1, 4)
        masks = det.get("masks")
        points = det.get("keypoints")
        for i, (x0, y0, x1, y1) in enumerate(boxes):
            rec = {
                "image_id": image_id,
                "category_id": int(det["labels"][i]),
                "score": float(det["scores"][i]),
                "bbox": [x0, y0, x1 - x0, y1 - y0],
            }
            if masks is not None:
                mask = np.asarray(masks[i]).reshape(masks.shape[-2:])
                binary = np.asfortranarray((mask > 0.5).astype(np.uint8))
                rle = mask_utils.encode(binary)
                rle["counts"] = rle["counts"].decode("ascii")
                rec["segmentation"] = rle
            if points is not None:
                kp = np.asarray(points[i], np.float64).copy()
                kp[:, 2] = 1
                rec["keypoints"] = [float(v) for v in kp.ravel()]
            records.append(rec)
    return records


def coco_scores(detections: list[dict], data: SyntheticConfig, split: str, keypoints: bool = False) -> dict:
    """COCO mAP (AP at IoU 0.50:0.95, pycocotools' ``stats[0]``) of the detections of the first
    ``len(detections)`` images of ``split``: ``box_map``, ``mask_map`` (where there are masks),
    ``keypoint_ap`` (``keypoints=True``; OKS with sigma 0.05 for every keypoint), each also at IoU
    0.5 (``box_ap50``...)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = coco_ground_truth(data, split, len(detections))
        gt.createIndex()
        records = coco_results(detections)
        out: dict = {}
        if not records:
            return {"box_map": 0.0}
        # before loadRes, which gives every record without one a segmentation (its box's polygon)
        kinds = ["bbox"] + (["segm"] if "segmentation" in records[0] else [])
        kinds += ["keypoints"] if keypoints and "keypoints" in records[0] else []
        dt = gt.loadRes(records)
        for kind in kinds:
            ev = COCOeval(gt, dt, kind)
            if kind == "keypoints":
                ev.params.kpt_oks_sigmas = np.full(len(records[0]["keypoints"]) // 3, 0.05)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
            whole, half = IOU_TYPES[kind]
            out[whole], out[half] = float(ev.stats[0]), float(ev.stats[1])
    return out


#: issue 44's bounds of a build against its reference (fast against exact, bf16 and int8 against
#: fp32): box and mask mAP within ``points`` (mAP x 100) below, and at least ``share`` of the
#: reference's confident detections kept with the same label at box IoU >= 0.9
PRECISION_BOUNDS = {
    "fast": {"points": 0.3, "share": 0.99},
    "bf16": {"points": 0.5, "share": 0.95},
    "int8": {"points": 1.0, "share": 0.95},
}


def bound_of(row: str) -> dict:
    """The bound of a build named ``row``: ``fast``, ``bf16``, or anything int8 (``ort-int8``)."""
    return PRECISION_BOUNDS["int8" if "int8" in row else row]


def judge(row: str, ours: dict, ref: dict) -> dict:
    """Whether ``ours`` (:func:`coco_scores` with ``matched``, :func:`confident_matches`) holds
    ``row``'s bound against ``ref``: ``box_drop``/``mask_drop`` (points below the reference; a
    gain is negative), ``share``, ``holds`` and the bound in words (``text``)."""
    bound = bound_of(row)
    drops = {f"{k}_drop": 100 * (ref[key] - ours[key])
             for k, key in (("box", "box_map"), ("mask", "mask_map"), ("keypoint", "keypoint_ap"))
             if key in ours and key in ref}
    share = ours["matched"]["ref_share"]
    holds = all(d <= bound["points"] for d in drops.values()) and share >= bound["share"]
    text = f"<= {bound['points']:g} pt, >= {100 * bound['share']:g}%"
    return {**drops, "share": share, "holds": bool(holds), "text": text}


def confident_matches(reference: list[dict], ours: list[dict]) -> dict:
    """:func:`~tvm_roialign.models.compare.match_confident` over the images, summed: the share of
    the reference's (fp32's) confident detections (score >= 0.5) that ``ours`` keeps with the same
    label at box IoU >= 0.9 (``ref_share``) and the other way round (``ours_share``)."""
    return sum_matches([match_confident(r, o) for r, o in zip(reference, ours)])


def score_separation(detections: list[dict], margin: float = 0.1) -> dict:
    """How far the detections' scores stay from :data:`CONFIDENT_SCORE`: ``confident`` (score >=
    it), ``others``, ``near`` (within ``margin`` of it: the ones a rounding could move across it),
    and the medians of both groups."""
    scores = np.concatenate([np.asarray(d["scores"], np.float64) for d in detections] or [np.zeros(0)])
    hi, lo = scores[scores >= CONFIDENT_SCORE], scores[scores < CONFIDENT_SCORE]
    return {
        "confident": int(hi.size),
        "others": int(lo.size),
        "near": int((np.abs(scores - CONFIDENT_SCORE) < margin).sum()),
        "confident_median": float(np.median(hi)) if hi.size else float("nan"),
        "others_median": float(np.median(lo)) if lo.size else float("nan"),
    }


__all__ = [
    "PRECISION_BOUNDS",
    "bound_of",
    "coco_results",
    "coco_scores",
    "confident_matches",
    "judge",
    "score_separation",
    "torch_predict",
]
