"""Running a compiled detector artifact with TVM's runtime, NumPy and Pillow only (no PyTorch).

An artifact is a library (``model.so``, from :func:`tvm_roialign.models.detection.compile_detector`
or ``tvm-roialign compile``) plus ``model.so.json``, its metadata (``"kind": "detector"``): the
input image size, the output names, the category names, the target. :class:`Detector` loads both
and, for an RGB photo, runs the artifact, keeps the first ``num_detections`` rows, maps the boxes
back to the photo if it had to be resized to the artifact's input size, and pastes the 28x28 masks
into the photo (:func:`~tvm_roialign.runtime.masks.paste_masks`). :func:`detect_to_files` draws the
result and writes it as JSON.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from .draw import draw_detections
from .masks import paste_masks

__all__ = [
    "METADATA_KIND",
    "Detector",
    "detect_to_files",
    "is_detector",
    "read_image",
    "read_metadata",
]

#: ``"kind"`` of a detector artifact's metadata.
METADATA_KIND = "detector"


def metadata_path(library) -> Path:
    return Path(str(library) + ".json")


def read_metadata(library) -> dict:
    """The metadata of a detector artifact; ValueError when there is none or it is not one."""
    path = metadata_path(library)
    if not path.is_file():
        raise ValueError(
            f"{str(library)!r} has no metadata file {path.name!r} next to it"
        )
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path.name!r} is not valid JSON: {err.msg}") from None
    if meta.get("kind") != METADATA_KIND:
        raise ValueError(
            f"{str(library)!r} is not a detector artifact (its metadata has no "
            f'"kind": "{METADATA_KIND}")'
        )
    return meta


def is_detector(library) -> bool:
    try:
        read_metadata(library)
    except ValueError:
        return False
    return True


def read_image(path) -> np.ndarray:
    """An RGB photo as ``[H, W, 3]`` uint8 (any format Pillow reads)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    except FileNotFoundError:
        raise FileNotFoundError(f"image {str(path)!r} does not exist") from None
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(
            f"image {str(path)!r} is not a readable image: {err}"
        ) from None


def _device(target: dict):
    import tvm

    kind = target.get("kind", "llvm")
    if kind == "llvm":
        import os

        triple = str(target.get("mtriple", ""))
        machine = os.uname().machine.replace("arm64", "aarch64")
        if triple and not triple.startswith(machine):
            raise ValueError(
                f"the artifact is built for {triple}; this machine is {machine}"
            )
        return tvm.cpu()
    device = tvm.device(kind, 0)
    if not device.exist:
        raise ValueError(
            f"the artifact is built for {kind}; this machine has no {kind} device"
        )
    return device


class Detector:
    """A compiled detector artifact, ready to run on photos.

    ``Detector(path)(rgb)`` returns ``boxes [n, 4]`` (x1, y1, x2, y2 in the photo's pixels),
    ``labels [n]`` int64, ``scores [n]``, and for Mask R-CNN ``masks [n, H, W]`` (probabilities
    pasted into the photo) and ``masks28 [n, M, M]`` (the artifact's own output), plus ``run_s``
    (the artifact) and ``total_s`` (with the NumPy steps). With a ``tvm.rpc`` ``session`` the
    artifact (a library built for that device) runs there, the NumPy steps here.
    """

    def __init__(self, library, session=None):
        import tvm
        from tvm import relax

        self.path = Path(library)
        if not self.path.is_file():
            raise FileNotFoundError(
                f"compiled detector {str(library)!r} does not exist"
            )
        self.meta = read_metadata(self.path)
        self.session = session
        if session is not None:  # a remote device (tvm.rpc): the NumPy steps stay here
            from ..remote import load_vm

            self.device = session.cpu(0)
            self.vm = load_vm(session, self.path, self.device)
        else:
            self.device = _device(self.meta.get("target", {}))
            self.vm = relax.VirtualMachine(
                tvm.runtime.load_module(str(self.path)), self.device
            )
        _, self.height, self.width = self.meta["input"]["shape"]
        self.outputs = list(self.meta["outputs"])
        self.names = self.meta.get("categories")

    def _input(self, rgb: np.ndarray) -> np.ndarray:
        rgb = np.asarray(rgb)
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
            raise ValueError(
                f"image must be [H, W, 3] uint8 RGB, got {rgb.dtype} {list(rgb.shape)}"
            )
        if rgb.shape[:2] != (self.height, self.width):
            from PIL import Image

            rgb = np.asarray(
                Image.fromarray(rgb).resize(
                    (self.width, self.height), Image.Resampling.BILINEAR
                )
            )
        # torchvision's to-tensor: uint8 / 255 in float32, channels first
        return np.ascontiguousarray(rgb.transpose(2, 0, 1)).astype(
            np.float32
        ) / np.float32(255)

    def raw(self, rgb: np.ndarray) -> dict:
        """The artifact's outputs by name (padded to the cap) and ``run_s``."""
        import tvm

        image = tvm.runtime.tensor(self._input(rgb), self.device)
        t0 = time.perf_counter()
        if self.session is not None:
            from ..remote import run_vm

            result = run_vm(self.vm, [image])
        else:
            result = self.vm["main"](image)
        arrays = dict(zip(self.outputs, (r.numpy() for r in result)))
        arrays["run_s"] = time.perf_counter() - t0
        return arrays

    def __call__(self, rgb: np.ndarray) -> dict:
        start = time.perf_counter()
        arrays = self.raw(rgb)
        run_s = arrays["run_s"]
        count = int(arrays["num_detections"][0])
        height, width = np.asarray(rgb).shape[:2]
        boxes = arrays["boxes"][0, :count]
        if (height, width) != (self.height, self.width):
            boxes = boxes * np.array(
                [width / self.width, height / self.height] * 2, np.float32
            )
        out = {
            "boxes": boxes,
            "labels": arrays["labels"][0, :count],
            "scores": arrays["scores"][0, :count],
        }
        if "masks" in arrays:
            out["masks28"] = arrays["masks"][0, :count]
            out["masks"] = paste_masks(out["masks28"], boxes, height, width)
        out["run_s"] = run_s
        out["total_s"] = time.perf_counter() - start
        return out

    def name_of(self, label: int) -> str:
        names = self.names
        return names[label] if names and 0 <= label < len(names) else str(label)


def detect_to_files(
    library,
    image_path,
    out_image=None,
    out_json=None,
    top: int = 8,
    mask_threshold: float = 0.5,
    session=None,
) -> dict:
    """Run the artifact on a photo (on the remote device of a ``tvm.rpc`` ``session`` if given);
    draw the ``top`` detections into ``out_image`` and write all of them to ``out_json``.
    Returns the JSON-able summary."""
    detector = Detector(library, session)
    rgb = read_image(image_path)
    result = detector(rgb)
    meta = detector.meta
    summary = {
        "model": meta.get("model"),
        "library": str(library),
        "image": str(image_path),
        "image_size": list(rgb.shape[:2]),
        "input_size": [detector.height, detector.width],
        "target": meta.get("target"),
        "run_ms": result["run_s"] * 1e3,
        "total_ms": result["total_s"] * 1e3,
        "num_detections": len(result["boxes"]),
        "detections": [
            {
                "label": int(label),
                "name": detector.name_of(int(label)),
                "score": float(score),
                "box": [float(v) for v in box],
                **(
                    {"mask_pixels": int((result["masks"][i] > mask_threshold).sum())}
                    if "masks" in result
                    else {}
                ),
            }
            for i, (box, label, score) in enumerate(
                zip(result["boxes"], result["labels"], result["scores"])
            )
        ],
    }
    if out_image is not None:
        target = meta.get("target") or {}
        where = " ".join(str(target[k]) for k in ("kind", "mcpu") if target.get(k))
        caption = (
            f"{meta.get('model') or Path(library).name}: {summary['num_detections']} "
            f"detections, {summary['run_ms']:.0f} ms ({where or '?'})"
        )
        draw_detections(rgb, result, detector.names, top, mask_threshold, caption).save(
            out_image
        )
    if out_json is not None:
        Path(out_json).write_text(json.dumps(summary, indent=2))
    return summary
