"""TVM's detections against PyTorch eager's: pairing, differences, and the pass criteria."""

from __future__ import annotations

import torch

#: What a comparison must show to pass.
CRITERIA = "same labels, max box diff <= 1e-2 px, >= 99.9% mask pixels equal at 0.5"


def compare_detections(ours: dict, ref: dict, mask_threshold: float = 0.5) -> dict:
    """TVM vs PyTorch eager detections of one image.

    Detections are paired in order (both are sorted by score); where the order differs (scores
    closer than float noise), each detection is paired with the unused reference detection of the
    same label and nearest box. Returns counts, ``same_labels``, ``reordered_pairs``,
    ``max_box_diff`` (input pixels), ``max_score_diff`` and ``mask_pixel_agreement`` (fraction of
    pixels of all masks equal after thresholding at ``mask_threshold``).
    """
    ob, rb = ours["boxes"].double(), ref["boxes"].double()
    ol, rl = ours["labels"], ref["labels"]
    result = {"num_detections_tvm": int(ob.shape[0]), "num_detections_torch": int(rb.shape[0])}
    if ob.shape[0] != rb.shape[0]:
        result.update(same_labels=False, max_box_diff=float("inf"), mask_pixel_agreement=0.0)
        return result
    n = ob.shape[0]
    if n == 0:
        result.update(
            same_labels=True,
            reordered_pairs=0,
            max_box_diff=0.0,
            max_score_diff=0.0,
            mask_pixel_agreement=1.0,
        )
        return result
    order = list(range(n))
    if not (torch.equal(ol, rl) and float((ob - rb).abs().max()) < 1e-2):
        used: set[int] = set()
        order = []
        for i in range(n):
            cands = [j for j in range(n) if j not in used and int(rl[j]) == int(ol[i])]
            if not cands:
                cands = [j for j in range(n) if j not in used]
            j = min(cands, key=lambda j: float((ob[i] - rb[j]).abs().max()))
            used.add(j)
            order.append(j)
    idx = torch.tensor(order, dtype=torch.int64)
    rb, rl = rb[idx], rl[idx]
    rs, rm = ref["scores"][idx], ref["masks"][idx]
    agree = ((ours["masks"] > mask_threshold) == (rm > mask_threshold)).double().mean()
    result.update(
        same_labels=bool(torch.equal(ol, rl)),
        reordered_pairs=int(sum(1 for i, j in enumerate(order) if i != j)),
        max_box_diff=float((ob - rb).abs().max()),
        max_score_diff=float((ours["scores"].double() - rs.double()).abs().max()),
        mask_pixel_agreement=float(agree),
    )
    return result


def passed(cmp: dict) -> bool:
    """Whether the comparison ``cmp`` (from :func:`compare_detections`) meets :data:`CRITERIA`."""
    return bool(
        cmp["num_detections_tvm"] == cmp["num_detections_torch"] > 0
        and cmp["same_labels"]
        and cmp["max_box_diff"] <= 1e-2
        and cmp["mask_pixel_agreement"] >= 0.999
    )


__all__ = ["CRITERIA", "compare_detections", "passed"]
