"""Deployment without Python: the artifact's ``detect_photo`` (torchvision's transform and
postprocess in the graph) and the C++ program of examples/cpp that runs it with TVM's runtime alone.

* the in-graph transform against torchvision's ``GeneralizedRCNNTransform``: the resized size of
  every photo size of a grid under three resize settings, and the resized, normalized, padded
  tensor bit for bit on odd sizes;
* the C++ program (built with CMake against the apache-tvm wheel; skipped where no C++ compiler or
  CMake is found) on the astronaut, coffee and a portrait photo against the Python runner
  (:class:`tvm_roialign.runtime.Detector`): same labels, boxes within 1e-3 px, masks at least
  99.99% equal, keypoints within 1e-3 px (a Keypoint R-CNN with COCO's 17 keypoints);
* marked ``board``: the same program cross-built for aarch64 (examples/cpp/aarch64-linux-gnu.cmake,
  the board's own TVM wheels) running the tiny Mask R-CNN built for ``--target aarch64`` on the
  emulated board of ``tools/arm_board.sh`` (qemu-user), against the Python runner of the model built
  for this machine under the same criteria (skipped without the board's root, the cross compiler or
  qemu).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
import tvm
from _board import board_root, qemu_aarch64, require_cross_cxx, require_cross_linker
from PIL import Image
from torchvision.models.detection.transform import GeneralizedRCNNTransform, _resize_image_and_masks
from tvm import relax

from tvm_roialign.frontend.static_rcnn import torch_bilinear_fused
from tvm_roialign.models import detection as det
from tvm_roialign.models.detector_photo import transform_photo
from tvm_roialign.runtime import Detector
from tvm_roialign.runtime.transform import TransformSettings
from tvm_roialign.topi import photo as kernels

REPO = Path(__file__).resolve().parents[1]
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
#: (min_size, max_size): the tiny test models', the package's default and torchvision's own.
RESIZES = [(160, 200), (512, 512), (800, 1333)]


# --------------------------------------------------------------------------------------------------
# the transform in the graph against torchvision's


def _transform_module(min_size: int, max_size: int):
    """A module of ``sizes(photo)`` (the resized size) and ``transform(photo)`` (the network's
    input), built for this CPU, and torchvision's transform of the same settings."""
    transform = GeneralizedRCNNTransform(min_size, max_size, MEAN, STD)
    settings = TransformSettings.of(transform, torch_bilinear_fused(30, 57))
    meta = {"any_size": {"min_side": 32, "max_side": 4096, "pooler_strides": [], "pooler_scales": []}}
    bb = relax.BlockBuilder()
    height, width = tvm.tirx.Var("h", "int64"), tvm.tirx.Var("w", "int64")
    for name in ("sizes", "transform"):
        photo = relax.Var("photo", relax.TensorType([height, width, 3], "uint8"))
        with bb.function(name, [photo]):
            if name == "sizes":
                out = bb.emit_te(kernels.resized_size, photo, min_size, max_size)
            else:
                out = transform_photo(bb, photo, {**meta, "transform": settings.to_dict()}, settings)[0]
            bb.emit_func_output(out)
    executable = tvm.compile(bb.get(), target=tvm.target.Target({"kind": "llvm"}))
    return relax.VirtualMachine(executable, tvm.cpu()), transform


@pytest.fixture(scope="session", params=RESIZES, ids=lambda r: f"{r[0]}-{r[1]}")
def transform_module(request):
    return _transform_module(*request.param)


def test_resized_size_is_torchvisions_on_a_grid(transform_module, monkeypatch):
    """Every (H, W) of a grid of sides from 33 to 1400 (steps of 29, squares included): the
    graph's resized size is the one torchvision's resize gives (its scale and PyTorch's
    ``interpolate`` output size; the bilinear kernel itself is replaced by an empty tensor of the
    size it is asked for, to keep the grid quick)."""
    vm, transform = transform_module

    def sized(image, output_size, align_corners, scale_factors):
        return torch.empty(*image.shape[:2], *output_size)

    monkeypatch.setattr(torch._C._nn, "upsample_bilinear2d", sized)
    sides = list(range(33, 1401, 29))
    for height in sides:
        for width in sides:
            image = torch.empty(1, height, width)
            resized, _ = _resize_image_and_masks(image, transform.min_size[-1], transform.max_size)
            ours = vm["sizes"](tvm.runtime.empty((height, width, 3), "uint8")).numpy()
            assert tuple(ours) == tuple(resized.shape[-2:]), (height, width)


@pytest.mark.parametrize("size", [(37, 211), (333, 97), (401, 599), (512, 512), (1001, 777)])
def test_transform_is_torchvisions_bit_for_bit(transform_module, size):
    """Odd photo sizes, random pixels: the graph's normalized, resized, zero-padded image equals
    torchvision's ``GeneralizedRCNNTransform`` output (``images.tensors``) exactly."""
    vm, transform = transform_module
    rgb = np.random.default_rng(sum(size)).integers(0, 256, (*size, 3), dtype=np.uint8)
    with torch.no_grad():
        images, _ = transform.eval()([torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0])
    ours = vm["transform"](tvm.runtime.tensor(rgb)).numpy()
    np.testing.assert_array_equal(ours, images.tensors.numpy())


# --------------------------------------------------------------------------------------------------
# the C++ program against the Python runner


def _missing_tools() -> str | None:
    if shutil.which("cmake") is None:
        return "no cmake on PATH"
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        return "no C++ compiler (c++, g++, clang++) on PATH"
    return None


@pytest.fixture(scope="session")
def cpp_program(tmp_path_factory):
    """The C++ program of examples/cpp, built with CMake in a temporary folder."""
    missing = _missing_tools()
    if missing:
        pytest.skip(missing)
    return _build(tmp_path_factory.mktemp("cpp"))


def _build(build: Path, *options: str) -> Path:
    """The program of examples/cpp built with CMake in ``build`` (``options``: more -D settings)."""
    configure = ["cmake", "-S", str(REPO / "examples" / "cpp"), "-B", str(build),
                 f"-DPython_EXECUTABLE={sys.executable}", *options]
    for command in (configure, ["cmake", "--build", str(build)]):
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    return build / "detect"


def _photo(name: str) -> np.ndarray:
    if name == "portrait":
        return np.ascontiguousarray(np.rot90(det.sample_photo("coffee")))
    return det.sample_photo(name)


def _decode(runs, size) -> np.ndarray:
    """A mask from the program's run lengths (row-major, starting with zeros)."""
    values = np.arange(len(runs)) % 2
    mask = np.repeat(values.astype(np.uint8), runs)
    assert mask.size == size
    return mask


@pytest.mark.parametrize("name", ["astronaut", "coffee", "portrait"])
def test_cpp_program_equals_the_python_runner(cpp_program, tiny_any_detector, tmp_path, name):
    library, _ = tiny_any_detector
    rgb = _photo(name)
    _assert_equals_the_python_runner(_run(cpp_program, library, rgb, tmp_path), library, rgb)


def _assert_equals_the_python_runner(ours: dict, library, rgb) -> None:
    """The program's result ``ours`` against the Python runner of ``library`` (this machine's)."""
    ref = Detector(library)(rgb)
    found = ours["detections"]
    assert ours["image_size"] == list(rgb.shape[:2])
    assert len(found) == len(ref["labels"]) > 0
    np.testing.assert_array_equal([d["label"] for d in found], ref["labels"])
    np.testing.assert_allclose([d["box"] for d in found], ref["boxes"], rtol=0, atol=1e-3)
    np.testing.assert_allclose([d["score"] for d in found], ref["scores"], rtol=0, atol=1e-6)
    for d, mask in zip(found, ref["masks"]):
        pasted = _decode(d["mask_rle"], mask.size).reshape(mask.shape)
        assert d["mask_pixels"] == int(pasted.sum())
        assert (pasted == (mask > 0.5)).mean() >= 0.9999


def _run(program, library, rgb, folder: Path) -> dict:
    """The program's result on ``rgb``; ``program``: its path, or a command list ending in it."""
    photo = folder / "photo.ppm"
    Image.fromarray(rgb).save(photo)
    out = folder / "result.json"
    command = [str(part) for part in (program if isinstance(program, list) else [program])]
    done = subprocess.run([*command, str(library), str(photo), str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", ["coffee", "portrait"])
def test_cpp_program_keypoints_equal_the_python_runner(
    cpp_program, tiny_keypoint_detector, tmp_path, name
):
    library, _ = tiny_keypoint_detector
    rgb = _photo(name)
    found = _run(cpp_program, library, rgb, tmp_path)["detections"]
    ref = Detector(library)(rgb)
    assert len(found) == len(ref["labels"]) > 0
    np.testing.assert_array_equal([d["label"] for d in found], ref["labels"])
    np.testing.assert_allclose([d["box"] for d in found], ref["boxes"], rtol=0, atol=1e-3)
    ours = np.array([d["keypoints"] for d in found])
    assert ours.shape == (len(found), 17, 3)
    np.testing.assert_allclose(ours[..., :2], ref["keypoints"][..., :2], rtol=0, atol=1e-3)
    np.testing.assert_allclose(ours[..., 2], ref["keypoints_scores"], rtol=0, atol=1e-5)


def test_cpp_program_refuses_a_photo_out_of_bounds(cpp_program, tiny_any_detector, tmp_path):
    """50x200 is padded to 64x224, under the function's 96-pixel side: an error naming the sizes
    served, no result, and no rebuild hint this program could follow (a build of one size has no
    detect_photo). 100x600 and a 10x2000 strip resize to heights where torchvision's poolers infer
    other scales (33 rows in 64, 1 in 32): refused as no build serves them, with the widest photo
    served; the sizes are those torchvision's transform gives, the text the Python runner's."""
    library, model = tiny_any_detector
    photo = tmp_path / "wide.ppm"
    Image.fromarray(np.zeros((50, 200, 3), np.uint8)).save(photo)
    line = _refusal(cpp_program, library, photo)
    assert "photo 50x200" in line and "padded to 64x224" in line and "from 96 to 4096" in line, line
    assert "runs under tvm-roialign run --image, not here" in line, line
    detector = Detector(library)
    for height, width in ((100, 600), (10, 2000)):
        Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(photo)
        line = _refusal(cpp_program, library, photo)
        with torch.no_grad():
            images, _ = model.eval().transform([torch.zeros(3, height, width)])
        resized = "x".join(str(s) for s in images.image_sizes[0])
        assert f"resizes it to {resized}, padded to" in line and "no build serves it" in line, line
        assert "--input-size" not in line, line
        with pytest.raises(ValueError) as info:
            detector(np.zeros((height, width, 3), np.uint8))
        python = str(info.value).split(f"to {resized}, ", 1)[1]
        assert line.endswith(python), (line, python)


def _refusal(program, library, photo: Path, *out: str) -> str:
    done = subprocess.run([str(program), str(library), str(photo), *out], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == "", (done.returncode, done.stderr[-500:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("detect: error:"), done.stderr[-500:]
    return lines[0]


def test_cpp_program_refuses_a_bad_library_or_output_in_one_line(cpp_program, tiny_any_detector, tmp_path):
    """A truncated library (its size not the one its .so.json records), one built for aarch64 and a
    result file that cannot be written: one line each, where dlopen would die of a bus error, say
    the file does not exist, or the program would exit 0 having written nothing."""
    library, _ = tiny_any_detector
    photo = tmp_path / "photo.ppm"
    Image.fromarray(_photo("astronaut")).save(photo)
    data = Path(library).read_bytes()
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(data[: len(data) // 3])
    Path(f"{truncated}.json").write_text(Path(f"{library}.json").read_text())
    assert "truncated" in _refusal(cpp_program, truncated, photo)
    foreign = bytearray(data[:4096])
    foreign[18:20] = (183).to_bytes(2, "little")  # e_machine: EM_AARCH64
    arm = tmp_path / "arm.so"
    arm.write_bytes(bytes(foreign))
    assert "built for aarch64" in _refusal(cpp_program, arm, photo)
    assert "cannot write" in _refusal(cpp_program, library, photo, str(tmp_path / "missing" / "r.json"))


# --------------------------------------------------------------------------------------------------
# the same program cross-built for aarch64, on the emulated board


@pytest.fixture(scope="session")
def board_program(tmp_path_factory):
    """The command running the program, cross-built for aarch64 against the board's own wheels, on
    the emulated board (qemu-user with the board's root as its file system)."""
    root = board_root()
    missing = _missing_tools()
    if missing:
        pytest.skip(missing)
    require_cross_cxx()
    qemu = qemu_aarch64()
    packages = sorted((root / "opt" / "tvm" / "lib").glob("python3*/site-packages"))[-1]
    program = _build(
        tmp_path_factory.mktemp("cpp-aarch64"),
        f"-DCMAKE_TOOLCHAIN_FILE={REPO / 'examples' / 'cpp' / 'aarch64-linux-gnu.cmake'}",
        f"-DTVM_TARGET_ROOT={root}",
        f"-DTVM_TARGET_PACKAGES=/{packages.relative_to(root)}",
    )
    return [qemu, "-L", str(root), str(program)]


@pytest.fixture(scope="session")
def tiny_any_detector_aarch64(tmp_path_factory):
    """The model of ``tiny_any_detector`` compiled for ``--target aarch64`` and cross-linked."""
    require_cross_linker()
    from _tiny_rcnn import tiny_rcnn

    model = tiny_rcnn(masks=True, seed=1, detections_per_img=12)
    artifact = det.compile_detector(model, target="aarch64", fast=False)
    assert artifact.meta["photo_function"]["function"] == "detect_photo"
    return artifact.export(tmp_path_factory.mktemp("aarch64") / "tiny_any_aarch64.so")


@pytest.mark.board
@pytest.mark.parametrize("name", ["astronaut", "coffee"])
def test_cpp_program_on_the_board_equals_the_python_runner(
    board_program, tiny_any_detector_aarch64, tiny_any_detector, tmp_path, name
):
    """The program and the artifact, both built for aarch64, on the emulated board: the Python
    runner's detections of the same model built for this machine."""
    rgb = _photo(name)
    ours = _run(board_program, tiny_any_detector_aarch64, rgb, tmp_path)
    _assert_equals_the_python_runner(ours, tiny_any_detector[0], rgb)


def test_cmake_takes_python3_executable(tmp_path):
    """FindPython3's ``-DPython3_EXECUTABLE`` picks the Python whose TVM wheel the program builds
    against, as ``-DPython_EXECUTABLE`` does (configured only; PATH without this Python on it)."""
    missing = _missing_tools()
    if missing:
        pytest.skip(missing)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        ["cmake", "-S", str(REPO / "examples" / "cpp"), "-B", str(tmp_path / "build"),
         f"-DPython3_EXECUTABLE={sys.executable}"],
        capture_output=True, text=True, env=env,
    )
    assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-1000:]
    cache = (tmp_path / "build" / "CMakeCache.txt").read_text()
    assert f"Python_EXECUTABLE:INTERNAL={sys.executable}" in cache
