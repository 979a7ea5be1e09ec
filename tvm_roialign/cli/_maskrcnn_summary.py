"""What ``maskrcnn`` prints: the TVM vs PyTorch table and one line per finding."""

from __future__ import annotations

import sys


def _seconds(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(peer, ours) -> str:
    """How many times faster TVM is than a peer (> 1: TVM is faster)."""
    return "-" if not peer or not ours else f"{peer / ours:.2f}x"


def print_summary(report, out, report_path) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..target import describe

    # a pipe or a log file gets the whole table, not one cut to 80 columns
    console = Console(width=None if sys.stdout.isatty() else 120)
    totals = report.totals
    ort = totals.onnxruntime_end_to_end_s
    peers = "PyTorch eager" + (" and ONNX Runtime" if ort is not None else "")
    table = Table(title=f"Mask R-CNN: TVM ({describe(report.config.target)}) vs {peers}")
    # seconds (best run) and speed-ups: eager/TVM > 1 means TVM is faster
    columns = ["piece", "import s", "compile s", "TVM s", "eager s", "eager/TVM"]
    if ort is not None:
        columns += ["ORT s", "ORT/TVM"]
    for name in columns:
        table.add_column(name, justify="left" if name == "piece" else "right")
    blank = ["-", "-"] if ort is not None else []
    for name, row in report.pieces.items():
        table.add_row(
            name,
            _seconds(row.tvm_import_s, 1),
            _seconds(row.tvm_compile_s, 1),
            _seconds(row.tvm_run_s, 3),
            _seconds(row.torch_run_s, 3),
            _ratio(row.torch_run_s, row.tvm_run_s),
            *blank,
        )
    table.add_row("glue (PyTorch)", "-", "-", _seconds(totals.tvm_glue_pytorch_s, 3), "-", "-", *blank)
    table.add_row(
        "end to end",
        _seconds(totals.tvm_import_s, 1),
        _seconds(totals.tvm_compile_s, 1),
        _seconds(totals.tvm_end_to_end_s, 3),
        _seconds(totals.torch_eager_end_to_end_s, 3),
        _ratio(totals.torch_eager_end_to_end_s, totals.tvm_end_to_end_s),
        *([_seconds(ort, 3), _ratio(ort, totals.tvm_end_to_end_s)] if ort is not None else []),
        style="bold",
    )
    console.print(table)
    cmp = report.comparison
    console.print(
        f"detections: TVM {cmp.num_detections_tvm}, PyTorch {cmp.num_detections_torch}; "
        f"{_comparison_details(cmp)} -> {'PASS' if cmp.passed else 'FAIL'}"
        + (
            " (no detections to compare: lower --score-thresh or use another --seed)"
            if cmp.num_detections_tvm == 0
            else ""
        ),
        highlight=False,
        soft_wrap=True,
    )
    if totals.onnxruntime_max_box_diff is not None:
        console.print(
            f"ONNX Runtime vs PyTorch eager: max box diff {totals.onnxruntime_max_box_diff:.2e} px",
            highlight=False,
            soft_wrap=True,
        )
    perm = report.transposes
    console.print(
        f"permute_dims before/after ConvertLayout: {perm.total_before} / {perm.total_after}; "
        f"adjacent to roi_align after: {perm.adjacent_to_roi_align_after}",
        highlight=False,
        soft_wrap=True,
    )
    roi = report.roi_align
    if roi:
        share = (
            "" if roi.share_of_heads is None else f"; share of TVM head time {100 * roi.share_of_heads:.1f}%"
        )
        console.print(
            f"roi_align in the heads: ours (fused multiscale op) {roi.ours_s * 1e3:.2f} ms, "
            f"stock TVM (per level) {roi.stock_s * 1e3:.2f} ms ({roi.speedup:.1f}x; ours per "
            f"level {roi.ours_per_level_s * 1e3:.2f} ms, {roi.speedup_per_level:.1f}x){share}",
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"wrote {out} and {report_path}", highlight=False, soft_wrap=True)


def _comparison_details(cmp) -> str:
    """What the comparison of the build's mode measured, in words."""
    if cmp.mode == "bf16":
        return (
            f"bf16 build against fp32 (PyTorch eager): scored >= {cmp.score_threshold:g} and "
            f"matched at box IoU >= {cmp.box_iou:g}: PyTorch {cmp.matched_torch}/{cmp.confident_torch}, "
            f"TVM {cmp.matched_tvm}/{cmp.confident_tvm}{_bf16_pairs(cmp)}"
        )
    if cmp.mode == "fast":
        return (
            f"fast build: scored >= {cmp.score_threshold:g}: {cmp.checked_torch} in PyTorch "
            f"({cmp.unmatched_torch} unmatched), {cmp.checked_tvm} in TVM ({cmp.unmatched_tvm} "
            f"unmatched); least box IoU {cmp.min_box_iou:.4f}, least mask IoU {cmp.min_mask_iou:.4f}, "
            f"mask pixels equal {100 * cmp.mask_pixel_agreement:.4f}%"
        )
    return (
        f"same labels: {cmp.same_labels}; max box diff {cmp.max_box_diff:.2e} px; "
        f"mask pixels equal {100 * cmp.mask_pixel_agreement:.4f}%"
    )


def _bf16_pairs(cmp) -> str:
    """A bf16 comparison's matched pairs, in words (or why there are none)."""
    if not cmp.confident_torch:
        return f"; nothing scored >= {cmp.score_threshold:g} on the fp32 side to compare"
    if cmp.mean_mask_iou is None:
        return ""
    return (
        f"; matched pairs: mask IoU min {cmp.min_mask_iou:.3f} mean {cmp.mean_mask_iou:.3f}, "
        f"largest score difference {cmp.max_score_diff:.4f}"
    )


def print_compile_only(report, report_path) -> None:
    from ..target import describe

    total = sum(p.tvm_compile_s for p in report.pieces.values())
    print(
        f"compiled Mask R-CNN for {describe(report.config.target)} ({report.config.layout}) in "
        f"{total:.1f} s (import {report.totals.tvm_import_s:.1f} s); permute_dims next to roi_align: "
        f"{report.transposes.adjacent_to_roi_align_after}; wrote {report_path}"
    )
