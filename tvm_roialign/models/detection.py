"""Whole torchvision detectors as one TVM artifact that runs without PyTorch.

:func:`compile_detector` takes a torchvision Faster / Mask R-CNN (by name, as a model, or as a
program exported with :func:`tvm_roialign.frontend.detection.export_detector`), exports it for one
input image size in its static form (:mod:`tvm_roialign.frontend.static_rcnn`), imports it with
tvm-roialign's converters, converts it to NHWC (:class:`~tvm_roialign.passes.ConvertLayout`) and
builds it with the CPU pipeline (:func:`tvm_roialign.pipeline.build`; for this machine's CPU unless
another target is given). The result, :class:`DetectorArtifact`, is written as a library plus a
``.json`` of metadata, which :class:`tvm_roialign.runtime.Detector` runs with TVM's runtime, NumPy
and Pillow only.

The artifact's ``main(image)`` takes ``[3, H, W]`` float32 in ``[0, 1]`` and returns
``boxes [1, D, 4]``, ``scores [1, D]``, ``labels [1, D]`` (int64), ``masks [1, D, M, M]`` (Mask
R-CNN: each detection's mask probabilities for its label) and ``num_detections [1]`` (int64),
``D`` = the model's ``detections_per_img``; rows from ``num_detections`` on are zero (TensorRT's
and ONNX's detector convention, one image).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tvm
from tvm import relax

from ..passes.desired_layouts import desired_layouts
from ..runtime.detector import METADATA_KIND, read_image
from ._torchvision import RCNNConfig, build_rcnn, category_names

__all__ = [
    "DETECTORS",
    "DetectorArtifact",
    "DetectorConfig",
    "build_torch_detector",
    "compare",
    "compile_detector",
    "import_detector",
    "sample_photo",
    "torch_detections",
]

#: Photos that installed packages ship: scikit-image's and matplotlib's.
SAMPLE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "grace_hopper")

#: Model names :func:`build_torch_detector` knows (torchvision builders).
DETECTORS = (
    "maskrcnn_resnet50_fpn",
    "fasterrcnn_resnet50_fpn",
    "maskrcnn_resnet50_fpn_v2",
    "fasterrcnn_resnet50_fpn_v2",
    "fasterrcnn_mobilenet_v3_large_fpn",
)

#: ConvertLayout's desired layouts for the NHWC artifact (the package's whole-model NHWC set).
NHWC_LAYOUTS = desired_layouts("NHWC")


@dataclass
class DetectorConfig(RCNNConfig):
    """How a named torchvision detector is built (torchvision's own keyword arguments).

    Weights: ``weights=None, weights_backbone=None`` and ``seed`` (nothing is downloaded), or a
    state_dict file. ``min_size`` / ``max_size`` are torchvision's resize bounds (512 here, so
    that the 512x512 astronaut photo is used at its own size); the caps are torchvision's.
    ``extra``: further keyword arguments of the torchvision builder. The fields other than
    ``extra`` are those of :class:`tvm_roialign.models.maskrcnn.MaskRCNNConfig` (one base).
    """

    extra: dict = field(default_factory=dict)


def build_torch_detector(name: str, config: DetectorConfig | None = None):
    """torchvision's detector ``name`` (one of :data:`DETECTORS`) in eval mode.

    Raises
    ------
    ValueError
        Unknown name, or ``config.weights`` is not a state_dict of this model.
    FileNotFoundError
        ``config.weights`` does not exist.
    """
    if name not in DETECTORS:
        raise ValueError(
            f"unknown detector {name!r}: use one of {', '.join(DETECTORS)}"
        )
    config = config or DetectorConfig()
    return build_rcnn(name, config, **config.extra)


def _categories(model) -> list[str] | None:
    """COCO category names when the model has torchvision's 91 COCO classes."""
    names = category_names()
    if names is None:  # metadata moved: numbers instead of names
        return None
    predictor = getattr(model.roi_heads.box_predictor, "cls_score", None)
    classes = getattr(predictor, "out_features", None)
    return names if classes == len(names) else None


@contextlib.contextmanager
def _tvm_friendly(model):
    """Within the block, the mask predictor's 2x2 / stride-2 ConvTranspose2d runs as a 1x1
    convolution plus depth-to-space (same sums, a quarter of the work in TVM, and a form
    ConvertLayout moves to NHWC); the model is restored on exit."""
    from .maskrcnn.pieces import conv_transpose_as_conv

    predictor = getattr(model.roi_heads, "mask_predictor", None)
    original = getattr(predictor, "conv5_mask", None)
    replacement = conv_transpose_as_conv(original) if original is not None else None
    if replacement is not None:
        predictor.conv5_mask = replacement
    try:
        yield model
    finally:
        if replacement is not None:
            predictor.conv5_mask = original


def import_detector(
    model, image_size, layout: str = "NHWC", offset_trick_max_numel=4000, float64=True
):
    """``(IRModule, metadata)`` of ``model`` (a torchvision detector, or a program exported with
    :func:`~tvm_roialign.frontend.detection.export_detector`) for ``(H, W)`` input images;
    ``float64=False`` for targets without float64 (Metal)."""
    import torch

    from ..frontend.detection import export_detector, from_exported_program
    from ..passes import ConvertLayout

    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
    if isinstance(model, torch.export.ExportedProgram):
        program = model
        meta = _program_metadata(program)
    else:
        with _tvm_friendly(model):
            program, static = export_detector(
                model,
                image_size,
                offset_trick_max_numel=offset_trick_max_numel,
                float64=float64,
            )
        meta = {
            "input": {
                "name": "image",
                "shape": [3, *static.image_size],
                "dtype": "float32",
            },
            "outputs": static.output_names(),
            "resized": list(static.resized),
            "padded": list(static.padded),
            "max_detections": static.num_detections,
            "proposals": static.num_proposals,
            "score_threshold": float(model.roi_heads.score_thresh),
            "categories": _categories(model),
            "offset_trick_max_numel": int(offset_trick_max_numel),
        }
    fold = relax.transform.FoldConstant()
    mod = fold(from_exported_program(program, keep_params_as_input=False))
    if layout == "NHWC":
        mod = fold(ConvertLayout(desired_layouts(layout))(mod))
    return mod, meta


def _program_metadata(program) -> dict:
    """Metadata of a detector program loaded from a ``.pt2`` (its input and output shapes)."""
    placeholders = [
        spec
        for spec in program.graph_signature.input_specs
        if spec.kind.name == "USER_INPUT"
    ]
    outputs = list(program.graph_signature.output_specs)
    ops = {
        str(node.target) for node in program.graph.nodes if node.op == "call_function"
    }
    if len(placeholders) != 1 or "tvm_roialign.batched_nms.default" not in ops:
        raise ValueError(
            "the program is not a detector exported with tvm_roialign.frontend.detection."
            "export_detector (one image input and tvm_roialign::batched_nms expected)"
        )
    shape = [
        int(d) for d in program.graph.find_nodes(op="placeholder")[-1].meta["val"].shape
    ]
    names = ["boxes", "scores", "labels", "masks", "num_detections"]
    if len(outputs) == 4:
        names.remove("masks")
    return {
        "input": {"name": "image", "shape": shape, "dtype": "float32"},
        "outputs": names,
        "categories": None,
    }


@dataclass
class DetectorArtifact:
    """A compiled detector: the executable, its Relax module and metadata, and build times."""

    executable: object
    mod: tvm.IRModule
    meta: dict
    import_s: float
    compile_s: float

    def export(self, path) -> Path:
        """Write the library (``.so``; ``.tar`` for a cross target without a cross linker) and
        its metadata (``path + ".json"``); returns the library's path."""
        path = Path(path)
        if path.suffix not in (".so", ".tar", ".dylib"):
            raise ValueError(
                f"the library must end in .so, .tar or .dylib, got {str(path)!r}"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        from ..linking import export_library

        export_library(self.executable, path, self.meta["target"])
        Path(str(path) + ".json").write_text(json.dumps(self.meta, indent=2))
        return path

    def vm(self, device=None) -> relax.VirtualMachine:
        return relax.VirtualMachine(self.executable, device or tvm.cpu())


def compile_detector(
    model,
    image_size=None,
    target=None,
    layout: str = "NHWC",
    config: DetectorConfig | None = None,
    progress: Callable[[str], None] | None = None,
    offset_trick_max_numel: int = 4000,
    name: str | None = None,
) -> DetectorArtifact:
    """Compile a whole torchvision detector into one artifact (see the module doc).

    Parameters
    ----------
    model : str | torch.nn.Module | torch.export.ExportedProgram | path
        A name from :data:`DETECTORS` (built with ``config``), a torchvision Faster / Mask R-CNN
        in eval mode, or an exported detector program (in memory or a ``.pt2`` file).
    image_size : (int, int)
        ``(H, W)`` of the input photos (not needed for an exported program).
    target : str | dict | tvm.target.Target | None
        Anything :func:`tvm_roialign.target.parse_target` takes: a short name (``"native"``,
        ``"llvm-generic"``, ``"aarch64"``, ``"cuda"``...), a tvmc string, a JSON/dict target or a
        Target. Default (None): ``native``, this machine's CPU, as for
        :class:`~tvm_roialign.models.maskrcnn.TVMMaskRCNN`; ``"llvm"`` is a portable build for the
        generic CPU of this machine's architecture.
    layout : str
        ``"NHWC"`` (ConvertLayout of conv2d and RoIAlign) or ``"NCHW"``.
    offset_trick_max_numel : int
        torchvision's batched-NMS switch to reproduce (4000: CPU eager; 100000: CUDA eager).
    name : str | None
        The artifact's model name in its metadata (default: the detector name, the ``.pt2``
        file's stem, or the model's class name).
    """
    from ..pipeline import build
    from ..target import parse_target, target_config

    progress = progress or (lambda _msg: None)
    target = parse_target(target)
    if isinstance(model, str) and model in DETECTORS:
        name = name or model
        progress(f"build torchvision {name}")
        model = build_torch_detector(model, config)
    elif isinstance(model, (str, Path)):
        name = name or Path(model).stem
        model = _load_program(Path(model))
    if image_size is None and not hasattr(model, "graph_signature"):
        raise ValueError("image_size (H, W) is needed to compile a torchvision model")
    progress("export and import")
    t0 = time.perf_counter()
    mod, meta = import_detector(
        model, image_size, layout, offset_trick_max_numel, target.kind.name != "metal"
    )
    import_s = time.perf_counter() - t0
    progress(f"build for {target.kind.name}")
    t0 = time.perf_counter()
    executable = build(mod, target, layout=None)  # import_detector converted the layout
    compile_s = time.perf_counter() - t0
    meta = {
        "kind": METADATA_KIND,
        "model": name or type(model).__name__,
        **meta,
        "layout": layout,
        "target": target_config(target),
        "import_s": import_s,
        "compile_s": compile_s,
    }
    return DetectorArtifact(executable, mod, meta, import_s, compile_s)


def _load_program(path: Path):
    import torch

    from ..frontend import detection  # noqa: F401 - registers tvm_roialign::batched_nms

    if not path.is_file():
        raise FileNotFoundError(f"model file {str(path)!r} does not exist")
    try:
        return torch.export.load(str(path))
    except Exception as err:  # noqa: BLE001
        first = (
            str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        )
        raise ValueError(
            f"cannot read {str(path)!r} as a torch.export program: {first}"
        ) from None


def sample_photo(name: str):
    """An RGB photo ``[H, W, 3]`` uint8 that an installed package ships: scikit-image's
    ``astronaut`` (512x512), ``coffee`` (400x600), ``chelsea`` (300x451), ``rocket`` (427x640),
    or matplotlib's ``grace_hopper`` (600x512)."""
    import numpy as np

    if name == "grace_hopper":
        from matplotlib import cbook

        return read_image(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    if name not in SAMPLE_PHOTOS:
        raise ValueError(
            f"unknown sample photo {name!r}: use one of {', '.join(SAMPLE_PHOTOS)}"
        )
    from skimage import data

    return np.ascontiguousarray(getattr(data, name)(), dtype=np.uint8)


def torch_detections(model, rgb) -> dict:
    """torchvision eager on an RGB uint8 photo (as a ``[3, H, W]`` float tensor in [0, 1]), as
    NumPy arrays: ``boxes``, ``labels``, ``scores`` and, for Mask R-CNN, ``masks [n, H, W]``."""
    import numpy as np
    import torch

    image = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float() / 255.0
    with torch.no_grad():
        (result,) = model([image])
    out = {key: result[key].numpy() for key in ("boxes", "labels", "scores")}
    if "masks" in result:
        out["masks"] = result["masks"][:, 0].numpy()
    return out


def compare(ours: dict, ref: dict) -> dict:
    """:func:`tvm_roialign.models.maskrcnn.compare_detections` of two NumPy detection dicts
    (``masks [n, H, W]`` optional), with ``passed``: same count and labels, boxes within 1e-2 px,
    scores within 1e-4, >= 99.9% of mask pixels equal at 0.5."""
    import numpy as np
    import torch

    from .maskrcnn import compare_detections

    def tensors(d):
        n = len(d["boxes"])
        masks = d.get("masks")
        masks = np.zeros((n, 1, 1), np.float32) if masks is None else masks
        return {
            "boxes": torch.from_numpy(np.asarray(d["boxes"], np.float32)),
            "labels": torch.from_numpy(np.asarray(d["labels"], np.int64)),
            "scores": torch.from_numpy(np.asarray(d["scores"], np.float32)),
            "masks": torch.from_numpy(np.asarray(masks, np.float32))[:, None],
        }

    result = compare_detections(tensors(ours), tensors(ref))
    result["passed"] = bool(
        result["num_detections_tvm"] == result["num_detections_torch"]
        and result["same_labels"]
        and result["max_box_diff"] <= 1e-2
        and result.get("max_score_diff", 0.0) < 1e-4
        and result["mask_pixel_agreement"] >= 0.999
    )
    return result
