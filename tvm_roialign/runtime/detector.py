"""Running a compiled detector artifact with TVM's runtime, NumPy and Pillow only (no PyTorch).

An artifact is a library (``model.so``, from :func:`tvm_roialign.models.detection.compile_detector`
or ``tvm-roialign compile``) plus ``model.so.json``, its metadata (``"kind": "detector"``): the
padded image sizes it serves, torchvision's transform settings, the output names, the category
names, the target. :class:`Detector` loads both and, for an RGB photo (or a batch of them), does
torchvision's transform in NumPy (:mod:`~tvm_roialign.runtime.transform`), runs the artifact's
function for the padded size, keeps the first ``num_detections`` rows, maps the boxes back to the
photo as torchvision's postprocess does, and pastes the 28x28 masks into the photo
(:func:`~tvm_roialign.runtime.masks.paste_masks`). :func:`detect_to_files` draws the
result and writes it as JSON.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ..host import host_machine, is_host_triple, request_amx, use_usable_cores
from .artifact_check import check_library, metadata_path
from .draw import draw_detections
from .keypoints import heatmaps_to_keypoints
from .masks import paste_masks
from .photo import read_image
from .transform import (
    TransformSettings,
    feature_heights,
    min_height_at,
    min_height_for_scales,
    padded_size,
    pooler_scales,
    resize_boxes,
    resize_keypoints,
    resized_size,
    served_height,
)

__all__ = [
    "METADATA_KIND", "PHOTO_FUNCTION", "Detector", "accepted_sizes", "detect_to_files", "is_detector",
    "precision_suffix", "read_image", "read_metadata",
]

#: ``"kind"`` of a detector artifact's metadata.
METADATA_KIND = "detector"

#: the artifact's function that takes a photo as it is (``[H, W, 3]`` uint8) and returns its
#: detections (:mod:`tvm_roialign.models.detector_photo` makes it; int8 calibration runs it)
PHOTO_FUNCTION = "detect_photo"


def read_metadata(library) -> dict:
    """The metadata of a detector artifact; ValueError when there is none or it is not one."""
    path = metadata_path(library)
    if not path.is_file():
        raise ValueError(
            f"{str(library)!r} has no metadata file {path.name!r} next to it: a detector runs only "
            "with it (its photo sizes and functions), checked or not; compile the detector again"
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


def _device(target: dict):
    import tvm

    kind = target.get("kind", "llvm")
    if kind == "llvm":
        triple = str(target.get("mtriple", ""))
        if not is_host_triple(triple):
            raise ValueError(
                f"the artifact is built for {triple}; this machine is {host_machine()}"
            )
        return tvm.cpu()
    device = tvm.device(kind, 0)
    if not device.exist:
        raise ValueError(
            f"the artifact is built for {kind}; this machine has no {kind} device"
        )
    return device


def _check_photo(rgb, where: str) -> np.ndarray:
    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8 or 0 in rgb.shape:
        raise ValueError(
            f"{where} must be [H, W, 3] uint8 RGB, got {rgb.dtype} {list(rgb.shape)}"
        )
    return rgb


def _size(size) -> str:
    return f"{int(size[0])}x{int(size[1])}"


def accepted_sizes(meta: dict, most: int | None = None) -> str:
    """The padded sizes a detector artifact takes (its metadata ``meta``), in words; at most
    ``most`` of its static sizes are listed."""
    parts = []
    entry = meta.get("any_size")
    if entry:
        parts.append(
            f"any padded size from {entry['min_side']} to {entry['max_side']} pixels a side"
        )
    padded = sorted(tuple(b["padded"]) for b in meta["buckets"])
    if padded:
        shown = [_size(s) for s in padded[:most]]
        more = ", ..." if most is not None and len(padded) > most else ""
        parts.append(f"padded sizes {', '.join(shown)}{more}")
    return " and ".join(parts)


class Detector:
    """A compiled detector artifact, ready to run on photos of the sizes it serves.

    ``Detector(path)(rgb)`` does what torchvision's ``model([image])`` does: its transform
    (normalize, resize keeping the aspect ratio, pad: :mod:`tvm_roialign.runtime.transform`),
    the artifact's function for the padded size, and its postprocess; it returns ``boxes [n,
    4]`` (x1, y1, x2, y2 in the photo's pixels), ``labels [n]`` int64, ``scores [n]``, and for
    Mask R-CNN ``masks [n, H, W]`` (probabilities pasted into the photo) and ``masks28 [n, M,
    M]`` (the artifact's own output), for Keypoint R-CNN ``keypoints [n, K, 3]`` (x, y, 1 in the
    photo's pixels) and ``keypoints_scores [n, K]``, plus ``run_s`` (the artifact) and
    ``total_s`` (with the NumPy steps). A list of photos is one batch, padded together as
    torchvision's ``batch_images`` pads it (what ``model(images)`` computes), and gives a list
    of such dicts; :meth:`raw` gives the batch as ``[N, D, ...]`` arrays and ``num_detections
    [N]``. An artifact compiled for any size (``any_size`` in its metadata: one function with a
    symbolic padded size) takes every padded size within its bounds; one compiled per padded
    size takes those. A photo (or batch) of another padded size is refused with the sizes the
    artifact accepts (:attr:`accepted`), never stretched. With a ``tvm.rpc``
    ``session`` the artifact (a library built for that device) runs there, the NumPy steps here.
    Before loading, the library is compared with the size and SHA-256 its metadata records
    (:func:`~tvm_roialign.runtime.artifact_check.check_library`); ``verify=False`` loads a
    library built elsewhere, without that record (``override`` names that switch in messages).
    """

    def __init__(self, library, session=None, verify: bool = True, override: str = "verify=False"):
        import tvm

        from .loaded_vm import LoadedVM

        self.path = Path(library)
        if not self.path.is_file():
            raise FileNotFoundError(
                f"compiled detector {str(library)!r} does not exist"
            )
        self.meta = read_metadata(self.path)
        missing = [k for k in ("buckets", "transform", "outputs") if k not in self.meta]
        if missing:
            raise ValueError(
                f"{metadata_path(library).name!r} lacks {', '.join(missing)} (compiled by an "
                "older tvm-roialign?); compile it again"
            )
        self.session = session
        # a remote device (tvm.rpc) runs the artifact, the NumPy steps stay here
        self.device = session.cpu(0) if session is not None else _device(self.meta.get("target", {}))
        check_library(self.path, verify, override)
        if session is not None:
            from ..remote import load_vm

            self.vm = load_vm(session, self.path, self.device, LoadedVM)
        else:
            use_usable_cores()
            request_amx(required="amx" in (self.meta.get("bf16_kernels"), self.meta.get("int8_kernels")))
            self.vm = LoadedVM(tvm.runtime.load_module(str(self.path)), self.device)
        self.settings = TransformSettings.from_dict(self.meta["transform"])
        self.buckets = {tuple(b["padded"]): b for b in self.meta["buckets"]}
        self.any_size = self.meta.get("any_size")
        #: the build mode: "exact" (direct convolutions; also an artifact whose metadata predates
        #: the modes) or "fast" (Winograd)
        self.mode = self.meta.get("mode", "exact")
        self.outputs = list(self.meta["outputs"])
        self.names = self.meta.get("categories")
        self.keypoint_names = self.meta.get("keypoint_names")
        self.skeleton = [tuple(pair) for pair in self.meta.get("keypoint_skeleton") or ()]

    @property
    def accepted(self) -> str:
        """The padded sizes this artifact takes, in words (:func:`accepted_sizes`)."""
        return accepted_sizes(self.meta)

    def _any_bucket(self, padded) -> dict | None:
        """The function for any size, as a bucket of ``padded``; None when ``padded`` is out of
        its bounds or its feature maps give the poolers other scales than the function's."""
        entry = self.any_size
        if not entry or not all(entry["min_side"] <= s <= entry["max_side"] for s in padded):
            return None
        heights = [feature_heights(padded[0], row) for row in entry["pooler_strides"]]
        scales = [pooler_scales(h, padded[0]) for h in heights]
        if scales != entry["pooler_scales"]:
            return None
        lowest = min_height_for_scales(heights, padded[0], self.settings.size_divisible)
        return {"padded": list(padded), "function": entry["function"], "min_resized_height": lowest}

    def _pooler_strides(self):
        """The poolers' strides (of the any-size function or a bucket); None in older artifacts."""
        entries = [self.any_size or {}, *self.meta["buckets"]]
        return next((e["pooler_strides"] for e in entries if e.get("pooler_strides")), None)

    def _bucket(self, resized, shapes) -> dict:
        padded = padded_size(resized, self.settings.size_divisible)
        bucket = self.buckets.get(padded) or self._any_bucket(padded)
        settings = f"min_size {self.settings.min_size}, max_size {self.settings.max_size}"
        what = (
            f"a photo of {_size(shapes[0])}" if len(shapes) == 1 else
            f"a batch of {len(shapes)} photos ({', '.join(_size(s) for s in shapes)})"
        )
        height = max(r[0] for r in resized)
        strides = self._pooler_strides()
        lowest = bucket["min_resized_height"] if bucket else None
        if strides is not None and height >= 1:  # (torchvision's resize fails under 1)
            lowest = min_height_at(strides, padded[0], self.settings.size_divisible)
        lowest = 1 if height < 1 else lowest
        if lowest is not None and height < lowest:
            raise ValueError(self._too_thin(what, resized, padded, lowest, strides))
        if bucket is None:
            raise ValueError(
                f"{what} is padded to {_size(padded)} by torchvision's transform ({settings}); "
                f"this artifact accepts {self.accepted} (compile with --input-size "
                f"{_size(shapes[0])} for a build of that size)"
            )
        return bucket

    def _too_thin(self, what, resized, padded, lowest, strides) -> str:
        """Why no build serves a batch this thin: the resized height where torchvision's poolers
        infer other scales, and (where the strides are known) the widest photo that is served."""
        sizes = ", ".join(_size(r) for r in resized)
        text = (
            f"{what} is resized by torchvision's transform (min_size {self.settings.min_size}, "
            f"max_size {self.settings.max_size}) to {sizes}, padded to {_size(padded)}: at a "
            f"height of {max(r[0] for r in resized)} in {padded[0]} rows, torchvision's poolers "
            f"infer other scales than the detector's (it needs a resized height of at least "
            f"{lowest} there)"
        )
        if strides is None:
            return text
        served = served_height(strides, self.settings.size_divisible)
        ratio = self.settings.max_size / served
        return (
            f"{text}; no build serves it (every photo at most {ratio:.1f} times as wide as high is "
            f"served: a resized height of {served} or more)"
        )

    def _prepare(self, images):
        single = not isinstance(images, (list, tuple))
        photos = [images] if single else list(images)
        if not photos:
            raise ValueError("images is an empty list: give one or more [H, W, 3] uint8 photos")
        photos = [
            _check_photo(p, "image" if single else f"images[{i}]") for i, p in enumerate(photos)
        ]
        settings = self.settings
        # the sizes checked before the resize (torchvision's fails on a photo resized to 0 rows)
        resized = [resized_size(p.shape[:2], settings.min_size, settings.max_size) for p in photos]
        bucket = self._bucket(resized, [p.shape[:2] for p in photos])
        tensors = [settings(p) for p in photos]
        return single, photos, tensors, resized, bucket

    def _run(self, tensor, resized, bucket) -> list[np.ndarray]:
        import tvm

        height, width = bucket["padded"]
        batch = np.zeros((1, 3, height, width), np.float32)
        batch[0, :, : tensor.shape[1], : tensor.shape[2]] = tensor
        inputs = [
            tvm.runtime.tensor(batch, self.device),
            tvm.runtime.tensor(np.asarray(resized, np.float32), self.device),
        ]
        if self.session is not None:
            from ..remote import run_vm

            result = run_vm(self.vm, inputs, bucket["function"])
        else:
            result = self.vm[bucket["function"]](*inputs)
        return [r.numpy() for r in result]

    def raw(self, images) -> dict:
        """The artifact's outputs by name for one photo or a batch (a list): ``[N, D, ...]``
        (``N = 1`` for one photo; boxes in the resized images' pixels, rows past
        ``num_detections [N]`` zero), ``resized`` and ``padded`` (the transform's sizes) and
        ``run_s``."""
        _, _, tensors, resized, bucket = self._prepare(images)
        return self._raw(tensors, resized, bucket)

    def _raw(self, tensors, resized, bucket) -> dict:
        t0 = time.perf_counter()
        runs = [self._run(t, r, bucket) for t, r in zip(tensors, resized)]
        arrays = {
            name: np.concatenate([run[i] for run in runs])
            for i, name in enumerate(self.outputs)
        }
        arrays["run_s"] = time.perf_counter() - t0
        arrays["resized"] = [tuple(int(v) for v in r) for r in resized]
        arrays["padded"] = tuple(bucket["padded"])
        return arrays

    def __call__(self, images):
        start = time.perf_counter()
        single, photos, tensors, resized, bucket = self._prepare(images)
        arrays = self._raw(tensors, resized, bucket)
        results = [
            self._postprocess(arrays, i, resized[i], photo.shape[:2])
            for i, photo in enumerate(photos)
        ]
        for result in results:
            result["run_s"] = arrays["run_s"]
            result["total_s"] = time.perf_counter() - start
            result["padded"] = arrays["padded"]
        return results[0] if single else results

    def _postprocess(self, arrays, i, resized, original) -> dict:
        """torchvision's postprocess of image ``i``: boxes (and keypoints) to the photo's
        size, masks pasted into it."""
        count = int(arrays["num_detections"][i])
        boxes = resize_boxes(arrays["boxes"][i, :count], resized, original)
        out = {
            "boxes": boxes,
            "labels": arrays["labels"][i, :count],
            "scores": arrays["scores"][i, :count],
            "resized": tuple(int(v) for v in resized),
        }
        if "masks" in arrays:
            out["masks28"] = arrays["masks"][i, :count]
            out["masks"] = paste_masks(out["masks28"], boxes, *original)
        if "keypoint_heatmaps" in arrays:
            keypoints, out["keypoints_scores"] = heatmaps_to_keypoints(
                arrays["keypoint_heatmaps"][i, :count], arrays["boxes"][i, :count]
            )
            out["keypoints"] = resize_keypoints(keypoints, resized, original)
        return out

    def name_of(self, label: int) -> str:
        names = self.names
        return names[label] if names and 0 <= label < len(names) else str(label)

    def keypoint_name(self, index: int) -> str:
        names = self.keypoint_names
        return names[index] if names and 0 <= index < len(names) else str(index)

    def describe(self, result: dict, i: int, mask_threshold: float = 0.5) -> dict:
        """Detection ``i`` of ``result`` (from :meth:`__call__`) as JSON-able values: label,
        category name, score, box, and the mask's pixel count or each keypoint (name, x, y,
        score) where the model has them."""
        entry = {
            "label": int(result["labels"][i]),
            "name": self.name_of(int(result["labels"][i])),
            "score": float(result["scores"][i]),
            "box": [float(v) for v in result["boxes"][i]],
        }
        if "masks" in result:
            entry["mask_pixels"] = int((result["masks"][i] > mask_threshold).sum())
        if "keypoints" in result:
            entry["keypoints"] = [
                {"name": self.keypoint_name(k), "x": float(x), "y": float(y), "score": float(score)}
                for k, ((x, y, _), score) in enumerate(
                    zip(result["keypoints"][i], result["keypoints_scores"][i])
                )
            ]
        return entry


def precision_suffix(summary: dict) -> str:
    """``", int8"`` / ``", bf16"`` after a reduced-precision artifact's build mode in a
    :func:`detect_to_files` summary's caption and ``run``'s line; nothing for fp32."""
    precision = summary.get("precision", "fp32")
    return "" if precision == "fp32" else f", {precision}"


def weights_suffix(summary: dict) -> str:
    """``"; weights random, seed 0"`` (the metadata's ``weights``) for ``run``'s line and the
    caption; nothing for an artifact that does not record them."""
    weights = summary.get("weights")
    return f"; weights {weights}" if weights else ""


def detect_to_files(
    library,
    image_path,
    out_image=None,
    out_json=None,
    top: int = 8,
    mask_threshold: float = 0.5,
    session=None,
    verify: bool = True,
    rgb=None,
) -> dict:
    """Run the artifact on a photo (on the remote device of a ``tvm.rpc`` ``session`` if given);
    draw the ``top`` detections into ``out_image`` and write all of them to ``out_json``.
    ``library``: a path (loaded with ``verify``, see :class:`Detector`) or a loaded
    :class:`Detector`; ``rgb``: the photo at ``image_path`` when it has been read already
    (:func:`read_image`). Returns the JSON-able summary."""
    detector = library if isinstance(library, Detector) else Detector(library, session, verify)
    library = detector.path
    rgb = read_image(image_path) if rgb is None else rgb
    result = detector(rgb)
    meta = detector.meta
    summary = {
        "model": meta.get("model"),
        "library": str(library),
        "image": str(image_path),
        "image_size": list(rgb.shape[:2]),
        "resized_size": list(result["resized"]),
        "padded_size": list(result["padded"]),
        "target": meta.get("target"),
        "mode": detector.mode,
        "precision": meta.get("precision", "fp32"),
        "weights": meta.get("weights"),
        "run_ms": result["run_s"] * 1e3,
        "total_ms": result["total_s"] * 1e3,
        "num_detections": len(result["boxes"]),
        "detections": [
            detector.describe(result, i, mask_threshold) for i in range(len(result["boxes"]))
        ],
    }
    if out_image is not None:
        target = meta.get("target") or {}
        where = " ".join(str(target[k]) for k in ("kind", "mcpu") if target.get(k))
        caption = (
            f"{meta.get('model') or Path(library).name}: {summary['num_detections']} "
            f"detections, {summary['run_ms']:.0f} ms ({where or '?'}, {detector.mode}"
            f"{precision_suffix(summary)}){weights_suffix(summary)}"
        )
        draw_detections(
            rgb, result, detector.names, top, mask_threshold, caption, skeleton=detector.skeleton
        ).save(out_image)
    if out_json is not None:
        Path(out_json).write_text(json.dumps(summary, indent=2))
    return summary
