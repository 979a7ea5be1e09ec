"""The PyTorch-free runner (:mod:`tvm_roialign.runtime`): its NumPy steps against torchvision, and
proof that it runs a detector artifact without PyTorch.

* mask paste and bilinear weights against torchvision's / PyTorch's own functions;
* a subprocess in which ``import torch`` fails (a meta-path blocker) runs an artifact end to end
  and finds ``torch`` absent from ``sys.modules``;
* a fresh virtual environment holding only the core install (``apache-tvm`` and its dependencies,
  ``numpy``, ``rich``) plus Pillow, made offline from the packages already installed here
  (``python -m venv --without-pip`` and one symlink per top-level module of each distribution,
  no download), runs ``python -m tvm_roialign run model.so --image photo --out result.png``
  (``tvm-roialign run``) on the artifact.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
import torch.nn.functional as F
from _cli import run_cli
from _detections import assert_matches_eager
from _tiny_rcnn import tiny_rcnn
from PIL import Image
from torchvision.models.detection.roi_heads import paste_masks_in_image

from tvm_roialign.frontend.static_rcnn import torch_bilinear_fused
from tvm_roialign.models import detection as det
from tvm_roialign.runtime import (
    Detector,
    bilinear_weights,
    detect_to_files,
    paste_masks,
    resize_bilinear,
)

REPO = Path(__file__).resolve().parents[1]
#: The core install (pyproject's dependencies) and Pillow, which the runner draws with.
CORE = ("apache-tvm", "numpy", "rich", "pillow")


# --------------------------------------------------------------------------------------------------
# NumPy steps


@pytest.mark.parametrize(
    "in_size,out_size", [(30, 57), (30, 300), (400, 341), (37, 189), (28, 5)]
)
def test_bilinear_weights_are_pytorchs(in_size, out_size):
    fused = torch_bilinear_fused(
        in_size, out_size
    )  # raises if neither form is PyTorch's
    index0, index1, lambda0, lambda1 = bilinear_weights(in_size, out_size, fused)
    assert (
        (index0 >= 0).all()
        and (index1 < in_size).all()
        and (index1 - index0 <= 1).all()
    )
    np.testing.assert_allclose(lambda0 + lambda1, 1.0, atol=1e-7)


@pytest.mark.parametrize("size,out", [((30, 30), (200, 90)), ((341, 512), (400, 600))])
def test_resize_matches_interpolate(rng, size, out):
    image = rng.random((2, *size), dtype=np.float32)
    expected = F.interpolate(
        torch.from_numpy(image)[None], size=out, mode="bilinear", align_corners=False
    )[0].numpy()
    np.testing.assert_allclose(
        resize_bilinear(image, *out), expected, rtol=0, atol=2e-7
    )


@pytest.mark.parametrize("bounds", [(512, 512), (800, 1333), (160, 200)])
@pytest.mark.parametrize("size", [(400, 600), (600, 512), (300, 451), (237, 311), (160, 640), (33, 1000)])
def test_transform_is_torchvisions(bounds, size, rng):
    """The runner's NumPy transform (normalize, aspect-keeping resize, padding) is torchvision's
    GeneralizedRCNNTransform bit for bit (at least two PyTorch threads: its generic kernel), and
    every padded size a photo gets is among :func:`all_padded_sizes`."""
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    from tvm_roialign.runtime.transform import TransformSettings, all_padded_sizes, padded_size

    transform = GeneralizedRCNNTransform(*bounds, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    settings = TransformSettings.of(transform, torch_bilinear_fused(30, 57))
    rgb = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 2))
    try:
        with torch.no_grad():
            images, _ = transform([torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0])
    finally:
        torch.set_num_threads(threads)
    ours = settings(rgb)
    assert tuple(ours.shape[1:]) == tuple(images.image_sizes[0])
    padded = padded_size([ours.shape[1:]])
    assert padded == tuple(images.tensors.shape[-2:])
    h, w = ours.shape[1:]
    np.testing.assert_array_equal(ours, images.tensors[0, :, :h, :w].numpy())
    assert padded in all_padded_sizes(*bounds)


def test_padded_size_of_a_batch_is_batch_images():
    """Resized sizes of three photos padded together, as torchvision's batch_images pads."""
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    from tvm_roialign.runtime.transform import padded_size

    transform = GeneralizedRCNNTransform(512, 512, [0.0] * 3, [1.0] * 3)
    sizes = [(341, 512), (512, 436), (128, 500)]
    batched = transform.batch_images([torch.zeros((3, *s)) for s in sizes])
    assert padded_size(sizes) == tuple(batched.shape[-2:]) == (512, 512)


@pytest.mark.parametrize("min_size, max_size", [(512, 512), (800, 1333), (300, 500)])
def test_longest_padded_side_is_batch_images_of_the_longest_photo(min_size, max_size):
    """The side at which a symbolic build judges its convs: the padded long side of a photo that
    torchvision resizes to ``max_size`` (a panorama), as batch_images pads it."""
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    from tvm_roialign.runtime.transform import TransformSettings

    transform = GeneralizedRCNNTransform(min_size, max_size, [0.0] * 3, [1.0] * 3).eval()
    with torch.no_grad():
        images, _ = transform([torch.zeros(3, 100, 4000)])
    assert TransformSettings.of(transform).longest_padded_side() == images.tensors.shape[-1]


def test_paste_masks_matches_torchvision(rng):
    height, width, count = 400, 600, 80
    masks = rng.random((count, 28, 28), dtype=np.float32)
    xy = rng.uniform(0, [width - 2, height - 2], (count, 2))
    wh = np.concatenate(
        [rng.uniform(0.2, 20, (10, 2)), rng.uniform(1, 400, (count - 10, 2))]
    )
    boxes = np.concatenate([xy, np.minimum(xy + wh, [width, height])], axis=1).astype(
        "float32"
    )
    expected = paste_masks_in_image(
        torch.from_numpy(masks)[:, None], torch.from_numpy(boxes), (height, width)
    )[:, 0].numpy()
    ours = paste_masks(masks, boxes, height, width)
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6)
    assert ((ours > 0.5) == (expected > 0.5)).mean() >= 0.99999


def test_paste_masks_bad_input():
    with pytest.raises(ValueError, match=r"masks must be \[D, M, M\]"):
        paste_masks(np.zeros((2, 28, 14)), np.zeros((2, 4)), 10, 10)
    with pytest.raises(ValueError, match="2 masks but 3 boxes"):
        paste_masks(np.zeros((2, 28, 28)), np.zeros((3, 4)), 10, 10)


# --------------------------------------------------------------------------------------------------
# an artifact: a small Mask R-CNN of a user's making (quick to compile)


def _tiny_mask_rcnn():
    return tiny_rcnn(masks=True, seed=1, detections_per_img=12)


#: The tiny model's photo sizes in the artifact: coffee (400x600 -> 133x200, padded 160x224),
#: its portrait (224x160) and a square (160x160).
TINY_SIZES = [(400, 600), (600, 400), (300, 300)]


@pytest.fixture(scope="session")
def artifact(tmp_path_factory):
    """``(library, photo path, model, rgb)``: the tiny Mask R-CNN compiled for three padded
    sizes (one artifact)."""
    root = tmp_path_factory.mktemp("runtime")
    rgb = det.sample_photo("coffee")
    photo = root / "coffee.png"
    Image.fromarray(rgb).save(photo)
    model = _tiny_mask_rcnn()
    library = det.compile_detector(model, TINY_SIZES, target="llvm", fast=False).export(
        root / "tiny.so"
    )
    return library, photo, model, rgb


def test_runner_matches_torchvision(artifact, tmp_path):
    library, photo, model, rgb = artifact
    ref = det.torch_detections(model, rgb)  # the independent reference: torchvision eager
    ours = Detector(library)(rgb)
    result = det.compare(ours, ref)
    assert result["passed"], result  # the package's one criterion, at least one detection
    assert_matches_eager(ours, ref)  # and in plain NumPy
    # score threshold 0 (every candidate counts): eager fills the model's cap
    cap = model.roi_heads.detections_per_img
    assert result["num_detections_tvm"] == len(ref["boxes"]) == cap, result
    summary = detect_to_files(
        library, photo, tmp_path / "out.png", tmp_path / "out.json"
    )
    assert json.loads((tmp_path / "out.json").read_text()) == summary
    assert summary["num_detections"] == len(ref["boxes"]) and summary["image_size"] == [400, 600]
    assert summary["resized_size"] == [133, 200] and summary["padded_size"] == [160, 224]
    with Image.open(tmp_path / "out.png") as drawn:
        assert drawn.width == 600 and drawn.height > 400  # the caption strip below the photo


@pytest.mark.parametrize(
    "photo_name,crop,padded",
    [("chelsea", None, (160, 224)), ("coffee", "portrait", (224, 160)), ("astronaut", None, (160, 160)),
     ("rocket", (slice(0, 300), slice(100, 400)), (160, 160))],
)
def test_runner_keeps_the_aspect_ratio(artifact, photo_name, crop, padded):
    """Photos of other sizes, each at its own size, through the function of its padded size:
    eager's detections (no stretch), boxes and masks in the photo's own pixels."""
    library, _, model, _ = artifact
    rgb = det.sample_photo(photo_name)
    if crop == "portrait":
        rgb = np.ascontiguousarray(np.rot90(rgb))
    elif crop is not None:
        rgb = np.ascontiguousarray(rgb[crop])
    result = Detector(library)(rgb)
    assert result["padded"] == padded
    assert result["masks"].shape[1:] == rgb.shape[:2]
    ref = det.torch_detections(model, rgb)
    comparison = det.compare(result, ref)
    assert comparison["passed"], comparison
    assert_matches_eager(result, ref)


def test_runner_batch_is_eagers_batched_call(artifact):
    """Photos of different sizes in one call: padded together (coffee + its portrait: 224x224,
    not in the artifact: refused; coffee + chelsea: 160x224), equal to eager's ``model([a, b])``
    image by image; ``raw`` gives ``[N, D, ...]`` and the per-image counts."""
    library, _, model, rgb = artifact
    detector = Detector(library)
    chelsea = det.sample_photo("chelsea")
    portrait = np.ascontiguousarray(np.rot90(rgb))
    with pytest.raises(ValueError, match=r"a batch of 2 photos \(400x600, 600x400\) is padded to "
                       r"224x224 .*accepts padded sizes 160x160, 160x224, 224x160"):
        detector([rgb, portrait])
    batch = [rgb, chelsea]
    images = [torch.from_numpy(r).permute(2, 0, 1).float() / 255.0 for r in batch]
    with torch.no_grad():
        refs = model(images)
    results = detector(batch)
    for ours, ref in zip(results, refs):
        ref = {k: v.numpy() for k, v in ref.items()}
        ref["masks"] = ref["masks"][:, 0]
        comparison = det.compare(ours, ref)
        assert comparison["passed"], comparison
        assert_matches_eager(ours, ref)
    raw = detector.raw(batch)
    cap = model.roi_heads.detections_per_img  # rows per image: the model's cap, zero-padded
    assert raw["boxes"].shape == (2, cap, 4) and raw["masks"].shape[:2] == (2, cap)
    assert raw["num_detections"].tolist() == [len(r["boxes"]) for r in refs]


def test_runner_errors(artifact, tmp_path):
    library, _, _, rgb = artifact
    detector = Detector(library)
    with pytest.raises(ValueError, match=r"^image must be \[H, W, 3\] uint8"):
        detector(np.zeros((10, 10), np.uint8))
    with pytest.raises(ValueError, match=r"^images\[1\] must be \[H, W, 3\] uint8 RGB, got float32"):
        detector([rgb, rgb.astype(np.float32)])
    with pytest.raises(
        ValueError, match=r"^images\[0\] must be \[H, W, 3\] uint8 RGB, got uint8 \[10, 10, 4\]"
    ):
        detector([np.zeros((10, 10, 4), np.uint8)])
    with pytest.raises(ValueError, match=r"^images is an empty list"):
        detector([])
    with pytest.raises(ValueError, match=r"^a photo of 50x200 is padded to 64x224 .* accepts padded "
                       r"sizes 160x160, 160x224, 224x160 \(compile with --input-size 50x200"):
        detector(np.zeros((50, 200, 3), np.uint8))
    # resized to 33 rows in 64: no build serves it (a build of its size would refuse it too)
    with pytest.raises(ValueError, match=r"^a photo of 100x600 is resized .* to \d+x\d+, padded to "
                       r"64x224: .* at least 46 there\); no build serves it") as info:
        detector(np.zeros((100, 600, 3), np.uint8))
    assert "--input-size" not in str(info.value)
    (tmp_path / "plain.so").write_bytes(b"")
    with pytest.raises(ValueError, match="has no metadata file"):
        Detector(tmp_path / "plain.so")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Detector(tmp_path / "missing.so")
    meta = json.loads(Path(str(library) + ".json").read_text())
    old = {k: v for k, v in meta.items() if k not in ("buckets", "transform")}
    (tmp_path / "old.so").write_bytes(Path(library).read_bytes())
    (tmp_path / "old.so.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="compiled by an older tvm-roialign"):
        Detector(tmp_path / "old.so")
    meta["target"] = {"kind": "llvm", "mtriple": "riscv64-linux-gnu"}
    (tmp_path / "riscv.so").write_bytes(b"")
    (tmp_path / "riscv.so.json").write_text(json.dumps(meta))
    with pytest.raises(
        ValueError, match="built for riscv64-linux-gnu; this machine is"
    ):
        Detector(tmp_path / "riscv.so")


def test_cli_run_on_a_detector(artifact, tmp_path, capsys, monkeypatch):
    """``run`` of a detector library: --image is needed and named in its errors; the mask paste
    time is printed only for a model with masks."""
    from tvm_roialign import runtime

    library, photo, model, rgb = artifact
    expected = len(det.torch_detections(model, rgb)["boxes"])  # eager's count on the photo

    def run(*argv):
        return run_cli(["run", str(library), *argv], capsys)

    code, _, err = run("--print-time", "--repeat", "2")
    assert code == 1 and err.count("\n") == 1, err
    assert "is a detector library" in err and "--image PHOTO" in err, err
    not_image = tmp_path / "notanimage.npz"
    np.savez(not_image, x=np.zeros(3))
    code, _, err = run("--image", str(not_image), "--out", str(tmp_path / "r.png"))
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("tvm-roialign: error: --image: ") and "not a readable image" in err, err
    wide = tmp_path / "wide.png"
    Image.fromarray(np.zeros((100, 600, 3), np.uint8)).save(wide)
    code, _, err = run("--image", str(wide), "--out", str(tmp_path / "r.png"))
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"tvm-roialign: error: --image {str(wide)!r}: a photo of 100x600 is "
                          "resized by torchvision's transform"), err
    assert "padded to 64x224" in err and "no build serves it" in err and "--input-size" not in err, err
    code, out, err = run("--image", str(photo), "--out", str(tmp_path / "r.png"))
    assert code == 0, err
    assert f"{expected} detections in" in out and "with the mask paste" in out, out
    # a Faster R-CNN artifact (no masks output): no mask paste
    meta = runtime.read_metadata(library)
    assert "masks" in meta["outputs"]
    no_masks = {**meta, "outputs": [o for o in meta["outputs"] if o != "masks"]}
    monkeypatch.setattr(runtime, "read_metadata", lambda _library: no_masks)
    code, out, err = run("--image", str(photo), "--out", str(tmp_path / "r.png"))
    assert code == 0, err
    assert "detections in" in out and "mask paste" not in out, out


_BLOCK_TORCH = """
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision", "functorch"):
            raise ImportError(f"{name} is blocked")
sys.meta_path.insert(0, Block())
from tvm_roialign.runtime import detect_to_files
summary = detect_to_files(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])
print(json.dumps({"torch_loaded": any(m.split(".")[0] == "torch" for m in sys.modules),
                  "num_detections": summary["num_detections"]}))
"""


def test_runner_does_not_import_torch(artifact, tmp_path):
    """With ``import torch`` made to fail (tvm_ffi imports torch whenever it can), the runner
    still runs the artifact, and no torch module is loaded."""
    library, photo, model, rgb = artifact
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _BLOCK_TORCH,
            str(library),
            str(photo),
            str(tmp_path / "r.png"),
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    eager = len(det.torch_detections(model, rgb)["boxes"])
    assert report == {"torch_loaded": False, "num_detections": eager}
    in_process = detect_to_files(library, photo)
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["detections"] == in_process["detections"]


def _top_level_entries(dist) -> set[str]:
    entries = set()
    for file in dist.files or []:
        first = Path(str(file)).parts[0]
        if first == "..":
            continue
        entries.add(first)
    return entries


def _core_closure() -> dict:
    """The distributions of :data:`CORE` and everything they require (no extras)."""
    found, todo = {}, list(CORE)
    while todo:
        name = (
            re.split(r"[\s;<>=!~\[(]", todo.pop().strip())[0].lower().replace("_", "-")
        )
        if name in found:
            continue
        dist = importlib.metadata.distribution(name)
        found[name] = dist
        todo.extend(r for r in dist.requires or [] if "extra ==" not in r)
    return found


def make_core_venv(root: Path) -> Path:
    """A venv with only the core install and Pillow, offline: symlinks to what is installed."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root)], check=True
    )
    (site,) = root.glob("lib/python*/site-packages")
    for dist in _core_closure().values():
        base = Path(dist.locate_file(""))
        for entry in _top_level_entries(dist):
            if not (site / entry).exists() and (base / entry).exists():
                (site / entry).symlink_to(base / entry)
    (site / "tvm_roialign_src.pth").write_text(str(REPO) + "\n")
    return root / "bin" / "python"


def test_fresh_venv_with_the_core_install_runs_the_artifact(artifact, tmp_path):
    library, photo, _, _ = artifact
    python = make_core_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    probe = subprocess.run(
        [
            str(python),
            "-c",
            (
                "import importlib.util as u; print(u.find_spec('torch') is None, "
                "u.find_spec('torchvision') is None, u.find_spec('tvm') is not None)"
            ),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert probe.stdout.split() == ["True", "True", "True"]
    out = subprocess.run(
        [
            str(python),
            "-m",
            "tvm_roialign",
            "run",
            str(library),
            "--image",
            str(photo),
            "--out",
            str(tmp_path / "v.png"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("12 detections")
    summary = json.loads((tmp_path / "v.json").read_text())
    assert summary["detections"] == detect_to_files(library, photo)["detections"]
    assert (tmp_path / "v.png").stat().st_size > 0


# --------------------------------------------------------------------------------------------------
# one function for every photo size (the default): symbolic padded height and width


@pytest.fixture(scope="session")
def any_artifact(tiny_any_detector):
    """``(library, model)``: the tiny Mask R-CNN compiled for any size (one function; exact)."""
    return tiny_any_detector


def _photo(name: str) -> np.ndarray:
    if name == "portrait":
        return np.ascontiguousarray(np.rot90(det.sample_photo("coffee")))
    if name == "wide":  # 150x400 -> 75x200, padded 96x224
        return np.ascontiguousarray(det.sample_photo("rocket")[150:300, 100:500])
    if name == "tall":  # 400x150 -> 200x75, padded 224x96
        return np.ascontiguousarray(det.sample_photo("astronaut")[50:450, 200:350])
    return det.sample_photo(name)


def test_any_size_artifact_is_one_function(any_artifact):
    library, _ = any_artifact
    meta = json.loads(Path(str(library) + ".json").read_text())
    assert meta["buckets"] == [] and meta["any_size"]["function"] == "detect"
    assert (meta["any_size"]["min_side"], meta["any_size"]["max_side"]) == (96, 4096)
    assert Detector(library).accepted == "any padded size from 96 to 4096 pixels a side"


@pytest.mark.parametrize(
    "name,padded",
    [("coffee", (160, 224)), ("portrait", (224, 160)), ("astronaut", (160, 160)),
     ("chelsea", (160, 224)), ("grace_hopper", (192, 160)), ("wide", (96, 224)),
     ("tall", (224, 96))],
)
def test_any_size_artifact_equals_eager_on_every_photo(any_artifact, name, padded):
    """One build, photos of seven sizes at their own sizes (landscape, portrait, square, very
    wide, very tall): each equals torchvision eager on the photo as it is."""
    library, model = any_artifact
    rgb = _photo(name)
    result = Detector(library)(rgb)
    assert result["padded"] == padded
    ref = det.torch_detections(model, rgb)
    comparison = det.compare(result, ref)
    assert comparison["passed"], comparison
    assert_matches_eager(result, ref)
    assert comparison["num_detections_tvm"] == model.roi_heads.detections_per_img


def test_any_size_artifact_batch_of_three(any_artifact):
    """A landscape, a portrait and a wide photo in one call: padded together to 224x224 (no
    static function for it), equal to eager's batched call image by image."""
    library, model = any_artifact
    batch = [_photo("coffee"), _photo("portrait"), _photo("wide")]
    images = [torch.from_numpy(r).permute(2, 0, 1).float() / 255.0 for r in batch]
    with torch.no_grad():
        refs = model(images)
    results = Detector(library)(batch)
    for ours, ref in zip(results, refs):
        assert ours["padded"] == (224, 224)
        ref = {k: v.numpy() for k, v in ref.items()}
        ref["masks"] = ref["masks"][:, 0]
        comparison = det.compare(ours, ref)
        assert comparison["passed"], comparison
        assert_matches_eager(ours, ref)


def test_any_size_artifact_refuses_what_it_cannot_serve(any_artifact):
    """A padded side below the function's bound (a build of the photo's size would serve it), and
    photos whose resized height makes torchvision's poolers infer other scales (130x400: 65 rows in
    96, where the stride-8 map of 12 rows gives 1/4, not 1/8; a 10x2000 strip: 1 row in 32), which
    no build serves: each refused with the reason, never run, the resized size torchvision's
    transform gives, and no rebuild hint that cannot work."""
    import torch

    library, model = any_artifact
    detector = Detector(library)

    def resized(height, width):  # torchvision's GeneralizedRCNNTransform, in eval
        with torch.no_grad():
            images, _ = model.eval().transform([torch.zeros(3, height, width)])
        return "x".join(str(s) for s in images.image_sizes[0])

    limit = 200 / 68  # the widest photo served: a resized height of 68 or more
    for (height, width), rows in (((130, 400), 96), ((10, 2000), 32), ((100, 600), 64)):
        with pytest.raises(ValueError) as info:
            detector(np.zeros((height, width, 3), np.uint8))
        message = str(info.value)
        assert message.startswith(f"a photo of {height}x{width} is resized by torchvision's transform "
                                  f"(min_size 160, max_size 200) to {resized(height, width)}, "
                                  f"padded to {rows}x"), message
        assert f"in {rows} rows, torchvision's poolers infer other scales" in message, message
        assert f"every photo at most {limit:.1f} times as wide as high is served" in message, message
        assert "--input-size" not in message
    with pytest.raises(ValueError, match=r"^a photo of 50x200 is padded to 64x224 .* accepts any "
                       r"padded size from 96 to 4096 pixels a side \(compile with --input-size "
                       r"50x200 for a build of that size\)"):
        detector(np.zeros((50, 200, 3), np.uint8))
    with pytest.raises(ValueError, match="no build serves it"):  # torchvision resizes it to 0 rows
        detector(np.zeros((10, 4000, 3), np.uint8))
