"""Mask R-CNN through TVM (tvm_roialign.models.maskrcnn) against PyTorch eager, piece by piece.

One reduced configuration (128-pixel input, 40 proposals, 8 detections) is compiled once for the
module (one build for every image size, the default); every piece is compared with torchvision's own
modules run eagerly, and the whole detector with torchvision's ``model([image])``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import tvm
from _detections import assert_matches_eager
from tvm import relax

from tvm_roialign import bench
from tvm_roialign.models import maskrcnn as mr

SIZE = 128
CONFIG = mr.MaskRCNNConfig(
    min_size=SIZE,
    max_size=SIZE,
    rpn_pre_nms_top_n_test=40,
    rpn_post_nms_top_n_test=40,
    box_detections_per_img=8,
)


@pytest.fixture(scope="session")
def model():
    return mr.build_torch_model(CONFIG)


@pytest.fixture(scope="session")
def image():
    return mr.load_image()


@pytest.fixture(scope="session")
def detector(model, image):
    det = mr.TVMMaskRCNN(model, "llvm", "NHWC", fast=False)  # compared by the exact criterion
    with torch.no_grad():
        image_list, _ = model.transform([image])
    det.compile(image_list.tensors.shape)
    return det


@pytest.fixture(scope="session")
def torch_pieces(model):
    return mr.piece_modules(model, "NCHW", (SIZE, SIZE), rewrite=False)


@pytest.fixture(scope="session")
def eager_features(model, image, torch_pieces):
    with torch.no_grad():
        image_list, _ = model.transform([image])
        outs = torch_pieces[0](image_list.tensors)
    return image_list, outs


def _pieces(detector):
    (pieces,) = detector.pieces.values()
    return pieces


def _close(got, expected, rel=1e-3):
    expected = np.asarray(expected)
    scale = max(float(np.abs(expected).max()), 1e-6)
    np.testing.assert_allclose(got, expected, rtol=rel, atol=rel * scale)


def _boxes(num, seed):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, SIZE * 0.7, (num, 2))
    wh = rng.uniform(1, SIZE * 0.6, (num, 2))
    return np.concatenate([xy, np.minimum(xy + wh, SIZE)], axis=1).astype("float32")


def _nhwc(tensor):
    return np.ascontiguousarray(tensor.numpy().transpose(0, 2, 3, 1))


def test_backbone_matches_torch(detector, eager_features):
    image_list, expected = eager_features
    got = _pieces(detector)["backbone"](image_list.tensors.numpy())
    assert len(got) == len(expected) == 15
    for i, (g, e) in enumerate(zip(got, expected)):
        e = e.numpy()
        g = g.transpose(0, 3, 1, 2)  # every output crosses in NHWC
        assert g.shape == e.shape, i
        _close(g, e)


@pytest.mark.parametrize("num_rois", [1, 13, 40])
def test_box_branch_matches_torch(detector, eager_features, torch_pieces, num_rois):
    _, outs = eager_features
    boxes = _boxes(num_rois, seed=num_rois)
    with torch.no_grad():
        logits, regression = torch_pieces[1](*outs[:4], torch.from_numpy(boxes))
    # the heads are compiled for the model's roi bounds: pad with zero boxes, slice
    got_logits, got_regression = (
        out[:num_rois]
        for out in _pieces(detector)["box_branch"](
            *[_nhwc(f) for f in outs[:4]], mr.static_rois(boxes, CONFIG.rpn_post_nms_top_n_test)
        )
    )
    assert got_logits.shape == (num_rois, 91) and got_regression.shape == (
        num_rois,
        364,
    )
    _close(got_logits, logits.numpy())
    _close(got_regression, regression.numpy())


@pytest.mark.parametrize("num_rois", [1, 8])
def test_mask_branch_matches_torch(detector, eager_features, torch_pieces, num_rois):
    _, outs = eager_features
    boxes = _boxes(num_rois, seed=100 + num_rois)
    with torch.no_grad():
        expected = torch_pieces[2](*outs[:4], torch.from_numpy(boxes)).numpy()
    (got,) = _pieces(detector)["mask_branch"](
        *[_nhwc(f) for f in outs[:4]], mr.static_rois(boxes, CONFIG.box_detections_per_img)
    )
    got = got[:num_rois]
    assert got.shape == (num_rois, 91, 28, 28)
    _close(got, expected)


def test_detector_matches_torchvision(detector, model, image):
    (ours,) = detector([image])
    with torch.no_grad():
        (ref,) = model([image])
    assert set(ours) == {"boxes", "labels", "scores", "masks"}
    assert ours["masks"].shape[-2:] == image.shape[-2:]
    cmp = mr.compare_detections(ours, ref)
    assert cmp["passed"], cmp  # at least one detection, labels, boxes, scores, masks
    assert_matches_eager(ours, ref)


def test_one_build_serves_two_photo_sizes(detector, model, image):
    """The one build (``shapes="any"``, the default) runs a photo of another padded size without a
    new build, and both photos match torchvision eager by the package's own comparison."""
    from tvm_roialign.models.compare import passed

    skimage_data = pytest.importorskip("skimage.data")
    coffee = torch.from_numpy(skimage_data.coffee()).permute(2, 0, 1).float() / 255  # 400 x 600
    sizes = {detector.padded_shape(photo)[-2:] for photo in (image, coffee)}
    assert sizes == {(SIZE, SIZE), (96, SIZE)}, sizes
    for photo in (image, coffee):
        (ours,) = detector([photo])
        with torch.no_grad():
            (ref,) = model([photo])
        cmp = mr.compare_detections(ours, ref)
        assert cmp["num_detections_tvm"] > 0 and passed(cmp), cmp
        assert_matches_eager(ours, ref)
    assert list(detector.pieces) == ["any"]  # one build served both sizes


def test_shapes_option(model):
    from tvm_roialign.models.maskrcnn.detector import symbolic_dims

    assert mr.TVMMaskRCNN(model, "llvm").shapes == "any"
    static = mr.TVMMaskRCNN(model, "llvm", shapes="static")
    assert not static.symbolic((1, 3, 512, 512))
    assert mr.TVMMaskRCNN(model, "llvm").symbolic((1, 3, 352, 512))
    low, high = mr.SYMBOLIC_SIDES
    assert not mr.TVMMaskRCNN(model, "llvm").symbolic((1, 3, low - 32, 512))  # a build of its own
    assert not mr.TVMMaskRCNN(model, "llvm").symbolic((1, 3, 512, high + 32))
    with pytest.raises(ValueError, match="shapes"):
        mr.TVMMaskRCNN(model, "llvm", shapes="dynamic")
    dims = symbolic_dims("NHWC")
    assert set(dims["box_branch"]) == {"p0", "p1", "p2", "p3", "boxes"}
    assert dims["box_branch"]["boxes"] is None
    assert set(dims["backbone"]["images"]) == {2, 3}


def test_no_transpose_next_to_roi_align(detector):
    counts = detector.permute_counts()
    for branch in ("box_branch", "mask_branch"):
        assert counts[branch]["adjacent_to_roi_align_before"] > 0, counts
        assert counts[branch]["adjacent_to_roi_align_after"] == 0, counts
    assert counts["box_branch"]["after"] == 0, counts
    # the mask branch keeps the depth-to-space's own 6-D permute and the output's NHWC -> NCHW
    assert counts["mask_branch"]["after"] == 2, counts
    for piece in _pieces(detector).values():
        ops = {
            str(b.value.op.name)
            for f in piece.mod.functions.values()
            if isinstance(f, relax.Function)
            for block in f.body.blocks
            for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
        }
        if piece.name != "backbone":
            assert "relax.vision.multiscale_roi_align" in ops


def test_time_roi_align_agrees_with_stock(detector, eager_features, model):
    _, outs = eager_features
    feats = [_nhwc(f) for f in outs[:4]]
    result = bench.time_roi_align(
        feats,
        _boxes(20, seed=7),
        model.roi_heads.box_roi_pool,
        "NHWC",
        "llvm",
        (SIZE, SIZE),
        repeat=1,
    )
    assert result["num_rois"] == 20
    assert result["max_abs_diff_ours_vs_stock"] < 1e-4
    import tvm_roialign

    assert tvm_roialign.is_registered()


# ---------------------------------------------------------------------------------------------
# pure-PyTorch parts: the graph rewrites, the comparison, weights and images


def test_conv_transpose_rewrite_is_exact():
    torch.manual_seed(0)
    conv = torch.nn.ConvTranspose2d(6, 5, 2, 2)
    rewritten = mr.conv_transpose_as_conv(conv)
    x = torch.randn(3, 6, 7, 9)
    with torch.no_grad():
        torch.testing.assert_close(rewritten(x), conv(x), rtol=1e-5, atol=1e-5)
    assert mr.conv_transpose_as_conv(torch.nn.ConvTranspose2d(6, 5, 3, 2)) is None


def test_keypoint_conv_transpose_rewrite_is_exact():
    """Keypoint R-CNN's predictor (4x4, stride 2, padding 1) as a 3x3 conv per output phase plus
    depth-to-space: torch's own ConvTranspose2d within float32 reordering, on a non-square map;
    another padding is left alone."""
    from tvm_roialign.models._torch_rewrites import ConvTranspose4x4

    torch.manual_seed(1)
    conv = torch.nn.ConvTranspose2d(6, 5, 4, stride=2, padding=1)
    rewritten = mr.conv_transpose_as_conv(conv)
    assert isinstance(rewritten, ConvTranspose4x4)
    x = torch.randn(3, 6, 7, 9)
    with torch.no_grad():
        torch.testing.assert_close(rewritten(x), conv(x), rtol=1e-5, atol=1e-5)
    assert mr.conv_transpose_as_conv(torch.nn.ConvTranspose2d(6, 5, 4, stride=2, padding=0)) is None


def test_nhwc_pieces_match_nchw_pieces(model, eager_features, torch_pieces):
    """The channels-last box head and the rewritten mask predictor give torchvision's results."""
    _, outs = eager_features
    _, box_nhwc, mask_nhwc = mr.piece_modules(model, "NHWC", (SIZE, SIZE))
    boxes = torch.from_numpy(_boxes(9, seed=3))
    feats = [f.permute(0, 2, 3, 1).contiguous() for f in outs[:4]]
    with torch.no_grad():
        for got, expected in zip(
            box_nhwc(*feats, boxes), torch_pieces[1](*outs[:4], boxes)
        ):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(
            mask_nhwc(*feats, boxes),
            torch_pieces[2](*outs[:4], boxes),
            rtol=1e-4,
            atol=1e-4,
        )


def _dets(boxes, labels, scores, masks):
    return {
        "boxes": torch.tensor(boxes, dtype=torch.float32),
        "labels": torch.tensor(labels),
        "scores": torch.tensor(scores),
        "masks": torch.tensor(masks, dtype=torch.float32),
    }


def test_compare_detections():
    masks = np.zeros((2, 1, 4, 4))
    masks[0, 0, :2] = 0.9
    ref = _dets([[0, 0, 2, 2], [1, 1, 3, 3]], [3, 5], [0.9, 0.8], masks)
    same = mr.compare_detections(ref, ref)
    assert (
        same["same_labels"]
        and same["max_box_diff"] == 0
        and same["mask_pixel_agreement"] == 1
    )
    swapped = _dets(
        [[1, 1, 3, 3.001], [0, 0, 2, 2]], [5, 3], [0.8, 0.9], masks[::-1].copy()
    )
    cmp = mr.compare_detections(swapped, ref)
    assert cmp["same_labels"] and cmp["reordered_pairs"] == 2
    assert cmp["max_box_diff"] == pytest.approx(1e-3, abs=1e-6)
    assert cmp["mask_pixel_agreement"] == 1
    wrong_mask = masks.copy()
    wrong_mask[1, 0, 0, 0] = 1.0
    cmp = mr.compare_detections(
        _dets([[0, 0, 2, 2], [1, 1, 3, 3]], [3, 5], [0.9, 0.8], wrong_mask), ref
    )
    assert cmp["mask_pixel_agreement"] == pytest.approx(31 / 32)
    fewer = mr.compare_detections(_dets([[0, 0, 2, 2]], [3], [0.9], masks[:1]), ref)
    assert not fewer["same_labels"] and fewer["num_detections_tvm"] == 1


def test_one_pass_criterion():
    """Both model routes judge with tvm_roialign.models.compare: same count (at least one) and
    labels, boxes within 1e-2 px, scores within 1e-4, >= 99.9% of mask pixels equal at 0.5,
    keypoints within 1e-2 px; tensors with masks [n, 1, H, W] and NumPy with [n, H, W] alike."""
    from tvm_roialign.models import compare, detection

    assert detection.compare is mr.compare_detections is compare.compare_detections
    masks = np.zeros((2, 1, 4, 4))
    masks[0, 0, :2] = 0.9
    ref = _dets([[0, 0, 2, 2], [1, 1, 3, 3]], [3, 5], [0.9, 0.8], masks)
    assert mr.compare_detections(ref, ref)["passed"]
    as_numpy = {key: value.numpy() for key, value in ref.items()}
    as_numpy["masks"] = as_numpy["masks"][:, 0]
    assert mr.compare_detections(as_numpy, ref)["passed"]

    def verdict(boxes=((0, 0, 2, 2), (1, 1, 3, 3)), labels=(3, 5), scores=(0.9, 0.8), m=masks):
        return mr.compare_detections(_dets([list(b) for b in boxes], list(labels), list(scores), m), ref)

    assert verdict(boxes=((0, 0, 2, 2.009), (1, 1, 3, 3)))["passed"]
    assert not verdict(boxes=((0, 0, 2, 2.02), (1, 1, 3, 3)))["passed"]
    assert verdict(scores=(0.90005, 0.8))["passed"]
    assert not verdict(scores=(0.9003, 0.8))["passed"]
    assert not verdict(labels=(3, 6))["passed"]
    wrong_mask = masks.copy()
    wrong_mask[1, 0, 0, 0] = 1.0
    assert not verdict(m=wrong_mask)["passed"]  # 31/32 of the pixels
    empty = {"boxes": np.zeros((0, 4)), "labels": np.zeros(0, np.int64), "scores": np.zeros(0)}
    nothing = mr.compare_detections(empty, empty)
    assert not nothing["passed"] and nothing["mask_pixel_agreement"] == 1  # compared nothing
    keypoints = np.zeros((2, 17, 3))
    with_kp = {**as_numpy, "keypoints": keypoints}
    assert mr.compare_detections(with_kp, with_kp)["max_keypoint_diff"] == 0
    moved = {**with_kp, "keypoints": keypoints + np.array([0.02, 0, 0])}
    assert not mr.compare_detections(moved, with_kp)["passed"]
    assert compare.CRITERIA in bench.MaskRCNNReport.schema()["comparison.passed"]


def test_count_permutes_next_to_roi_align():
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType([1, 8, 8, 4], "float32"))
    rois = relax.Var("rois", relax.TensorType([3, 5], "float32"))
    with bb.function("main", [data, rois]):
        with bb.dataflow():
            nchw = bb.emit(relax.op.permute_dims(data, [0, 3, 1, 2]))
            pooled = bb.emit(
                relax.op.vision.roi_align(
                    nchw, rois, (2, 2), 1.0, 2, False, "NCHW", "avg"
                )
            )
            out = bb.emit_output(bb.emit(relax.op.permute_dims(pooled, [0, 2, 3, 1])))
        bb.emit_func_output(out)
    mod = bb.get()
    assert mr.count_permutes(mod) == 2
    assert mr.permutes_adjacent_to_roi_align(mod) == 2


def test_weights_file(tmp_path, model):
    path = tmp_path / "w.pth"
    torch.save(model.state_dict(), path)
    other = mr.build_torch_model(
        mr.MaskRCNNConfig(seed=123, weights=str(path), min_size=SIZE, max_size=SIZE)
    )
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    bad = tmp_path / "bad.pth"
    torch.save({"fc.weight": torch.zeros(2)}, bad)
    with pytest.raises(ValueError, match="state_dict"):
        mr.build_torch_model(mr.MaskRCNNConfig(weights=str(bad)))
    with pytest.raises(FileNotFoundError):
        mr.build_torch_model(mr.MaskRCNNConfig(weights=str(tmp_path / "missing.pth")))


def test_load_image(tmp_path, image):
    assert image.shape == (3, 512, 512) and image.dtype == torch.float32
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    from PIL import Image

    path = tmp_path / "photo.png"
    Image.fromarray(
        (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    ).save(path)
    torch.testing.assert_close(mr.load_image(str(path)), image, atol=1 / 255, rtol=0)
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    with pytest.raises(ValueError, match="not a readable image"):
        mr.load_image(str(bad))
    with pytest.raises(FileNotFoundError):
        mr.load_image(str(tmp_path / "missing.png"))


def test_bad_layout_rejected(model):
    with pytest.raises(ValueError, match="layout"):
        mr.TVMMaskRCNN(model, "llvm", "NWHC")


def test_glue_runs_on_glue_threads(model):
    """A run sets PyTorch's thread count to ``glue_threads`` and gives the caller's count back."""
    before = torch.get_num_threads()
    seen = []
    for glue_threads, expected in ((1, 1), (None, before)):
        detector = mr.TVMMaskRCNN(model, "llvm", glue_threads=glue_threads)
        detector._run = lambda _image: seen.append(torch.get_num_threads())
        detector.run(None)
        assert seen[-1] == expected
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="glue_threads"):
        mr.TVMMaskRCNN(model, "llvm", glue_threads=0)


def test_default_target_is_this_machine(model):
    from tvm_roialign.target import host_config, target_config

    detector = mr.TVMMaskRCNN(model)
    config = target_config(detector.target)
    assert config["mcpu"] == host_config()["mcpu"] and config["num-cores"] == host_config()["num-cores"]


def test_run_returns_what_the_pieces_got(detector, image):
    run = detector.run(image)
    assert set(run.piece_s) == {"backbone", "box_branch", "mask_branch"}
    assert 0 < run.proposals.shape[0] <= CONFIG.rpn_post_nms_top_n_test and run.proposals.shape[1] == 4
    assert run.detection_boxes.shape == (run.detections["boxes"].shape[0], 4)
    assert len(run.features) == 4 and run.features[0].shape[-1] == 256  # NHWC
    assert run.image_size == (SIZE, SIZE)
    assert not hasattr(detector, "last")


def test_pooler_levels_are_torchvisions(model, eager_features):
    """Scales and the level of each roi come from torchvision's own LevelMapper setup."""
    from torchvision.ops.poolers import MultiScaleRoIAlign

    from tvm_roialign.bench.timing import pooler_levels

    _, outs = eager_features
    pooler = model.roi_heads.box_roi_pool
    scales, mapper = pooler_levels(pooler, outs[:4], (SIZE, SIZE))
    fresh = MultiScaleRoIAlign(pooler.featmap_names, pooler.output_size, pooler.sampling_ratio)
    with torch.no_grad():
        fresh(dict(zip(pooler.featmap_names, outs[:4])), [torch.from_numpy(_boxes(3, 0))], [(SIZE, SIZE)])
    assert scales == fresh.scales
    assert (mapper.k_min, mapper.k_max) == (fresh.map_levels.k_min, fresh.map_levels.k_max)


def test_load_state_dict_errors(tmp_path, model):
    from tvm_roialign.models.maskrcnn.torch_model import load_state_dict

    text = tmp_path / "w.txt"
    text.write_text("hello")
    tensor = tmp_path / "t.pt"
    torch.save(torch.zeros(3), tensor)
    misshapen = tmp_path / "m.pt"
    state = dict(model.state_dict())
    state["roi_heads.box_predictor.cls_score.weight"] = torch.zeros(2, 1024)
    torch.save(state, misshapen)
    wrapped = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "epoch": 3}, wrapped)
    for path, words in (
        (text, "not a PyTorch file written by torch.save"),
        (tensor, "holds a Tensor, not a state_dict"),
        (misshapen, "1 misshapen (e.g. roi_heads.box_predictor.cls_score.weight)"),
    ):
        with pytest.raises(ValueError, match=re.escape(words)) as info:
            load_state_dict(str(path), model)
        assert "--" not in str(info.value)  # library messages name no CLI flag
    assert set(load_state_dict(str(wrapped), model)) == set(model.state_dict())


def test_draw_regions_not_a_lattice(tmp_path, image):
    """A random model's checkerboard mask is drawn as a solid region, not as a lattice, by both
    drawers (torchvision.utils here, Pillow only in the runner); the NumPy window mean equals
    torch's average pooling without the padding."""
    from tvm_roialign.runtime.draw import _window_mean, draw_detections, mask_regions

    box = torch.tensor([[100.0, 100.0, 380.0, 380.0]])
    cell = 280 / 28
    yy, xx = torch.meshgrid(torch.arange(512.0), torch.arange(512.0), indexing="ij")
    checker = (((yy - 100) // cell + (xx - 100) // cell) % 2 == 0).float() * 0.9 + 0.2
    inside = (yy >= 100) & (yy < 380) & (xx >= 100) & (xx < 380)
    mask = torch.where(inside, checker, torch.zeros(()))
    region = mask_regions(mask[None].numpy(), box.numpy(), 0.5)[0]
    core = region[120:360, 120:360]
    assert bool(core.all())  # solid inside the box
    assert not bool(region[:80].any())  # nothing far outside it
    pooled = torch.nn.functional.avg_pool2d(
        mask[None, None].double(), (21, 19), stride=1, padding=(10, 9), count_include_pad=False
    )[0, 0]
    np.testing.assert_allclose(_window_mean(mask.numpy(), 21, 19), pooled.numpy(), rtol=1e-9, atol=1e-12)
    rgb = (image.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    runner_picture = draw_detections(
        rgb, {"boxes": box.numpy(), "labels": [1], "scores": [0.9], "masks": mask[None].numpy()}, caption="c"
    )
    assert runner_picture.width == 512 and runner_picture.height > 512
    path = tmp_path / "picture.png"
    dets = {
        "boxes": box,
        "labels": torch.tensor([1]),
        "scores": torch.tensor([0.9]),
        "masks": mask[None, None],
    }
    mr.draw_detections(image, dets, path, caption="a caption line that is long enough to wrap " * 3)
    from PIL import Image

    with Image.open(path) as picture:
        assert picture.width == 512 and picture.height > 512 + 2 * 16  # two or more caption lines
