"""The main job: the TVM detector and PyTorch eager on one photo, into a :class:`~.report.MaskRCNNReport`.

:class:`JobConfig` says how it runs (the ``maskrcnn`` command's flags); the detections are judged by
the package's comparison of the build's mode, :func:`tvm_roialign.models.compare.compare_for_mode`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..models.compare import compare_for_mode, model_limits
from ..models.compare_bf16 import compare_bf16
from ..models.detector_sizes import DEFAULT_FAST, build_mode
from ..models.maskrcnn.detector import TVMMaskRCNN
from ..models.maskrcnn.pieces import PIECE_NAMES
from ..models.maskrcnn.torch_model import DEFAULT_IMAGE, MaskRCNNConfig
from ..target import target_config
from .onnxruntime_peer import max_box_diff
from .report import (
    Comparison,
    MaskRCNNReport,
    PieceTimes,
    RoiAlignTiming,
    RunConfig,
    Totals,
    Transposes,
    environment,
)
from .timing import time_roi_align, time_torch_pieces


@dataclass
class JobConfig:
    """How :func:`run_maskrcnn_report` and :func:`compile_maskrcnn_report` run.

    ``target``: anything :func:`~tvm_roialign.target.parse_target` takes (None: ``native``);
    ``layout``: NHWC or NCHW; ``repeat``: timed runs after a warm-up (the best is reported);
    ``roi_timing``: time RoIAlign ours vs stock TVM; ``onnxruntime``: time ONNX Runtime too;
    ``tuning_records``, ``shapes``, ``fast``, ``precision`` and ``fp32_layers`` as
    :class:`~tvm_roialign.models.maskrcnn.TVMMaskRCNN` takes them;
    ``model`` and ``image_name`` (how the model and photo were made) only fill ``report.config``.
    """

    target: object = None
    layout: str = "NHWC"
    repeat: int = 2
    roi_timing: bool = True
    onnxruntime: bool = True
    tuning_records: object = None
    model: MaskRCNNConfig | None = None
    image_name: str | None = None
    shapes: str | None = None
    fast: bool = DEFAULT_FAST
    precision: str = "fp32"
    fp32_layers: object = None


def _transposes(detector: TVMMaskRCNN) -> Transposes:
    per_piece = detector.permute_counts()

    def total(key):
        return sum(p[key] for p in per_piece.values())

    return Transposes(
        per_piece=per_piece,
        total_before=total("before"),
        total_after=total("after"),
        adjacent_to_roi_align_before=total("adjacent_to_roi_align_before"),
        adjacent_to_roi_align_after=total("adjacent_to_roi_align_after"),
    )


def _run_config(job: JobConfig, detector, repeat) -> RunConfig:
    config = job.model or MaskRCNNConfig()
    return RunConfig(
        image=job.image_name or DEFAULT_IMAGE,
        weights=config.describe_weights(),
        seed=config.seed if config.weights is None else None,
        target=target_config(detector.target),
        layout=job.layout,
        shapes=detector.shapes,
        mode=build_mode(job.fast),
        precision=detector.precision,
        min_size=config.min_size,
        max_size=config.max_size,
        proposals=config.rpn_post_nms_top_n_test,
        detections_per_img=config.box_detections_per_img,
        box_score_thresh=config.box_score_thresh,
        repeat=repeat,
    )


def _compiled_detector(model, image, job: JobConfig, progress):
    """The detector for ``job``'s target, its pieces built for ``image``'s padded size."""
    detector = TVMMaskRCNN(
        model, job.target, job.layout, progress, job.tuning_records, job.shapes, fast=job.fast,
        precision=job.precision, fp32_layers=job.fp32_layers,
    )
    with torch.no_grad():
        image_list, _ = model.transform([image])
    return detector, detector.compile(image_list.tensors.shape)


def compile_maskrcnn_report(model, image, job: JobConfig | None = None, progress=None) -> MaskRCNNReport:
    """Only build the three pieces for ``job.target`` (any target, also one this machine cannot
    run)."""
    job = job or JobConfig()
    detector, pieces = _compiled_detector(model, image, job, progress)
    return MaskRCNNReport(
        config=_run_config(job, detector, 0),
        environment=environment(),
        pieces={n: PieceTimes(p.import_s, p.compile_s) for n, p in pieces.items()},
        totals=Totals(
            tvm_import_s=sum(p.import_s for p in pieces.values()),
            tvm_compile_s=sum(p.compile_s for p in pieces.values()),
        ),
        transposes=_transposes(detector),
        compile_only=True,
    )


def run_maskrcnn_report(model, image, job: JobConfig | None = None, progress=None) -> MaskRCNNReport:
    """Run the TVM detector, PyTorch eager and (``job.onnxruntime``) ONNX Runtime on ``image``, runs
    interleaved, and gather a :class:`MaskRCNNReport` (best of ``job.repeat`` after a warm-up run).

    ``report.detections`` holds the TVM detections (tensors) for drawing; ``report.comparison``
    is :func:`~tvm_roialign.models.compare.compare_for_mode` against eager (``CRITERIA``, or
    ``FAST_CRITERIA`` for a fast build).
    """
    job = job or JobConfig()
    progress = progress or (lambda _msg: None)
    repeat = max(int(job.repeat), 1)
    detector, pieces = _compiled_detector(model, image, job, progress)
    peer = None
    if job.onnxruntime:
        from .onnxruntime_peer import OnnxRuntimeDetector

        progress("ONNX Runtime: torch.onnx.export and session")
        peer = OnnxRuntimeDetector(model, image)
    timed = _timed_runs(detector, model, peer, image, repeat, progress)
    last = timed.runs[-1]
    progress("PyTorch eager pieces")
    torch_s = time_torch_pieces(model, image, last.proposals, last.detection_boxes, repeat)
    cmp = _comparison(detector, model, last.detections, timed.ref, job)

    def best_piece(name):
        times = [r.piece_s[name] for r in timed.runs if name in r.piece_s]
        return min(times) if times else None

    report = MaskRCNNReport(
        config=_run_config(job, detector, repeat),
        environment=environment(),
        pieces={
            name: PieceTimes(p.import_s, p.compile_s, best_piece(name), torch_s[f"{name}_s"])
            for name, p in pieces.items()
        },
        totals=_totals(pieces, timed, peer),
        transposes=_transposes(detector),
        comparison=Comparison(**cmp),
        num_proposals=int(last.proposals.shape[0]),
        num_detections=int(last.detections["boxes"].shape[0]),
        detections=last.detections,
    )
    if job.roi_timing:
        report.roi_align = _roi_timing(model, detector, last, report, progress, repeat)
    return report


def _comparison(detector, model, detections, ref, job: JobConfig) -> dict:
    """The TVM detections against eager's by the build's criteria: a bf16 build's by
    :func:`~tvm_roialign.models.compare_bf16.compare_bf16` (eager is the fp32 reference), else
    the mode's (:func:`~tvm_roialign.models.compare.compare_for_mode`)."""
    if detector.precision == "bf16":
        return compare_bf16(detections, ref)
    return compare_for_mode(detections, ref, build_mode(job.fast), **model_limits(model))


@dataclass
class _TimedRuns:
    """``repeat`` interleaved runs: TVM's (with its pieces), end to end, eager's, ONNX Runtime's."""

    runs: list = field(default_factory=list)
    totals: list = field(default_factory=list)
    eager: list = field(default_factory=list)
    ort_s: list = field(default_factory=list)
    ref: dict | None = None
    ort_out: dict | None = None


def _timed_runs(detector, model, peer, image, repeat, progress) -> _TimedRuns:
    # warm-up runs (first calls allocate), then the three interleaved so that a slow minute on a
    # shared machine slows all of them
    progress("warm-up runs")
    detector.run(image)
    with torch.no_grad():
        model([image])
    if peer is not None:
        peer(image)
    timed = _TimedRuns()
    for i in range(repeat):
        progress(f"timed run {i + 1}/{repeat}: TVM, PyTorch eager" + (", ONNX Runtime" if peer else ""))
        t0 = time.perf_counter()
        timed.runs.append(detector.run(image))
        timed.totals.append(time.perf_counter() - t0)
        with torch.no_grad():
            t0 = time.perf_counter()
            (timed.ref,) = model([image])
            timed.eager.append(time.perf_counter() - t0)
        if peer is not None:
            t0 = time.perf_counter()
            timed.ort_out = peer(image)
            timed.ort_s.append(time.perf_counter() - t0)
    return timed


def _totals(pieces, timed: _TimedRuns, peer) -> Totals:
    return Totals(
        tvm_import_s=sum(p.import_s for p in pieces.values()),
        tvm_compile_s=sum(p.compile_s for p in pieces.values()),
        tvm_end_to_end_s=min(timed.totals),
        tvm_glue_pytorch_s=min(r.glue_s for r in timed.runs),
        torch_eager_end_to_end_s=min(timed.eager),
        onnxruntime_end_to_end_s=min(timed.ort_s) if timed.ort_s else None,
        onnxruntime_export_s=peer.export_s if peer else None,
        onnxruntime_max_box_diff=max_box_diff(timed.ort_out, timed.ref) if peer else None,
    )


def _roi_timing(model, detector, run, report, progress, repeat) -> RoiAlignTiming | None:
    heads = model.roi_heads
    per_head = {}
    for name, pooler, rois in (
        ("box_branch", heads.box_roi_pool, run.proposals),
        ("mask_branch", heads.mask_roi_pool, run.detection_boxes),
    ):
        if rois is None or len(rois) == 0:
            continue
        progress(f"time roi_align of {name}: ours vs stock TVM")
        per_head[name] = time_roi_align(
            run.features,
            rois,
            pooler,
            detector.layout,
            detector.target,
            run.image_size,
            max(repeat, 10),
        )
    if not per_head:
        return None
    ours_s = sum(r["ours_s"] for r in per_head.values())
    stock_s = sum(r["stock_s"] for r in per_head.values())
    levels_s = sum(r["ours_per_level_s"] for r in per_head.values())
    heads_s = sum(report.pieces[n].tvm_run_s or 0.0 for n in PIECE_NAMES[1:])
    end_to_end = report.totals.tvm_end_to_end_s
    return RoiAlignTiming(
        per_head=per_head,
        ours_s=ours_s,
        ours_per_level_s=levels_s,
        stock_s=stock_s,
        speedup=stock_s / ours_s if ours_s > 0 else float("inf"),
        speedup_per_level=stock_s / levels_s if levels_s > 0 else float("inf"),
        share_of_heads=ours_s / heads_s if heads_s > 0 else None,
        share_of_tvm_end_to_end=ours_s / end_to_end if end_to_end else None,
    )


__all__ = ["JobConfig", "compile_maskrcnn_report", "run_maskrcnn_report"]
