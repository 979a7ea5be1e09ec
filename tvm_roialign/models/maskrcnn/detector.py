"""The detector: the three pieces built with TVM, and torchvision's own glue between them.

:class:`TVMMaskRCNN` is called like the torchvision model in eval mode. :meth:`TVMMaskRCNN.run`
returns a :class:`DetectionRun`: the detections together with what the pieces got (feature maps,
proposals, detection boxes) and how long each step took, for reports and timings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import tvm
from tvm import relax

from ...host import use_usable_cores
from ...passes import ConvertLayout, desired_layouts
from ...pipeline import build
from ...precision.layers import detector_plan, precision_options
from ...target import describe, device_or_none, parse_target
from ..detection import DEFAULT_FAST, graph_options
from .pieces import (
    count_permutes,
    export_piece,
    permutes_adjacent_to_roi_align,
    piece_modules,
    static_rois,
)
from .torch_threads import torch_threads

#: ConvertLayout's desired layouts for the NHWC build (conv2d and both RoIAlign ops).
DEFAULT_LAYOUTS = desired_layouts("NHWC")

_NUM_LEVELS = 5  # FPN maps the backbone returns (P2-P6): the RPN sees all, the poolers P2-P5

#: ``shapes`` of :class:`TVMMaskRCNN`: one build for every padded image size, or one per size.
SHAPES = ("any", "static")

#: Padded image sides (pixels) the one-build pieces take: ``torch.export`` needs a range, and its
#: guards need more than 64 (P6 of a side <= 64 is a single pixel, a specialisation).
SYMBOLIC_SIDES = (96, 4096)
_ANY = "any"  # the key of the one-build pieces in ``TVMMaskRCNN.pieces``


@dataclass
class Piece:
    """One compiled graph: its Relax modules before/after ConvertLayout, executable and build times.

    Calling it runs ``main`` on NumPy arrays and returns a list of NumPy arrays; the virtual machine
    is made on first call, so that a build for a device this machine lacks (cuda, metal, a cross
    target) can still be made and inspected.
    """

    name: str
    mod_imported: tvm.IRModule
    mod: tvm.IRModule
    executable: object
    device: object
    import_s: float
    compile_s: float
    _vm: object = None

    @property
    def vm(self) -> relax.VirtualMachine:
        if self._vm is None:
            if self.device is None:
                raise RuntimeError(f"{self.name}: this machine cannot run the build's target")
            self._vm = relax.VirtualMachine(self.executable, self.device)
        return self._vm

    def __call__(self, *arrays) -> list[np.ndarray]:
        vm = self.vm
        args = [tvm.runtime.tensor(np.ascontiguousarray(a), self.device) for a in arrays]
        out = vm["main"](*args)
        return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


@dataclass
class DetectionRun:
    """One image through :class:`TVMMaskRCNN`.

    ``detections`` is torchvision's output format (``boxes [D, 4]`` in input pixels, ``labels [D]``,
    ``scores [D]``, ``masks [D, 1, H, W]`` probabilities); ``features`` the four FPN maps the
    branches pooled from (io layout); ``proposals [K, 4]`` and ``detection_boxes [D, 4]`` the rois
    of the box and mask branches (transformed-image pixels); ``image_size`` the transformed image's
    ``(H, W)``; ``piece_s`` seconds per TVM piece; ``glue_s`` seconds of the PyTorch glue.
    """

    detections: dict
    features: list = field(default_factory=list)
    proposals: np.ndarray | None = None
    detection_boxes: np.ndarray | None = None
    image_size: tuple[int, int] = (0, 0)
    piece_s: dict = field(default_factory=dict)
    glue_s: float = 0.0


def convert_layout(mod: tvm.IRModule, layout: str, layouts: dict | None = None) -> tvm.IRModule:
    """``mod`` with tvm-roialign's ConvertLayout to ``layout`` (NCHW: unchanged)."""
    if layout == "NCHW":
        return mod
    return ConvertLayout(layouts or desired_layouts(layout))(mod)


class TVMMaskRCNN:
    """torchvision Mask R-CNN with its static graphs compiled by TVM.

    Call it like the torchvision model in eval mode: ``detector([image])`` with images ``[3, H, W]``
    float tensors in [0, 1] returns one dict per image with ``boxes [D, 4]`` (x1, y1, x2, y2 in
    input pixels), ``labels [D]`` (int64), ``scores [D]`` and ``masks [D, 1, H, W]`` (probabilities).

    Parameters
    ----------
    model : torchvision MaskRCNN
        In eval mode (see :func:`~.torch_model.build_torch_model`).
    target : str | dict | tvm.target.Target | None
        Anything :func:`tvm_roialign.target.parse_target` takes: a short name (``"native"``,
        ``"llvm-generic"``, ``"aarch64"``, ``"cuda"``...), a tvmc string, a JSON/dict target or a
        Target; parsed once, here. Default (None): ``native``, this machine's CPU.
    layout : str
        ``"NHWC"`` (ConvertLayout of conv2d and RoIAlign) or ``"NCHW"`` (as imported).
    progress : callable(str) or None
        Called with a line of text before each step (compile, run).
    tuning_records : str, os.PathLike, tvm_roialign.tuning.TuningRecords or None
        A MetaSchedule database (``tvm-roialign tune maskrcnn``) for llvm targets: its records
        schedule the tasks they cover, the default rules the rest; each piece's coverage is
        reported labelled with the piece's name (see :class:`~tvm_roialign.tuning.TuningRecords`).
    shapes : ``"any"``, ``"static"`` or None
        ``"any"``: one build serves every padded image size (the backbone exported with a symbolic
        height and width, the branches with symbolic feature-map sizes; the roi counts stay
        static); sides outside :data:`SYMBOLIC_SIDES` get a build of their own size.
        ``"static"``: a build per padded image size (its kernels tiled for that size). Default
        (None): ``"any"``, or ``"static"`` with ``tuning_records`` (tuned for one image size).
    fast : bool
        True (the default, :data:`~tvm_roialign.models.detector_sizes.DEFAULT_FAST`): Winograd
        3x3 convolutions, detections within :data:`~tvm_roialign.models.compare.FAST_CRITERIA` of
        eager's; False: direct 3x3 convolutions, detections equal to eager's
        (:data:`~tvm_roialign.models.compare.CRITERIA`).
    glue_threads : int or None
        PyTorch's intra-op threads while :meth:`run` runs (restored after it; None: PyTorch's own
        setting). Default 1: the glue's operations are small, and PyTorch's OpenMP threads, which
        wait actively between parallel regions, slow both the glue and the TVM pieces after it
        many times over on a busy machine (see docs/pipeline.md, "Threads and registration").
    precision, fp32_layers : str, str or list of str or None
        As :func:`~tvm_roialign.models.detection.compile_detector` takes them (``"fp32"``,
        ``"bf16"``, ``"auto"``; the bf16 layers kept in fp32).

    Graphs are compiled on first use (``compile(image_shape)`` to do it ahead): once, or once per
    padded image size with ``shapes="static"``. Building for a target that this machine cannot run
    (aarch64 cross, CUDA without a GPU) is possible with :meth:`compile`, running is not.
    """

    def __init__(
        self,
        model,
        target=None,
        layout: str = "NHWC",
        progress: Callable | None = None,
        tuning_records=None,
        shapes: str | None = None,
        *,
        fast: bool = DEFAULT_FAST,
        glue_threads: int | None = 1,
        precision: str = "fp32",
        fp32_layers=None,
    ):
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
        if shapes is None:
            shapes = "static" if tuning_records is not None else _ANY
        if shapes not in SHAPES:
            raise ValueError(f"shapes must be one of {SHAPES}, got {shapes!r}")
        self.shapes = shapes
        self.fast = bool(fast)
        if glue_threads is not None and int(glue_threads) < 1:
            raise ValueError(f"glue_threads must be a positive integer or None, got {glue_threads!r}")
        self.glue_threads = glue_threads
        use_usable_cores()  # TVM's pool, before constant folding runs the first kernel
        self.model = model
        self.target = parse_target(target)
        self.plan, kept = detector_plan(precision, self.target, fp32_layers, pieces=True)
        self.precision = self.plan.precision
        self.options = precision_options(model, self.plan, kept)
        self.layout = layout
        self.device = device_or_none(self.target)
        self.progress = progress or (lambda _msg: None)
        self.pieces: dict[tuple, dict[str, Piece]] = {}
        self.tuning_records = None
        if tuning_records is not None:
            from ...tuning import TuningRecords, load_records

            self.tuning_records = (
                tuning_records
                if isinstance(tuning_records, TuningRecords)
                else load_records(tuning_records, self.target)
            )
            self.tuning_records.check(self.target)

    def padded_shape(self, image) -> tuple[int, ...]:
        """The ``[1, 3, H, W]`` the model's transform makes of ``image`` (what the graphs are for)."""
        with torch.no_grad():
            image_list, _ = self.model.transform([image])
        return tuple(int(s) for s in image_list.tensors.shape)

    def symbolic(self, padded_shape: Sequence[int]) -> bool:
        """Whether the one-build pieces serve a padded ``[1, 3, H, W]`` (``shapes="any"`` and both
        sides within :data:`SYMBOLIC_SIDES`)."""
        low, high = SYMBOLIC_SIDES
        return self.shapes == _ANY and all(low <= int(s) <= high for s in padded_shape[-2:])

    # ---------------------------------------------------------------------------------------------
    def compile(self, padded_shape: Sequence[int]) -> dict[str, Piece]:
        """The three graphs that serve a padded ``[1, 3, H, W]``: exported, imported,
        ConvertLayout-ed and built on first use (with ``shapes="any"``, one build for all sizes)."""
        shape = tuple(int(s) for s in padded_shape)
        key = _ANY if self.symbolic(shape) else shape
        if key in self.pieces:
            return self.pieces[key]
        pieces = {}
        for name, (imported, mod, import_s) in self.relax_modules(shape).items():
            self.progress(f"compile {name} for {describe(self.target)} ({self.layout})")
            t0 = time.perf_counter()
            records = self.tuning_records.labelled(name) if self.tuning_records else None
            # layout=None: relax_modules converted the layout
            executable = build(
                mod,
                self.target,
                tuning_records=records,
                layout=None,
                **graph_options(self.model, self.fast),
                **self.options,
            ).executable
            compile_s = time.perf_counter() - t0
            pieces[name] = Piece(name, imported, mod, executable, self.device, import_s, compile_s)
        self.pieces[key] = pieces
        return pieces

    def relax_modules(self, padded_shape: Sequence[int]) -> dict[str, tuple]:
        """Per piece, ``(imported module, module to build, import seconds)`` for a padded
        ``[1, 3, H, W]`` (symbolic sizes when :meth:`symbolic`): exported, imported and
        ConvertLayout-ed (what ``compile`` builds and ``tvm-roialign tune maskrcnn`` tunes)."""
        from ...frontend import from_exported_program
        from ...passes import WrapTakes

        key = tuple(int(s) for s in padded_shape)
        symbolic = self.symbolic(key)
        backbone, box_branch, mask_branch = piece_modules(self.model, self.layout, key[-2:])
        images = torch.zeros(key)
        with torch.no_grad():
            feats = backbone(images)[:4]
        boxes = torch.tensor([[10.0, 12.0, 200.0, 180.0], [0.0, 0.0, 60.0, 40.0]])
        max_proposals, max_detections = self.roi_bounds()
        dims = symbolic_dims(self.layout) if symbolic else {}
        modules = {}
        for name, module, args in (
            ("backbone", backbone, (images,)),
            ("box_branch", box_branch, (*feats, boxes.repeat(max_proposals, 1)[:max_proposals])),
            ("mask_branch", mask_branch, (*feats, boxes.repeat(max_detections, 1)[:max_detections])),
        ):
            self.progress(f"import {name}")
            t0 = time.perf_counter()
            exported = export_piece(module, args, dims.get(name))
            # constants folded first, so that the counts of permute_dims (before/after) are those
            # of activations, not of weights
            fold = relax.transform.FoldConstant()
            imported = fold(WrapTakes()(from_exported_program(exported, keep_params_as_input=False)))
            mod = fold(convert_layout(imported, self.layout))
            modules[name] = (imported, mod, time.perf_counter() - t0)
        return modules

    def roi_bounds(self) -> tuple[int, int]:
        """Static roi counts of the box and mask branches: the model's proposals and detections
        (the glue pads the rois to them with zero boxes and drops the extra rows)."""
        return (
            int(self.model.rpn._post_nms_top_n["testing"]),
            int(self.model.roi_heads.detections_per_img),
        )

    # ---------------------------------------------------------------------------------------------
    def __call__(self, images) -> list[dict]:
        return [self.run(image).detections for image in images]

    def _piece(self, run: DetectionRun, pieces, name: str, *arrays) -> list[np.ndarray]:
        self.progress(f"run {name.replace('_', ' ')}")
        t0 = time.perf_counter()
        outs = pieces[name](*arrays)
        run.piece_s[name] = time.perf_counter() - t0
        return outs

    def _nchw(self, array: np.ndarray):
        tensor = torch.from_numpy(array)
        return tensor.permute(0, 3, 1, 2) if self.layout == "NHWC" else tensor

    def run(self, image) -> DetectionRun:
        """Detect on one image ``[3, H, W]``; the detections and what the pieces got."""
        with torch_threads(self.glue_threads):
            return self._run(image)

    def _run(self, image) -> DetectionRun:
        run = DetectionRun(detections={})
        t0 = time.perf_counter()
        with torch.no_grad():
            image_list, _ = self.model.transform([image])
        run.glue_s += time.perf_counter() - t0
        run.image_size = tuple(image_list.image_sizes[0])
        pieces = self.compile(image_list.tensors.shape)
        proposals = self._proposals(run, pieces, image_list)
        if run.proposals.shape[0] == 0:
            run.detection_boxes = np.zeros((0, 4), "float32")
            run.detections = {
                "boxes": torch.zeros((0, 4)),
                "labels": torch.zeros((0,), dtype=torch.int64),
                "scores": torch.zeros((0,)),
                "masks": torch.zeros((0, 1, *image.shape[1:])),
            }
            return run
        result = self._boxes(run, pieces, image_list, proposals)
        run.detections = self._masks(run, pieces, image_list, result, tuple(image.shape[-2:]))
        return run

    def _proposals(self, run: DetectionRun, pieces, image_list):
        """The backbone piece, then torchvision's RPN glue: the proposals (``run.proposals``)."""
        from torchvision.models.detection.rpn import concat_box_prediction_layers

        outs = self._piece(run, pieces, "backbone", image_list.tensors.numpy())
        feats_io = outs[:_NUM_LEVELS]
        run.features = feats_io[:4]
        objectness = [self._nchw(o) for o in outs[_NUM_LEVELS : 2 * _NUM_LEVELS]]
        deltas = [self._nchw(o) for o in outs[2 * _NUM_LEVELS :]]
        t0 = time.perf_counter()
        with torch.no_grad():
            rpn = self.model.rpn
            anchors = rpn.anchor_generator(image_list, [self._nchw(f) for f in feats_io])
            num_anchors_per_level = [o[0].numel() for o in objectness]
            obj_flat, deltas_flat = concat_box_prediction_layers(objectness, deltas)
            proposals = rpn.box_coder.decode(deltas_flat, anchors).view(1, -1, 4)
            proposals, _scores = rpn.filter_proposals(
                proposals, obj_flat, image_list.image_sizes, num_anchors_per_level
            )
        run.glue_s += time.perf_counter() - t0
        run.proposals = proposals[0].numpy()
        return proposals

    def _boxes(self, run: DetectionRun, pieces, image_list, proposals) -> dict:
        """The box branch piece, then torchvision's box post-processing (``run.detection_boxes``)."""
        max_proposals, _ = self.roi_bounds()
        num = run.proposals.shape[0]
        class_logits, box_regression = (
            out[:num]
            for out in self._piece(
                run, pieces, "box_branch", *run.features, static_rois(run.proposals, max_proposals)
            )
        )
        t0 = time.perf_counter()
        with torch.no_grad():
            boxes, scores, labels = self.model.roi_heads.postprocess_detections(
                torch.from_numpy(class_logits),
                torch.from_numpy(box_regression),
                proposals,
                image_list.image_sizes,
            )
        run.glue_s += time.perf_counter() - t0
        run.detection_boxes = boxes[0].numpy()
        return {"boxes": boxes[0], "labels": labels[0], "scores": scores[0]}

    def _masks(self, run: DetectionRun, pieces, image_list, result: dict, photo_size) -> dict:
        """The mask branch piece (when there are detections), then torchvision's mask inference and
        the transform's postprocess to the photo's size: its box rescaling, and the masks pasted by
        the runner's NumPy paste (:func:`tvm_roialign.runtime.masks.paste_masks`: torchvision's
        ``paste_masks_in_image`` arithmetic, within 1.2e-7 of it and about 6x faster on 100 masks,
        where torchvision's was two thirds of the glue)."""
        from torchvision.models.detection.roi_heads import maskrcnn_inference
        from torchvision.models.detection.transform import resize_boxes

        from ...runtime.masks import paste_masks

        _, max_detections = self.roi_bounds()
        if result["boxes"].shape[0] > 0:
            (mask_logits,) = self._piece(
                run,
                pieces,
                "mask_branch",
                *run.features,
                static_rois(run.detection_boxes, max_detections),
            )
            mask_logits = mask_logits[: run.detection_boxes.shape[0]]
            t0 = time.perf_counter()
            with torch.no_grad():
                (mask_probs,) = maskrcnn_inference(torch.from_numpy(mask_logits), [result["labels"]])
        else:
            t0 = time.perf_counter()
            mask_probs = torch.zeros((0, 1, 28, 28))
        with torch.no_grad():
            boxes = resize_boxes(result["boxes"], image_list.image_sizes[0], photo_size)
            masks = paste_masks(mask_probs[:, 0].numpy(), boxes.numpy(), *photo_size)
        run.glue_s += time.perf_counter() - t0
        return {**result, "boxes": boxes, "masks": torch.from_numpy(masks)[:, None]}

    # ---------------------------------------------------------------------------------------------
    def permute_counts(self) -> dict:
        """Per piece: permute_dims before/after ConvertLayout and next to RoIAlign after it."""
        out = {}
        for pieces in self.pieces.values():
            for name, piece in pieces.items():
                out[name] = {
                    "before": count_permutes(piece.mod_imported),
                    "after": count_permutes(piece.mod),
                    "adjacent_to_roi_align_before": permutes_adjacent_to_roi_align(piece.mod_imported),
                    "adjacent_to_roi_align_after": permutes_adjacent_to_roi_align(piece.mod),
                }
        return out


def symbolic_dims(layout: str) -> dict[str, dict]:
    """Per piece, the ``dynamic_shapes`` of its one-build export: the image's height and width
    (within :data:`SYMBOLIC_SIDES`), and each of the four pooled feature maps' height and width
    (a variable of its own per level: the branches need no relation between them)."""
    from torch.export import Dim

    low, high = SYMBOLIC_SIDES
    axes = (1, 2) if layout == "NHWC" else (2, 3)
    levels = {}
    for level in range(4):
        stride = 4 << level
        levels[f"p{level}"] = {
            axis: Dim(f"{side}{level}", min=-(-low // stride), max=-(-high // stride))
            for axis, side in zip(axes, "hw")
        }
    branch = {**levels, "boxes": None}
    return {
        "backbone": {"images": {2: Dim("height", min=low, max=high), 3: Dim("width", min=low, max=high)}},
        "box_branch": branch,
        "mask_branch": branch,
    }


__all__ = [
    "DEFAULT_LAYOUTS",
    "SHAPES",
    "SYMBOLIC_SIDES",
    "DetectionRun",
    "Piece",
    "TVMMaskRCNN",
    "convert_layout",
    "symbolic_dims",
    "torch_threads",
]
