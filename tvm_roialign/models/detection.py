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

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import relax

from ..precision.layers import detector_plan, precision_options
from ..runtime.artifact_check import RECORD_KEY, library_record
from ..runtime.detector import METADATA_KIND
from .compare import compare_detections
from .detector_import import import_detector
from .detector_photo import add_photo_function, serves_photos
from .detector_reference import SAMPLE_PHOTOS, sample_photo, torch_detections
from .detector_sizes import (
    ANY,
    DEFAULT_FAST,
    MODES,
    WINOGRAD_TILE,
    bucket_sizes,
    build_mode,
    graph_options,
)
from .detector_zoo import DETECTORS, DetectorConfig, build_torch_detector, load_program

__all__ = [
    "DEFAULT_FAST",
    "DETECTORS",
    "MODES",
    "SAMPLE_PHOTOS",
    "WINOGRAD_TILE",
    "DetectorArtifact",
    "DetectorConfig",
    "bucket_sizes",
    "build_torch_detector",
    "compare",
    "compile_detector",
    "graph_options",
    "import_detector",
    "sample_photo",
    "torch_detections",
]


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
        record = {RECORD_KEY: library_record(path)}
        Path(str(path) + ".json").write_text(json.dumps({**self.meta, **record}, indent=2))
        return path

    def vm(self, device=None) -> relax.VirtualMachine:
        """A VM of the executable, its load-time weights computed
        (:class:`~tvm_roialign.runtime.LoadedVM`)."""
        from ..runtime.loaded_vm import LoadedVM

        return LoadedVM(self.executable, device or tvm.cpu())


def compile_detector(
    model,
    image_sizes=None,
    target=None,
    layout: str = "NHWC",
    *,
    config: DetectorConfig | None = None,
    progress: Callable[[str], None] | None = None,
    offset_trick_max_numel: int = 4000,
    name: str | None = None,
    fast: bool = DEFAULT_FAST,
    precision: str = "fp32",
    fp32_layers=None,
    calibration=None,
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
        padded size), each compiled for its size. Not used for an exported program (its own size).
    target : str | dict | tvm.target.Target | None
        Anything :func:`tvm_roialign.target.parse_target` takes: a short name (``"native"``,
        ``"llvm-generic"``, ``"aarch64"``, ``"cuda"``...), a tvmc string, a JSON/dict target or a
        Target. Default (None): ``native``, this machine's CPU, as for
        :class:`~tvm_roialign.models.maskrcnn.TVMMaskRCNN`; ``"llvm"`` is a portable build for the
        generic CPU of this machine's architecture.
    layout : str
        ``"NHWC"`` (ConvertLayout of conv2d and RoIAlign) or ``"NCHW"``.
    config : DetectorConfig | None
        How a named detector is built (default :class:`DetectorConfig`).
    progress : callable(str) | None
        Called with a line before each stage.
    offset_trick_max_numel : int
        torchvision's batched-NMS switch to reproduce (4000: CPU eager; 100000: CUDA eager).
    name : str | None
        The artifact's model name in its metadata (default: the detector name, the ``.pt2``
        file's stem, or the model's class name).
    fast : bool
        True (the default, :data:`DEFAULT_FAST`): Winograd 3x3 convolutions, detections by
        :data:`~.compare.FAST_CRITERIA`; False: direct ones, by :data:`~.compare.CRITERIA`.
    precision, fp32_layers, calibration : str | PrecisionPlan; str | list of str | None; str | list | None
        ``"fp32"``, ``"bf16"``, ``"int8"`` (any size only), ``"auto"`` or the caller's
        :class:`~tvm_roialign.precision.PrecisionPlan`; the layers kept in fp32
        (:mod:`tvm_roialign.precision.layers`, e.g. ``"rpn"``); int8's photos (None: the sample photos; a
        directory; ``[H, W, 3]`` uint8 arrays)
    """
    from ..pipeline import build
    from ..target import parse_target, target_config

    progress = progress or (lambda _msg: None)
    target = parse_target(target)
    plan, kept = detector_plan(precision, target, fp32_layers)
    _check_int8(plan.precision, image_sizes, calibration)
    model, name = _torch_model(model, config, name, progress)
    progress(_import_message(model, image_sizes))
    t0 = time.perf_counter()
    mod, meta = _import(model, image_sizes, layout, target, offset_trick_max_numel)
    _check_int8(plan.precision, image_sizes, calibration, meta)
    import_s = time.perf_counter() - t0
    progress(f"build for {target.kind.name}")
    t0 = time.perf_counter()  # import_detector converted the layout
    options = {**graph_options(model, fast), **precision_options(model, plan, kept, calibration)}
    executable = build(mod, target, layout=None, weights_at_load=True, **options).executable
    compile_s = time.perf_counter() - t0
    meta = {
        **{"kind": METADATA_KIND, "model": name or type(model).__name__},
        **meta,
        **{"layout": layout, "mode": build_mode(fast)},
        **plan.metadata(kept),
        **{"target": target_config(target), "import_s": import_s, "compile_s": compile_s},
    }
    return DetectorArtifact(executable, mod, meta, import_s, compile_s)


def _check_int8(precision: str, image_sizes, calibration, meta: dict | None = None) -> None:
    """One-line ValueErrors: ``calibration`` without int8; int8 for fixed sizes (the calibration
    runs the photo function of the artifact for any size), asked for or (``meta``) imported."""
    if calibration is not None and precision != "int8":
        raise ValueError(f"calibration applies to precision int8, not {precision}")
    if precision != "int8":
        return
    if image_sizes not in (None, ANY):
        raise ValueError(
            "precision int8: a detector is calibrated through its function for any size: "
            f"leave image_sizes as 'any', got {image_sizes!r}"
        )
    if meta is not None and not meta.get("any_size"):
        raise ValueError(
            "precision int8: a detector is calibrated through its function for any size; this "
            "exported detector serves fixed sizes: export it for any size or build it by name"
        )


def _import(model, image_sizes, layout: str, target, offset_trick_max_numel: int):
    """``(mod, meta)`` of the detector, with the photo function where the target serves it."""
    mod, meta = import_detector(
        model,
        image_sizes,
        layout=layout,
        offset_trick_max_numel=offset_trick_max_numel,
        float64=target.kind.name != "metal",  # Metal has no double
    )
    if serves_photos(meta, target):
        mod, meta = add_photo_function(mod, meta)
    return mod, meta


def _torch_model(model, config, name, progress):
    """``(model, name)``: a name of :data:`DETECTORS` built with ``config``, a ``.pt2`` path
    loaded, anything else as it is."""
    if isinstance(model, str) and model in DETECTORS:
        name = name or model
        progress(f"build torchvision {name}")
        return build_torch_detector(model, config), name
    if isinstance(model, (str, Path)):
        return load_program(Path(model)), name or Path(model).stem
    return model, name


def _import_message(model, image_sizes) -> str:
    if hasattr(model, "graph_signature"):
        return "export and import"
    if image_sizes in (None, ANY):
        return "export and import one function for every padded size"
    return f"export and import {len(bucket_sizes(model.transform, image_sizes))} padded size(s)"


#: TVM's detections against eager's (NumPy dicts from :class:`~tvm_roialign.runtime.Detector` and
#: :func:`torch_detections`), with ``passed``: :func:`tvm_roialign.models.compare.compare_detections`,
#: the package's one comparison (its criteria: :data:`tvm_roialign.models.compare.CRITERIA`).
compare = compare_detections
