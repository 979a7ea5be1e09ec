"""``relax.vision.batched_nms`` against torchvision's ``batched_nms`` (its two CPU paths).

One Relax function (sort + the greedy pass, built through the package's CPU pipeline) per
``(N, max_output, iou_threshold, offset_trick_max_numel)``; the expected value is torchvision's
``batched_nms`` on the valid boxes, truncated to ``max_output``. Cases cover both of torchvision's
paths (coordinate offsets with few boxes, per class with many), ties in score, exact duplicates,
IoU exactly at the threshold, empty and full outputs, degenerate boxes, and an FMA target.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_roialign.ops.nms import make_batched_nms, make_batched_nms_call
from tvm_roialign.pipeline import build
from tvm_roialign.topi.nms import threshold_below

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
from _targets import GENERIC
from _targets import NATIVE as HOST
from torchvision.ops import boxes as box_ops


@functools.cache
def _nms_vm(num, max_output, iou, trick=4000, target=None):
    target = target if target is not None else GENERIC
    bb = relax.BlockBuilder()
    args = [
        relax.Var("boxes", relax.TensorType([num, 4], "float32")),
        relax.Var("scores", relax.TensorType([num], "float32")),
        relax.Var("idxs", relax.TensorType([num], "int64")),
        relax.Var("valid", relax.TensorType([num], "bool")),
    ]
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(make_batched_nms(bb, *args, iou, max_output, trick))
        bb.emit_func_output(out)
    return relax.VirtualMachine(build(bb.get(), target).executable, tvm.cpu())


def run_nms(boxes, scores, idxs, valid, iou, max_output, trick=4000, target=None):
    vm = _nms_vm(
        len(boxes),
        max_output,
        iou,
        trick,
        target,
    )
    arrays = [
        np.ascontiguousarray(boxes, "float32"),
        np.ascontiguousarray(scores, "float32"),
        np.ascontiguousarray(idxs, "int64"),
        np.ascontiguousarray(valid, "bool"),
    ]
    keep, count = vm["main"](*(tvm.runtime.tensor(a) for a in arrays))
    return keep.numpy(), int(count.numpy()[0])


def expected_nms(boxes, scores, idxs, valid, iou, max_output, trick=4000):
    """torchvision on the valid boxes: the path it takes on CPU (or the one ``trick`` forces)."""
    selected = np.nonzero(valid)[0]
    args = (
        torch.from_numpy(np.asarray(boxes, "float32")[selected]),
        torch.from_numpy(np.asarray(scores, "float32")[selected]),
        torch.from_numpy(np.asarray(idxs, "int64")[selected]),
        iou,
    )
    if selected.size == 0:
        return np.zeros(0, np.int64)
    if trick == 4000:
        kept = torchvision.ops.batched_nms(*args)  # torchvision's own choice on CPU
    elif 0 <= trick and selected.size * 4 <= trick:
        kept = box_ops._batched_nms_coordinate_trick(*args)
    else:
        kept = box_ops._batched_nms_vanilla(*args)
    return selected[kept.numpy()][:max_output]


def random_case(rng, num, classes, valid_fraction, extent=500.0, size=(1.0, 80.0)):
    xy = rng.uniform(0, extent, (num, 2))
    wh = rng.uniform(*size, (num, 2))
    boxes = np.concatenate([xy, xy + wh], axis=1).astype("float32")
    scores = rng.uniform(0, 1, num).astype("float32")
    idxs = rng.integers(0, classes, num)
    valid = rng.uniform(size=num) < valid_fraction
    return boxes, scores, idxs, valid


def check(boxes, scores, idxs, valid, iou, max_output, trick=4000, target=None):
    """Equal to torchvision's result. Within a run of equal scores the order may differ:
    torchvision's per-class path orders its result with an unstable sort (ours: by index)."""
    keep, count = run_nms(boxes, scores, idxs, valid, iou, max_output, trick, target)
    expected = expected_nms(boxes, scores, idxs, valid, iou, max_output, trick)
    assert count == len(expected)
    assert (keep[count:] == -1).all()
    got, scores = keep[:count], np.asarray(scores, "float32")
    np.testing.assert_array_equal(scores[got], scores[expected])
    for value in np.unique(scores[got]):
        run = scores[got] == value
        assert sorted(got[run]) == sorted(expected[run])
        assert list(got[run]) == sorted(got[run])  # ties: lower index first
    return count


# (num, classes, valid fraction, iou, max_output): <= 1000 valid boxes take torchvision's
# coordinate-offset path, more take its per-class path
CASES = {
    "offsets_few_boxes": (600, 4, 0.5, 0.7, 1000),
    "per_class_many_boxes": (4000, 5, 0.9, 0.7, 1000),
    "rpn_like_cap": (4000, 5, 0.95, 0.7, 300),
    "box_head_like": (9000, 90, 0.3, 0.5, 100),
    "one_class": (800, 1, 1.0, 0.5, 800),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_torchvision(case):
    num, classes, fraction, iou, max_output = CASES[case]
    rng = np.random.default_rng(sorted(CASES).index(case))
    for _ in range(3):
        check(*random_case(rng, num, classes, fraction), iou, max_output)


@pytest.mark.parametrize("trick", [-1, 100000])
def test_forced_path(trick):
    """``offset_trick_max_numel`` picks the path: -1 always per class, 100000 (torchvision on
    CUDA) the offsets up to 25000 boxes."""
    rng = np.random.default_rng(7)
    for _ in range(2):
        check(*random_case(rng, 3000, 6, 0.8), 0.6, 500, trick)


def test_the_two_paths_differ_and_each_is_matched():
    """A case where torchvision's two paths keep different boxes (the offsets round the IoUs),
    so that matching each one is a real check."""
    rng = np.random.default_rng(11)
    for _ in range(50):
        case = random_case(rng, 900, 40, 1.0, extent=3000.0, size=(1.0, 400.0))
        offsets = expected_nms(*case, 0.5, 900, trick=100000)
        vanilla = expected_nms(*case, 0.5, 900, trick=-1)
        if not np.array_equal(offsets, vanilla):
            break
    else:
        raise AssertionError(
            "no case of the fixed seed separates torchvision's two paths"
        )
    check(*case, 0.5, 900, trick=100000)
    check(*case, 0.5, 900, trick=-1)


def test_ties_keep_the_lower_index_first():
    rng = np.random.default_rng(3)
    boxes, _, idxs, valid = random_case(rng, 500, 3, 1.0, extent=100.0)
    scores = rng.integers(0, 4, 500).astype("float32") / 4  # many equal scores
    check(boxes, scores, idxs, valid, 0.5, 500)
    check(boxes, scores, idxs, valid, 0.5, 500, trick=-1)


def test_duplicates_and_degenerate_boxes():
    boxes = np.array(
        [
            [0, 0, 10, 10],
            [0, 0, 10, 10],
            [5, 5, 5, 5],
            [5, 5, 5, 5],
            [1, 1, 0, 0],
            [20, 20, 30, 30],
        ],
        "float32",
    )
    scores = np.array([0.9, 0.9, 0.8, 0.7, 0.6, 0.5], "float32")
    idxs = np.zeros(6, np.int64)
    count = check(boxes, scores, idxs, np.ones(6, bool), 0.5, 6)
    assert count == 5  # the duplicate is suppressed; zero-area boxes (IoU 0/0) are kept


def test_iou_exactly_at_threshold_is_kept():
    """torchvision suppresses at IoU > threshold, not >= (stock TVM's NMS)."""
    boxes = np.array(
        [[0, 0, 2, 1], [0, 0, 1, 1], [0, 0, 1.5, 1]], "float32"
    )  # IoU 0.5, 0.75
    scores = np.array([0.9, 0.8, 0.7], "float32")
    keep, count = run_nms(boxes, scores, np.zeros(3), np.ones(3, bool), 0.5, 3)
    assert count == 2 and list(keep[:2]) == [0, 1]
    check(boxes, scores, np.zeros(3), np.ones(3, bool), 0.5, 3)


def test_empty_and_full():
    rng = np.random.default_rng(5)
    boxes, scores, idxs, _ = random_case(rng, 200, 2, 1.0)
    keep, count = run_nms(boxes, scores, idxs, np.zeros(200, bool), 0.5, 50)
    assert count == 0 and (keep == -1).all()
    count = check(boxes, scores, idxs, np.ones(200, bool), 0.1, 50)
    assert count == 50  # more survivors than the cap: exactly the first 50


def test_fma_target_keeps_torchvision_decisions():
    """With the host's mcpu (FMA), the products are still rounded as torchvision rounds them."""
    rng = np.random.default_rng(9)
    for _ in range(3):
        check(
            *random_case(rng, 3000, 4, 0.6, size=(1.0, 150.0)), 0.5, 1000, target=HOST
        )


def test_threshold_below():
    for value in (0.7, 0.5, 0.3, 1.0, 0.0, 1 / 3):
        below = np.float32(threshold_below(value))
        assert float(below) <= value
        assert float(np.nextafter(below, np.float32(2))) > value


def test_bad_arguments():
    def var(name, shape, dtype):
        return relax.Var(name, relax.TensorType(shape, dtype))

    boxes, idxs = var("boxes", [10, 4], "float32"), var("idxs", [10], "int64")
    valid, order = var("valid", [10], "bool"), var("order", [10], "int64")
    bad = {
        r"boxes must be \[N, 4\]": (
            var("b", [10, 5], "float32"),
            idxs,
            valid,
            order,
            0.5,
            5,
        ),
        "max_output must be a positive int": (boxes, idxs, valid, order, 0.5, 0),
        r"iou_threshold must be in \[0, 1\]": (boxes, idxs, valid, order, 1.5, 5),
        "valid must be bool": (boxes, idxs, var("v", [10], "int32"), order, 0.5, 5),
        "idxs must be an integer tensor": (
            boxes,
            var("i", [10], "float32"),
            valid,
            order,
            0.5,
            5,
        ),
    }
    for message, args in bad.items():
        with pytest.raises((ValueError, TypeError), match=message):
            relax.BlockBuilder().normalize(make_batched_nms_call(*args))


def test_gpu_builds():
    """CUDA and Metal builds (one GPU thread runs the pass); compile-only here."""
    for target in (
        tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host={"kind": "llvm"}),
        tvm.target.Target({"kind": "metal"}, host={"kind": "llvm"}),
    ):
        bb = relax.BlockBuilder()
        args = [
            relax.Var("boxes", relax.TensorType([64, 4], "float32")),
            relax.Var("scores", relax.TensorType([64], "float32")),
            relax.Var("idxs", relax.TensorType([64], "int64")),
            relax.Var("valid", relax.TensorType([64], "bool")),
        ]
        with bb.function("main", args):
            with bb.dataflow():
                out = bb.emit_output(make_batched_nms(bb, *args, 0.5, 16))
            bb.emit_func_output(out)
        executable = build(bb.get(), target).executable
        found, stack = [], [executable.mod]
        while stack:
            module = stack.pop()
            if module.kind == target.kind.name:
                found.append(module.inspect_source(""))
            stack.extend(module.imports)
        assert any("batched_nms" in source for source in found), target.kind.name
        if target.kind.name == "metal":  # Metal has no double
            assert not any("double" in source for source in found)
