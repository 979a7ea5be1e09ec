"""Every file ``run`` and ``maskrcnn`` load is checked first: one line naming the file and what is
wrong with it.

Libraries: ``compile`` records the library's size and sha256 in ``LIB.json`` (compared here with
``hashlib``); a truncated or corrupted library, a missing, unparsable or record-less ``LIB.json``
are refused before TVM loads anything, and ``--no-verify`` / ``verify=False`` loads a library
built elsewhere. Photos: a decompression bomb (a PNG header claiming 20000x20000 pixels, nothing
decoded), a truncated file, a non-image and float pixels are refused; 16-bit, palette, grey+alpha,
CMYK, 1-bit and RGBA pictures are read as torchvision's ``read_image(..., ImageReadMode.RGB)``
reads them. Several photos in one ``run``: each gets its own picture and JSON.

The model is a one-layer torch model (compiled in seconds); the detector is a hand-made Relax
function with a detector's signature and outputs (no detector compile), with its metadata
written here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from _cli import one_line_error, run_cli
from torchvision.io import ImageReadMode
from torchvision.io import read_image as tv_read_image
from torchvision.transforms.v2 import functional as tv_functional

from tvm_roialign import cli
from tvm_roialign.runtime import Detector, read_image
from tvm_roialign.runtime.artifact_check import ArtifactError
from tvm_roialign.runtime.draw import MIN_CAPTION_WIDTH, picture_scale


class _Affine(torch.nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("cli_inputs")


@pytest.fixture(scope="module")
def model_lib(workdir):
    """``(library, inputs.npz, expected output)`` of a one-layer torch model compiled by ``compile``."""
    x = np.random.default_rng(0).standard_normal((1, 8)).astype("float32")
    pt2 = workdir / "affine.pt2"
    torch.export.save(torch.export.export(_Affine(), (torch.from_numpy(x),)), str(pt2))
    inputs = workdir / "affine_in.npz"
    np.savez(inputs, x=x)
    lib = workdir / "affine.so"
    assert cli.main(["-q", "compile", str(pt2), "-o", str(lib)]) == 0
    return lib, inputs, x * 2.0 + 1.0


def _copy(lib, folder, name="m.so", meta=True):
    """``lib`` (and its ``.json`` with ``meta``) copied into ``folder`` as ``name``."""
    folder.mkdir(exist_ok=True)
    target = folder / name
    shutil.copy(lib, target)
    if meta:
        shutil.copy(f"{lib}.json", f"{target}.json")
    return target


def _meta(lib) -> dict:
    return json.loads(open(f"{lib}.json").read())


def _write_meta(lib, meta) -> None:
    with open(f"{lib}.json", "w") as fh:
        json.dump(meta, fh)


# ---------------------------------------------------------------------------------------------
# libraries


def test_compile_records_size_and_sha256(model_lib):
    lib, _, _ = model_lib
    record = _meta(lib)["library"]
    data = lib.read_bytes()
    assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_run_refuses_a_truncated_library(model_lib, tmp_path, capsys):
    lib, inputs, _ = model_lib
    cut = _copy(lib, tmp_path)
    cut.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])
    code, _, err = run_cli(["run", str(cut), "--inputs", str(inputs)], capsys)
    assert code == 1
    one_line_error(err, str(cut), "bytes", "truncated")


def test_no_verify_still_refuses_a_truncated_elf(model_lib, tmp_path, capsys):
    """Without the record, the ELF headers pointing past the end of the file (a bus error in
    the loader)."""
    lib, inputs, _ = model_lib
    cut = _copy(lib, tmp_path, meta=False)
    cut.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])
    code, _, err = run_cli(["run", str(cut), "--inputs", str(inputs), "--inputs-by-order",
                            "--no-verify"], capsys)
    assert code == 1
    one_line_error(err, str(cut), "cut short", "ELF")


def test_no_verify_names_the_loaders_reason_for_a_file_that_is_no_library(model_lib, tmp_path, capsys):
    """A text file named ``.so``: the dynamic loader's reason, without TVM's internal check."""
    _, inputs, _ = model_lib
    fake = tmp_path / "fake.so"
    fake.write_text("not a library\n")
    code, _, err = run_cli(["run", str(fake), "--inputs", str(inputs), "--inputs-by-order",
                            "--no-verify"], capsys)
    assert code == 1
    one_line_error(err, str(fake), "not a shared library this machine can load")
    assert "Check failed" not in err


def test_run_refuses_a_corrupted_library_of_the_same_size(model_lib, tmp_path, capsys):
    lib, inputs, _ = model_lib
    bad = _copy(lib, tmp_path)
    data = bytearray(lib.read_bytes())
    middle = len(data) // 2
    data[middle: middle + 16] = bytes(b ^ 0xFF for b in data[middle: middle + 16])
    bad.write_bytes(bytes(data))
    code, _, err = run_cli(["run", str(bad), "--inputs", str(inputs)], capsys)
    assert code == 1
    one_line_error(err, str(bad), "sha256", "corrupted")


def test_run_refuses_a_library_without_json(model_lib, tmp_path, capsys):
    lib, inputs, _ = model_lib
    bare = _copy(lib, tmp_path, meta=False)
    code, _, err = run_cli(["run", str(bare), "--inputs", str(inputs)], capsys)
    assert code == 1
    one_line_error(err, str(bare), "no metadata file", "m.so.json", "--no-verify")


def test_run_refuses_json_without_the_record(model_lib, tmp_path, capsys):
    lib, inputs, _ = model_lib
    old = _copy(lib, tmp_path)
    _write_meta(old, {k: v for k, v in _meta(lib).items() if k != "library"})
    code, _, err = run_cli(["run", str(old), "--inputs", str(inputs)], capsys)
    assert code == 1
    one_line_error(err, f"{old}.json", "no size and sha256", "--no-verify")


@pytest.mark.parametrize(
    "text, words",
    [("{not json", ["not valid JSON", "line 1"]), ("[1, 2]", ["JSON list", "not the object"])],
)
def test_run_refuses_a_json_that_is_not_an_object(model_lib, tmp_path, capsys, text, words):
    lib, inputs, _ = model_lib
    broken = _copy(lib, tmp_path)
    open(f"{broken}.json", "w").write(text)
    for extra in ([], ["--no-verify"]):  # the file is read either way
        code, _, err = run_cli(["run", str(broken), "--inputs", str(inputs), *extra], capsys)
        assert code == 1
        one_line_error(err, f"{broken}.json", *words)


def test_run_refuses_a_folder_as_library(tmp_path, capsys):
    folder = tmp_path / "lib.so"
    folder.mkdir()
    code, _, err = run_cli(["run", str(folder)], capsys)
    assert code == 1
    one_line_error(err, str(folder), "is a folder")


def test_no_verify_loads_a_library_built_elsewhere(model_lib, tmp_path, capsys):
    """``--no-verify``: a library without ``.json`` (inputs by order) and one whose ``.json``
    lacks the record run, and give the eager result."""
    lib, inputs, expected = model_lib
    bare = _copy(lib, tmp_path / "bare", meta=False)
    old = _copy(lib, tmp_path / "old")
    _write_meta(old, {k: v for k, v in _meta(lib).items() if k != "library"})
    for argv in (
        ["run", str(bare), "--inputs", str(inputs), "--inputs-by-order", "--no-verify"],
        ["run", str(old), "--inputs", str(inputs), "--no-verify"],
    ):
        outputs = tmp_path / "out.npz"
        code, _, err = run_cli([*argv, "--outputs", str(outputs)], capsys)
        assert code == 0, err
        with np.load(outputs) as result:
            np.testing.assert_allclose(result["output_0"], expected, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# the detector: a Relax function with a detector's signature, and its metadata


def _fake_detector_module():
    """``detect_160x160(images [1, 3, 160, 160], image_size [2])``: two boxes, the first scored
    with the images' mean, labels 1 and 2."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    images = relax.Var("images", relax.TensorType([1, 3, 160, 160], "float32"))
    size = relax.Var("image_size", relax.TensorType([2], "float32"))
    with bb.function("detect_160x160", [images, size]):
        with bb.dataflow():
            boxes = relax.const(np.array([[[8, 8, 40, 40], [16, 16, 80, 60]]], "float32"))
            mean = bb.emit(relax.op.reshape(relax.op.mean(images), (1, 1)))
            scores = bb.emit(relax.op.concat([mean, relax.const(np.full((1, 1), 0.5, "float32"))], 1))
            labels = relax.const(np.array([[1, 2]], "int64"))
            count = relax.const(np.array([2], "int64"))
            out = bb.emit_output(relax.Tuple([boxes, scores, labels, count]))
        bb.emit_func_output(out)
    return tvm.compile(bb.get(), target="llvm")


@pytest.fixture(scope="module")
def detector_lib(workdir):
    lib = workdir / "fake_detector.so"
    _fake_detector_module().export_library(str(lib))
    data = lib.read_bytes()
    meta = {
        "kind": "detector",
        "model": "fake",
        "outputs": ["boxes", "scores", "labels", "num_detections"],
        "buckets": [{"padded": [160, 160], "function": "detect_160x160", "min_resized_height": 0}],
        "transform": {
            "min_size": 160,
            "max_size": 200,
            "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225],
            "size_divisible": 32,
            "resize_fma": True,
        },
        "categories": None,
        "target": {"kind": "llvm"},
        "library": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
    }
    _write_meta(lib, meta)
    return lib


def _photo(path, seed, size=(120, 120)):
    rgb = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(path)
    return path


def test_detector_runs_every_photo_given(detector_lib, tmp_path, capsys):
    """``--image a b`` and ``--image a --image b``: one picture and one JSON per photo, named
    after it; photos of the same name get their position too."""
    a, b = _photo(tmp_path / "a.png", 1), _photo(tmp_path / "b.png", 2, (130, 130))
    out = tmp_path / "r.png"
    for images in (["--image", str(a), str(b)], ["--image", str(a), "--image", str(b)]):
        code, stdout, err = run_cli(["run", str(detector_lib), *images, "--out", str(out)], capsys)
        assert code == 0, err
        assert stdout.count("2 detections in") == 2, stdout
        for photo, shape in ((a, [120, 120]), (b, [130, 130])):
            report = json.loads((tmp_path / f"r_{photo.stem}.json").read_text())
            assert report["image"] == str(photo) and report["image_size"] == shape
            # a photo under 128 pixels a side is drawn scaled up, its caption at least 320 wide
            width = max(shape[1] * picture_scale(*shape), MIN_CAPTION_WIDTH)
            assert Image.open(tmp_path / f"r_{photo.stem}.png").width == width
    twin = _photo(tmp_path / "other" / "a.png", 3)
    code, _, err = run_cli(["run", str(detector_lib), "--image", str(a), str(twin), "--out", str(out)],
                           capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "r_1_a.json").read_text())["image"] == str(a)
    assert json.loads((tmp_path / "r_2_a.json").read_text())["image"] == str(twin)


def test_detector_print_time(detector_lib, tmp_path, capsys):
    a, b = _photo(tmp_path / "a.png", 1), _photo(tmp_path / "b.png", 2)
    code, stdout, err = run_cli(
        ["run", str(detector_lib), "--image", str(a), str(b), "--out", str(tmp_path / "r.png"),
         "--print-time", "--repeat", "3", "--number", "2"],
        capsys,
    )
    assert code == 0, err
    assert "timed: the detector artifact incl. its NumPy pre- and post-processing" in stdout, stdout
    assert "all 2 photos, one artifact call each" in stdout, stdout
    assert "Execution time summary (3 measurement(s) of 2 call(s)" in stdout, stdout


def test_detector_bad_combinations(detector_lib, model_lib, tmp_path, capsys):
    a = _photo(tmp_path / "a.png", 1)
    lib, inputs, _ = model_lib
    out = str(tmp_path / "r.png")
    cases = [
        (["run", str(detector_lib), "--image", str(a), "--inputs", str(inputs), "--out", out],
         ["--inputs", "detector library"]),
        (["run", str(detector_lib), "--image", str(a), "--print-top", "3", "--out", out],
         ["--print-top", "detector library"]),
        (["run", str(detector_lib), "--image", str(a), "--repeat", "0", "--out", out], ["--repeat"]),
        (["run", str(lib), "--image", str(a), "--out", out], ["not a detector artifact"]),
        (["run", str(detector_lib), "--print-time"], ["detector library", "--image PHOTO"]),
    ]
    for argv, words in cases:
        code, _, err = run_cli(argv, capsys)
        assert code == 1, (argv, err)
        one_line_error(err, *words)
    code, _, err = run_cli(["run", "--image", str(a), str(detector_lib)], capsys)
    assert code == 2  # command-line syntax
    one_line_error(err, "--image", str(detector_lib), "give the library first")
    assert not (tmp_path / "r.png").exists()


def test_detector_library_checked_in_python(detector_lib, tmp_path):
    cut = _copy(detector_lib, tmp_path)
    cut.write_bytes(detector_lib.read_bytes()[:1000])
    with pytest.raises(ArtifactError, match="truncated"):
        Detector(cut)
    unrecorded = _copy(detector_lib, tmp_path / "old")
    _write_meta(unrecorded, {k: v for k, v in _meta(detector_lib).items() if k != "library"})
    with pytest.raises(ArtifactError, match=r"no size and sha256.*verify=False"):
        Detector(unrecorded)
    rgb = np.zeros((120, 120, 3), np.uint8)
    assert len(Detector(unrecorded, verify=False)(rgb)["boxes"]) == 2


# ---------------------------------------------------------------------------------------------
# photos


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png(path, width, height, depth, colour, rows: bytes):
    """A PNG written byte by byte (Pillow writes no 48-bit RGB, nor lies about its size)."""
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows))
        + _chunk(b"IEND", b"")
    )
    return path


def test_decompression_bomb_is_one_line(detector_lib, tmp_path, capsys):
    """A header claiming 20000x20000 pixels (the file is a few bytes: nothing is decoded)."""
    bomb = _png(tmp_path / "bomb.png", 20000, 20000, 8, 2, b"")
    limit = f"{Image.MAX_IMAGE_PIXELS:,}"
    code, _, err = run_cli(["run", str(detector_lib), "--image", str(bomb), "--out",
                            str(tmp_path / "r.png")], capsys)
    assert code == 1
    one_line_error(err, "--image", str(bomb), "400,000,000 pixels", limit, "decompression-bomb")
    code, _, err = run_cli(["maskrcnn", "--image", str(bomb), "--out", str(tmp_path / "m.png")],
                           capsys)
    assert code == 1
    one_line_error(err, "--image", "400,000,000 pixels", limit)


def test_16_bit_pngs_read_as_torchvision(tmp_path):
    """16-bit grey (Pillow's I;16) and 16-bit RGB: torchvision's uint16 image scaled to uint8."""
    rng = np.random.default_rng(5)
    grey = rng.integers(0, 65536, (6, 9), dtype=np.uint16)
    Image.fromarray(grey).save(tmp_path / "grey16.png")
    rgb = rng.integers(0, 65536, (6, 9, 3), dtype=np.uint16)
    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in rgb)
    _png(tmp_path / "rgb16.png", 9, 6, 16, 2, rows)
    for name in ("grey16.png", "rgb16.png"):
        reference = tv_read_image(str(tmp_path / name), ImageReadMode.RGB)
        assert reference.dtype == torch.uint16
        expected = tv_functional.to_dtype(reference, torch.uint8, scale=True).permute(1, 2, 0)
        np.testing.assert_array_equal(read_image(tmp_path / name), expected.numpy())


@pytest.mark.parametrize("mode, suffix", [("P", ".png"), ("LA", ".png"), ("CMYK", ".jpg"),
                                          ("1", ".png"), ("RGBA", ".png"), ("L", ".png")])
def test_other_modes_read_as_torchvision(tmp_path, mode, suffix):
    rng = np.random.default_rng(6)
    source = Image.fromarray(rng.integers(0, 256, (6, 9, 4), dtype=np.uint8), "RGBA")
    picture = (source if "A" in mode else source.convert("RGB")).convert(mode)
    path = tmp_path / f"photo{suffix}"
    picture.save(path)
    assert Image.open(path).mode == mode
    expected = tv_read_image(str(path), ImageReadMode.RGB).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(read_image(path), expected)


def test_bad_photos_are_one_line(detector_lib, tmp_path, capsys):
    text = tmp_path / "notes.png"
    text.write_text("not a picture")
    good = _photo(tmp_path / "good.png", 1)
    cut = tmp_path / "cut.png"
    cut.write_bytes(good.read_bytes()[:200])
    floats = tmp_path / "floats.tif"
    Image.fromarray(np.zeros((8, 8), np.float32)).save(floats)
    out = str(tmp_path / "r.png")
    cases = [
        (text, ["not a readable image"]),
        (cut, ["truncated or corrupt"]),
        (floats, ["32-bit float", "'F'"]),
        (tmp_path, ["is a folder"]),
        (tmp_path / "missing.png", ["does not exist"]),
    ]
    for photo, words in cases:
        # the bad photo second: nothing is written for the good one before it
        code, _, err = run_cli(["run", str(detector_lib), "--image", str(good), str(photo),
                                "--out", out], capsys)
        assert code == 1, (photo, err)
        one_line_error(err, "--image", str(photo), *words)
    assert not list(tmp_path.glob("r_*"))


def test_detector_run_names_the_weights(detector_lib, tmp_path, capsys, monkeypatch):
    """``run --image`` gives the weights' origin the metadata records in its line, its JSON and
    the picture's caption; an artifact that records none says nothing of them."""
    from tvm_roialign.runtime import detector as runtime_detector

    captions = []
    draw = runtime_detector.draw_detections

    def recording_draw(*args, **kwargs):
        captions.append(args[5])
        return draw(*args, **kwargs)

    monkeypatch.setattr(runtime_detector, "draw_detections", recording_draw)
    photo = _photo(tmp_path / "a.png", 1)
    for weights in ("random, seed 7", "coco.pth, sha256 0123456789ab", None):
        lib = _copy(detector_lib, tmp_path / str(len(captions)))
        meta = _meta(lib)
        if weights is not None:
            meta["weights"] = weights
        _write_meta(lib, meta)
        out = tmp_path / f"r{len(captions)}.png"
        code, stdout, err = run_cli(["run", str(lib), "--image", str(photo), "--out", str(out)], capsys)
        assert code == 0, err
        report = json.loads(out.with_suffix(".json").read_text())
        assert report["weights"] == weights
        if weights is None:
            assert "weights" not in stdout and "weights" not in captions[-1], (stdout, captions)
        else:
            assert f"(exact build; weights {weights}) ->" in stdout, stdout
            assert captions[-1].endswith(f"; weights {weights}"), captions


def test_run_image_takes_a_sample_photos_name_and_says_what_it_takes(tmp_path, monkeypatch):
    """``run --image astronaut`` where no such file exists: the sample photo (what a new user
    tried); a missing file's one line names both forms."""
    from tvm_roialign.cli._common import CLIError
    from tvm_roialign.cli._photos import read_photos
    from tvm_roialign.runtime.sample_photos import sample_photo

    monkeypatch.chdir(tmp_path)
    [photo] = read_photos(["astronaut"])
    np.testing.assert_array_equal(photo, sample_photo("astronaut"))
    missing = r"--image: image 'missing.jpg' does not exist \(a photo file .*astronaut"
    with pytest.raises(CLIError, match=missing):
        read_photos(["missing.jpg"])
    # a file of a sample's name is the file
    Image.fromarray(np.full((40, 50, 3), 7, np.uint8)).save(tmp_path / "coffee", format="PNG")
    [own] = read_photos(["coffee"])
    assert own.shape == (40, 50, 3) and (own == 7).all()
