"""The main job's report: TVM and PyTorch eager on one photo, compared and timed.

:func:`~.job.run_maskrcnn_report` returns a :class:`MaskRCNNReport`; :meth:`MaskRCNNReport.to_json`
is what ``result.json`` holds, with a ``schema`` entry giving a one-line description of every field (the
descriptions are the ``doc`` metadata of the dataclass fields below).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from dataclasses import dataclass, field

import numpy as np
import torch

from ..host import usable_cores
from ..models._torchvision import file_origin
from ..models.compare import CRITERIA, FAST_CRITERIA
from ..target import describe


def _doc(doc: str, default=None, factory=None, of=None):
    """A dataclass field with a one-line description (``of``: the dataclass of a dict's values)."""
    meta = {"doc": doc, "of": of}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class PieceTimes:
    tvm_import_s: float | None = _doc("torch.export + import into Relax + ConvertLayout, seconds")
    tvm_compile_s: float | None = _doc("TVM build of the imported module (tvm_roialign.pipeline), seconds")
    tvm_run_s: float | None = _doc("TVM run, seconds (best of the timed runs)")
    torch_run_s: float | None = _doc("PyTorch eager run of the same piece on the same rois, seconds")


@dataclass
class Totals:
    tvm_import_s: float = _doc("sum of the pieces' tvm_import_s")
    tvm_compile_s: float = _doc("sum of the pieces' tvm_compile_s")
    tvm_end_to_end_s: float | None = _doc("TVM detector on the photo, glue included, seconds (best)")
    tvm_glue_pytorch_s: float | None = _doc("PyTorch glue between TVM pieces (resize, NMS, paste), s")
    torch_eager_end_to_end_s: float | None = _doc("torchvision model([image]) eagerly, seconds (best)")
    onnxruntime_end_to_end_s: float | None = _doc(
        "ONNX Runtime on the whole model (torch.onnx.export, opset 17), seconds (best); null: not run"
    )
    onnxruntime_export_s: float | None = _doc("torch.onnx.export of the whole model, seconds")
    onnxruntime_max_box_diff: float | None = _doc(
        "largest box difference of ONNX Runtime's detections from eager's, input pixels"
    )


@dataclass
class Comparison:
    num_detections_tvm: int = _doc("detections of the TVM detector")
    num_detections_torch: int = _doc("detections of PyTorch eager")
    mode: str = _doc(
        "what is judged: exact (CRITERIA), fast (FAST_CRITERIA) or bf16 (compare_bf16.BF16_CRITERIA)",
        "exact",
    )
    same_labels: bool | None = _doc("exact: the paired detections have the same labels")
    reordered_pairs: int | None = _doc(
        "detections paired out of order (scores tied to float noise; paired by label + nearest box)"
    )
    max_box_diff: float | None = _doc("exact: largest box coordinate difference of the pairs, px")
    max_score_diff: float | None = _doc("largest score difference of the pairs")
    mask_pixel_agreement: float | None = _doc(
        "fraction of mask pixels equal after thresholding at 0.5 (fast: of the matched pairs)"
    )
    score_threshold: float | None = _doc("fast: detections scored at least this are matched")
    checked_torch: int | None = _doc("fast: eager's detections scored at least score_threshold")
    checked_tvm: int | None = _doc("fast: TVM's detections scored at least score_threshold")
    near_ties_torch: int | None = _doc("fast: of checked_torch, near ties (NMS's, the list's cut)")
    near_ties_tvm: int | None = _doc("fast: of checked_tvm, near ties (NMS's, the list's cut)")
    unmatched_torch: int | None = _doc("fast: of checked_torch, not found in TVM's")
    unmatched_tvm: int | None = _doc("fast: of checked_tvm, not found in eager's")
    min_box_iou: float | None = _doc("fast: least box IoU of the matched pairs")
    min_mask_iou: float | None = _doc("fast, bf16: least mask IoU of the matched pairs (at 0.5)")
    box_iou: float | None = _doc("bf16: least box IoU of a matched pair")
    confident_torch: int | None = _doc("bf16: eager's detections scored at least score_threshold")
    matched_torch: int | None = _doc("bf16: of confident_torch, matched in TVM's")
    confident_tvm: int | None = _doc("bf16: TVM's detections scored at least score_threshold")
    matched_tvm: int | None = _doc("bf16: of confident_tvm, matched in eager's")
    mean_mask_iou: float | None = _doc("bf16: mean mask IoU of the matched pairs (at 0.5)")
    passed: bool = _doc(
        f"TVM agrees with PyTorch eager by the mode's criteria; exact: {CRITERIA}; fast: {FAST_CRITERIA}"
    )
    criteria: str = _doc("what passed requires", CRITERIA)


@dataclass
class Transposes:
    per_piece: dict = _doc(
        "per piece: permute_dims before/after ConvertLayout, and next to RoIAlign", factory=dict
    )
    total_before: int = _doc("permute_dims in the imported graphs (constants folded)", 0)
    total_after: int = _doc("permute_dims after ConvertLayout", 0)
    adjacent_to_roi_align_before: int = _doc("permute_dims feeding or fed by RoIAlign, imported", 0)
    adjacent_to_roi_align_after: int = _doc("permute_dims feeding or fed by RoIAlign, converted", 0)


@dataclass
class RoiAlignTiming:
    per_head: dict = _doc(
        "per head: num_rois, ours_s, ours_per_level_s, stock_s, speedups, max_abs_diff_ours_vs_stock",
        factory=dict,
    )
    ours_s: float = _doc("our fused multiscale_roi_align in both heads, seconds")
    ours_per_level_s: float = _doc("ours run as one roi_align per FPN level (as stock must), s")
    stock_s: float = _doc("stock TVM roi_align, one per FPN level (rois pre-split), seconds")
    speedup: float = _doc("stock_s / ours_s")
    speedup_per_level: float = _doc("stock_s / ours_per_level_s: the kernel alone, same work split")
    share_of_heads: float | None = _doc("ours_s / TVM run time of the box and mask branches")
    share_of_tvm_end_to_end: float | None = _doc("ours_s / tvm_end_to_end_s")


@dataclass
class Environment:
    package_version: str = _doc("tvm-roialign version")
    tvm_version: str = _doc("apache-tvm version")
    tvm_ffi_version: str | None = _doc("apache-tvm-ffi version")
    torch_version: str = _doc("torch version")
    torchvision_version: str = _doc("torchvision version")
    cpu_model: str = _doc("this machine's CPU (/proc/cpuinfo model name)")
    llvm_system_cpu: str = _doc("LLVM's name for this CPU (the mcpu of the native target)")
    cpu_count: int = _doc("cores this process may run on")
    tvm_num_threads: str | None = _doc("TVM_NUM_THREADS (TVM's thread pool size)")
    torch_num_threads: int = _doc("torch.get_num_threads() for the eager runs")
    python: str = _doc("Python version")


@dataclass
class RunConfig:
    image: str = _doc("the photo (path, or scikit-image's astronaut)")
    weights: str = _doc("state_dict file, or how the random weights were made")
    seed: int | None = _doc("seed of the random weights (null with a weights file)")
    target: dict = _doc("the TVM target the pieces were built for", factory=dict)
    layout: str = _doc("NHWC (ConvertLayout of conv2d and RoIAlign) or NCHW", "NHWC")
    shapes: str = _doc(
        "any (one build serves every padded image size) or static (a build for this size)", "any"
    )
    mode: str = _doc("exact (direct 3x3 convolutions) or fast (Winograd)", "exact")
    precision: str = _doc("fp32 or bf16: the precision the pieces were built in", "fp32")
    min_size: int = _doc("torchvision resize min_size", 0)
    max_size: int = _doc("torchvision resize max_size", 0)
    proposals: int = _doc("RPN proposals kept (box-branch rois at most)", 0)
    detections_per_img: int = _doc("detections at most (mask-branch rois at most)", 0)
    box_score_thresh: float = _doc("torchvision's box score threshold", 0.0)
    repeat: int = _doc("timed runs (the best is reported)", 1)


@dataclass
class MaskRCNNReport:
    """Everything a ``maskrcnn`` run measured (see the ``doc`` of each field, or :meth:`schema`)."""

    config: RunConfig = _doc("what was run", of=RunConfig)
    environment: Environment = _doc("versions and machine", of=Environment)
    pieces: dict = _doc("per piece (backbone, box_branch, mask_branch)", factory=dict, of=PieceTimes)
    totals: Totals = _doc("sums and end-to-end times", of=Totals)
    transposes: Transposes = _doc("permute_dims left by ConvertLayout", of=Transposes)
    comparison: Comparison | None = _doc("TVM vs PyTorch eager detections", of=Comparison)
    roi_align: RoiAlignTiming | None = _doc("RoIAlign in the heads: ours vs stock TVM", of=RoiAlignTiming)
    num_proposals: int | None = _doc("proposals the box branch got")
    num_detections: int | None = _doc("detections of the TVM detector")
    compile_only: bool = _doc("only built (no run, no comparison)", False)
    detections: dict | None = field(default=None, metadata={"json": False})

    # ---------------------------------------------------------------------------------------------
    @classmethod
    def schema(cls) -> dict[str, str]:
        """``{"dotted.field.name": "one-line description"}`` for every JSON field."""
        return _schema(cls, "")

    def to_json(self) -> dict:
        """A JSON-able dict of every field but ``detections``, with ``schema`` last."""
        out = _jsonable(self)
        out["schema"] = self.schema()
        return out

    def write_json(self, path) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_json(), fh, indent=2)

    def caption(self) -> str:
        """One line for the picture: target, weights, and the check against PyTorch."""
        verdict = ""
        if self.comparison is not None:
            verdict = (
                f"; {'PASS' if self.comparison.passed else 'FAIL'} against PyTorch eager "
                f"({self.comparison.num_detections_tvm} detections)"
            )
        if self.config.seed is not None:
            weights = f"random weights (seed {self.config.seed})"
        else:
            weights = f"weights {file_origin(self.config.weights)}"
        return f"TVM {describe(self.config.target)} ({self.config.layout}), {weights}{verdict}"


def _schema(cls, prefix: str) -> dict[str, str]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("json") is False:
            continue
        name = f"{prefix}{f.name}"
        out[name] = f.metadata.get("doc", "")
        nested = f.metadata.get("of")
        if nested is not None:
            key = f"{name}.<piece>." if f.name == "pieces" else f"{name}."
            out.update(_schema(nested, key))
    return out


def _jsonable(obj):
    if dataclasses.is_dataclass(obj):
        return {
            f.name: _jsonable(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.metadata.get("json") is not False
        }
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.generic,)):
        return obj.item()
    return obj


# --------------------------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo; else what the platform module says)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "cpu model", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: The ISA flags (Linux /proc/cpuinfo names) that decide which kernels a runtime can use.
ISA_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
    "sve2",
)


def cpu_identity() -> dict:
    """``{"vendor", "model", "isa", "llvm_cpu"}``: the CPU's vendor and model name (Linux
    /proc/cpuinfo), which of :data:`ISA_FLAGS` it has, and LLVM's name for it."""
    import tvm

    vendor, flags = "", set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {
        "vendor": vendor or platform.system(),
        "model": cpu_model(),
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "llvm_cpu": str(tvm.target.codegen.llvm_get_system_cpu()),
    }


def environment() -> Environment:
    """Versions of the stack and the machine this process runs on."""
    import importlib.metadata

    import torchvision
    import tvm

    from .._version import __version__

    try:
        ffi = importlib.metadata.version("apache-tvm-ffi")
    except importlib.metadata.PackageNotFoundError:
        ffi = None
    return Environment(
        package_version=__version__,
        tvm_version=str(tvm.__version__),
        tvm_ffi_version=ffi,
        torch_version=str(torch.__version__),
        torchvision_version=str(torchvision.__version__),
        cpu_model=cpu_model(),
        llvm_system_cpu=str(tvm.target.codegen.llvm_get_system_cpu()),
        cpu_count=usable_cores(),
        tvm_num_threads=os.environ.get("TVM_NUM_THREADS"),
        torch_num_threads=torch.get_num_threads(),
        python=platform.python_version(),
    )


__all__ = [
    "ISA_FLAGS",
    "Comparison",
    "Environment",
    "MaskRCNNReport",
    "PieceTimes",
    "RoiAlignTiming",
    "RunConfig",
    "Totals",
    "Transposes",
    "cpu_identity",
    "cpu_model",
    "environment",
]
