"""Whole torchvision detectors as one TVM artifact that runs without PyTorch.

:func:`compile_detector` takes a torchvision Faster / Mask / Keypoint R-CNN (by name, as a model,
or as a program exported with :func:`tvm_roialign.frontend.detection.export_detector`), exports
it in its static form (:mod:`tvm_roialign.frontend.static_rcnn`), by default once with a symbolic
padded height and width (one function for every photo), or once per padded image size it is to
serve (:func:`bucket_sizes`), imports it with tvm-roialign's converters, converts it to NHWC
(:class:`~tvm_roialign.passes.ConvertLayout`) and builds it with the CPU pipeline
(:func:`tvm_roialign.pipeline.build`; for this machine's CPU unless another target is given). The
result, :class:`DetectorArtifact`, is written as a library plus a ``.json`` of metadata (the
padded sizes it takes, torchvision's transform settings), which
:class:`tvm_roialign.runtime.Detector` runs with TVM's runtime, NumPy and Pillow only.

The artifact's function ``detect(images, image_size)`` (or, per padded size ``(Hp, Wp)``,
``detect_<Hp>x<Wp>``) takes ``images [1, 3, Hp, Wp]`` float32 (a photo after torchvision's
transform: normalized, resized keeping its aspect ratio, zero-padded; the runner makes it) and
``image_size [2]`` float32 (the resized ``(h, w)``); it returns ``boxes [1, D, 4]`` (in the
resized image's pixels), ``scores [1, D]``, ``labels [1, D]`` (int64), ``masks [1, D, M, M]``
(Mask R-CNN: each detection's mask probabilities for its label), ``keypoint_heatmaps [1, D, K,
56, 56]`` (Keypoint R-CNN) and ``num_detections [1]`` (int64), ``D`` = the model's
``detections_per_img``; rows from ``num_detections`` on are zero (TensorRT's and ONNX's detector
convention). The weights are stored once (the VM's constant pool shares equal tensors)."""

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
from ._torchvision import RCNNConfig, build_rcnn, detector_names
from .compare import compare_detections

__all__ = [
    "DETECTORS",
    "WINOGRAD_TILE",
    "DetectorArtifact",
    "DetectorConfig",
    "build_torch_detector",
    "compare",
    "compile_detector",
    "graph_options",
    "import_detector",
    "sample_photo",
    "torch_detections",
]

#: Winograd output tile of the detectors' 3x3 convolutions: 0, none (direct convs). A detector's
#: top-k, NMS and heatmap argmax turn rounding into decisions, and with random weights many sit
#: near a tie. Winograd rounds otherwise than PyTorch's direct convs, and flipped some: with
#: F(4x4, 3x3), Keypoint R-CNN on a 160x640 photo batched into 512x512 kept another detection
#: set than eager; with F(2x2, 3x3) or F(4x4), Faster R-CNN on grace_hopper's top 512 rows did
#: (22 detections reordered), in static and any-size builds alike, where direct convs agree with
#: eager. Winograd makes Faster R-CNN about 1.3x faster; exactness first. Classifiers keep F(4x4).
WINOGRAD_TILE = 0

#: Photos that installed packages ship: scikit-image's and matplotlib's.
SAMPLE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "grace_hopper")

#: Model names :func:`build_torch_detector` knows (torchvision builders).
DETECTORS = (
    "maskrcnn_resnet50_fpn",
    "fasterrcnn_resnet50_fpn",
    "maskrcnn_resnet50_fpn_v2",
    "fasterrcnn_resnet50_fpn_v2",
    "fasterrcnn_mobilenet_v3_large_fpn",
    "keypointrcnn_resnet50_fpn",
)

#: The photo sizes whose padded sizes a default artifact serves: square, 4:3 and 3:2, landscape
#: and portrait (with the package's 512 / 512 resize: 512x512, 384x512, 512x384, 352x512,
#: 512x352; five builds in one artifact).
DEFAULT_PHOTO_SIZES = ((512, 512), (384, 512), (512, 384), (400, 600), (600, 400))

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


#: The transposed convs that :func:`_tvm_friendly` rewrites: (head of ``roi_heads``, attribute).
_TRANSPOSED_CONVS = (("mask_predictor", "conv5_mask"), ("keypoint_predictor", "kps_score_lowres"))


@contextlib.contextmanager
def _tvm_friendly(model):
    """Within the block, the mask predictor's 2x2 / stride-2 ConvTranspose2d runs as a 1x1
    convolution plus depth-to-space (same sums, a quarter of the work in TVM, and a form
    ConvertLayout moves to NHWC), and the keypoint predictor's 4x4 / stride-2 one as a 3x3
    convolution plus depth-to-space (:mod:`._torch_rewrites`); the model is restored on exit."""
    from ._torch_rewrites import conv_transpose_as_conv

    replaced = []
    for head_name, attribute in _TRANSPOSED_CONVS:
        head = getattr(model.roi_heads, head_name, None)
        original = getattr(head, attribute, None)
        replacement = conv_transpose_as_conv(original) if original is not None else None
        if replacement is not None:
            setattr(head, attribute, replacement)
            replaced.append((head, attribute, original))
    try:
        yield model
    finally:
        for head, attribute, original in replaced:
            setattr(head, attribute, original)


#: ``image_sizes`` of one function for every photo (symbolic height and width).
ANY = "any"

#: The artifact's function for any padded size.
ANY_FUNCTION = "detect"


def function_name(padded) -> str:
    """The artifact's function for one padded size: ``detect_<Hp>x<Wp>``."""
    return f"detect_{int(padded[0])}x{int(padded[1])}"


def bucket_sizes(transform, image_sizes=None) -> list[tuple[int, int]]:
    """The padded sizes an artifact of a model with ``transform`` (its
    ``GeneralizedRCNNTransform``) is built for: those of the photo sizes ``image_sizes`` (one
    ``(H, W)`` or a list; None: :data:`DEFAULT_PHOTO_SIZES`), or ``"all"``: every padded size a
    photo can get (:func:`~tvm_roialign.runtime.transform.all_padded_sizes`)."""
    from ..runtime.transform import all_padded_sizes, padded_size, resized_size

    low, high, divisible = int(transform.min_size[-1]), int(transform.max_size), int(
        transform.size_divisible
    )
    if isinstance(image_sizes, str):
        if image_sizes != "all":
            raise ValueError(f"image_sizes must be (H, W), a list of them or 'all', got {image_sizes!r}")
        return all_padded_sizes(low, high, divisible)
    if image_sizes is None:
        image_sizes = DEFAULT_PHOTO_SIZES
    elif len(image_sizes) == 2 and all(isinstance(v, int) for v in image_sizes):
        image_sizes = [image_sizes]
    sizes = []
    for size in image_sizes:
        height, width = (int(v) for v in size)
        if height < 1 or width < 1:
            raise ValueError(f"image sizes must be positive (H, W), got {tuple(size)}")
        padded = padded_size([resized_size((height, width), low, high)], divisible)
        if padded not in sizes:
            sizes.append(padded)
    return sizes


def graph_options(model) -> dict:
    """The pipeline's Winograd options for a detector (``compile DETECTOR``, the ``maskrcnn``
    pieces and their tuning tasks alike): :data:`WINOGRAD_TILE`, and the side at which a
    symbolic-size conv is judged worth it, a photo's padded longer side under ``model``'s
    transform (the pipeline's default without one)."""
    from ..runtime.transform import TransformSettings

    options = {"winograd": WINOGRAD_TILE}
    transform = getattr(model, "transform", None)
    if transform is not None:
        options["reference_side"] = TransformSettings.of(transform).longest_padded_side()
    return options


def _import_one(model, padded, offset_trick_max_numel, float64):
    from ..frontend.detection import export_detector, from_exported_program

    program, static = export_detector(
        model, padded, offset_trick_max_numel=offset_trick_max_numel, float64=float64
    )
    mod = from_exported_program(program, keep_params_as_input=False)
    if padded == ANY:
        return mod["main"], _any_entry(static), static
    bucket = {
        "padded": list(static.padded),
        "function": function_name(static.padded),
        "min_resized_height": static.min_height(),
    }
    return mod["main"], bucket, static


def _any_entry(static) -> dict:
    """The metadata of the function for any padded size: its name, the padded sides it takes,
    and what the runner needs to check a batch's scales (the poolers' strides and scales)."""
    from ..frontend.detection import ANY_SIDES
    from ..runtime.transform import feature_heights, pooler_scales

    strides = static.pooler_strides()
    height = static.padded[0]
    return {
        "function": ANY_FUNCTION,
        "min_side": ANY_SIDES[0],
        "max_side": ANY_SIDES[1],
        "pooler_strides": strides,
        "pooler_scales": [pooler_scales(feature_heights(height, row), height) for row in strides],
    }


def import_detector(
    model, image_sizes=None, layout: str = "NHWC", offset_trick_max_numel=4000, float64=True
):
    """``(IRModule, metadata)`` of ``model`` (a torchvision detector, or a program exported with
    :func:`~tvm_roialign.frontend.detection.export_detector`): for ``image_sizes`` None or
    ``"any"``, one function ``detect`` for every padded size (metadata ``any_size``); else one
    function per padded size of :func:`bucket_sizes` (``detect_<Hp>x<Wp>``, metadata
    ``buckets``). ``float64=False`` for targets without float64 (Metal)."""
    import torch

    from ..frontend.detection import from_exported_program
    from ..frontend.static_rcnn import torch_bilinear_fused
    from ..passes import ConvertLayout
    from ..runtime.transform import TransformSettings

    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
    if isinstance(model, torch.export.ExportedProgram):
        meta = _program_metadata(model)
        functions = {meta["buckets"][0]["function"]: from_exported_program(
            model, keep_params_as_input=False
        )["main"]}
    else:
        functions, buckets, any_size = {}, [], None
        sizes = [ANY] if image_sizes in (None, ANY) else bucket_sizes(model.transform, image_sizes)
        with _tvm_friendly(model):
            for padded in sizes:
                func, entry, static = _import_one(model, padded, offset_trick_max_numel, float64)
                functions[entry["function"]] = func
                if padded == ANY:
                    any_size = entry
                else:
                    buckets.append(entry)
        meta = {
            "outputs": static.output_names(),
            "buckets": buckets,
            **({"any_size": any_size} if any_size else {}),
            "transform": TransformSettings.of(
                model.transform, torch_bilinear_fused(30, 57)
            ).to_dict(),
            "max_detections": static.num_detections,
            "proposals": static.num_proposals,
            "score_threshold": float(model.roi_heads.score_thresh),
            **detector_names(model),
            "offset_trick_max_numel": int(offset_trick_max_numel),
        }
    mod = tvm.IRModule(
        {name: func.with_attr("global_symbol", name) for name, func in functions.items()}
    )
    fold = relax.transform.FoldConstant()
    mod = fold(mod)
    if layout == "NHWC":
        mod = fold(ConvertLayout(desired_layouts(layout))(mod))
    return mod, meta


def _program_metadata(program) -> dict:
    """Metadata of a detector program loaded from a ``.pt2`` (its padded size, transform and
    output names, from :func:`~tvm_roialign.frontend.detection.export_detector`)."""
    from ..frontend.detection import settings_of_tensor

    placeholders = [
        spec
        for spec in program.graph_signature.input_specs
        if spec.kind.name == "USER_INPUT"
    ]
    outputs = list(program.graph_signature.output_specs)
    ops = {
        str(node.target) for node in program.graph.nodes if node.op == "call_function"
    }
    state = program.state_dict
    if (
        len(placeholders) != 2
        or "tvm_roialign.batched_nms.default" not in ops
        or "transform_settings" not in state
    ):
        raise ValueError(
            "the program is not a detector exported with tvm_roialign.frontend.detection."
            "export_detector (images and image_size inputs, tvm_roialign::batched_nms expected)"
        )
    images = list(program.graph.find_nodes(op="placeholder"))[-2]
    padded = [int(d) for d in images.meta["val"].shape[-2:]]
    (returned,) = program.graph.find_nodes(op="output")
    ranks = [node.meta["val"].dim() for node in returned.args[0]]
    if len(ranks) != len(outputs):
        raise ValueError("the program's outputs are not a detector's (boxes, scores, labels, ...)")
    extra = {4: "masks", 5: "keypoint_heatmaps"}
    names = ["boxes", "scores", "labels", *(extra.get(r, "?") for r in ranks[3:-1]), "num_detections"]
    bucket = {
        "padded": padded,
        "function": function_name(padded),
        "min_resized_height": int(state["min_resized_height"]),
    }
    return {
        "outputs": names,
        "buckets": [bucket],
        "transform": settings_of_tensor(state["transform_settings"]),
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
    image_sizes=None,
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
    image_sizes : (int, int) | list of (int, int) | "all" | "any" | None
        The photo sizes ``(H, W)`` the artifact serves. None or ``"any"`` (the default): one
        function for every photo (a symbolic padded size within
        :data:`~tvm_roialign.frontend.detection.ANY_SIDES`). Sizes: one function per padded
        size they get from torchvision's transform (:func:`bucket_sizes`; ``"all"``: every
        padded size), each compiled for its size. Not used for an exported program (its own
        size).
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
    if hasattr(model, "graph_signature"):
        progress("export and import")
    elif image_sizes in (None, ANY):
        progress("export and import one function for every padded size")
    else:
        progress(
            f"export and import {len(bucket_sizes(model.transform, image_sizes))} padded size(s)"
        )
    t0 = time.perf_counter()
    mod, meta = import_detector(
        model, image_sizes, layout, offset_trick_max_numel, target.kind.name != "metal"
    )
    import_s = time.perf_counter() - t0
    progress(f"build for {target.kind.name}")
    t0 = time.perf_counter()
    # import_detector converted the layout
    executable = build(mod, target, layout=None, **graph_options(model))
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
    NumPy arrays: ``boxes``, ``labels``, ``scores`` and, for Mask R-CNN, ``masks [n, H, W]``,
    for Keypoint R-CNN ``keypoints [n, K, 3]`` and ``keypoints_scores [n, K]``."""
    import numpy as np
    import torch

    image = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float() / 255.0
    with torch.no_grad():
        (result,) = model([image])
    out = {key: result[key].numpy() for key in ("boxes", "labels", "scores")}
    if "masks" in result:
        out["masks"] = result["masks"][:, 0].numpy()
    for key in ("keypoints", "keypoints_scores"):
        if key in result:
            out[key] = result[key].numpy()
    return out


#: TVM's detections against eager's (NumPy dicts from :class:`~tvm_roialign.runtime.Detector` and
#: :func:`torch_detections`), with ``passed``: :func:`tvm_roialign.models.compare.compare_detections`,
#: the package's one comparison (its criteria: :data:`tvm_roialign.models.compare.CRITERIA`).
compare = compare_detections
