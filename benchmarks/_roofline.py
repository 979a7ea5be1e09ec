"""The roofline's two numbers for a benchmark table: a model's operations per call, and this
machine's matrix peak per precision measured in the same run (``torch.mm`` of 4096 x 4096 in fp32
and bf16, ``torch._int_mm`` in int8: oneDNN's kernels, on the run's threads; smaller where one
product would take long)."""

from __future__ import annotations

import math
import time

#: the matrix side of the peak measurement
PEAK_SIDE = 4096


def model_gflop(model, inputs) -> float:
    """GFLOP (multiply-adds counted as 2) of one eager call, by PyTorch's FlopCounterMode."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(*inputs)
    return counter.get_total_flops() / 1e9


def _product(precision: str, side: int):
    """A ``side`` x ``side`` matrix product of ``precision`` as a function of no arguments."""
    import torch

    if precision == "int8":
        a = torch.randint(-128, 127, (side, side), dtype=torch.int8)
        b = torch.randint(-128, 127, (side, side), dtype=torch.int8)
        return lambda: torch._int_mm(a, b)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    a, b = torch.randn(side, side, dtype=dtype), torch.randn(side, side, dtype=dtype)
    return lambda: torch.mm(a, b)


def _sized_product(precision: str, seconds: float):
    """``(side, product)``: from 256, the side doubled up to :data:`PEAK_SIDE` while one product takes
    under an eighth of ``seconds`` (a CPU without int8 kernels runs ``torch._int_mm`` of 4096 in
    minutes); RuntimeError where PyTorch has no such kernel."""
    side = 256
    while True:
        product = _product(precision, side)
        start = time.perf_counter()
        product()
        if side >= PEAK_SIDE or (time.perf_counter() - start) * 8 > seconds:
            return side, product
        side *= 2


def matrix_peaks(precisions=("fp32", "bf16", "int8"), seconds: float = 1.0) -> dict:
    """``{precision: GFLOP/s (GOP/s for int8)}``: the best of repeated square matrix products
    (:data:`PEAK_SIDE`, smaller where one takes long) during about ``seconds`` each; a precision
    PyTorch cannot run here is left out."""
    peaks = {}
    for precision in precisions:
        try:
            side, product = _sized_product(precision, seconds)
        except RuntimeError:  # no such kernel on this CPU / build
            continue
        best, end = float("inf"), time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - start)
        peaks[precision] = 2 * side**3 / best / 1e9
    if peaks.get("int8", float("inf")) < peaks.get("fp32", 0.0):
        # torch._int_mm without an int8 kernel for this CPU (no VNNI: a reference loop) measures
        # no matrix unit; no CPU's int8 rate is below its fp32 rate
        del peaks["int8"]
    return peaks


#: a timed runtime -> the precision of its matrix products (None: not a matrix-unit column)
RUNTIME_PRECISION = {
    "tvm": "fp32", "tvm_bf16": "bf16", "tvm_int8": "int8", "onnxruntime": "fp32",
    "onnxruntime_int8": "int8", "openvino_f32": "fp32", "openvino_default": None, "openvino_int8": "int8",
}

#: the int8 peers of :func:`int8_table`
INT8_PEERS = {"onnxruntime_int8": "ORT int8", "openvino_int8": "OV int8 (NNCF)"}


def precision_table(rows: dict, peaks: dict) -> tuple[list[str], list[list[str]]]:
    """Per model and runtime: ms, GFLOP/s, and its share of the matrix peak of its precision
    (OpenVINO's default precision is the CPU's: shown against the bf16 peak where it is bf16)."""
    head = ["model", "runtime", "precision", "ms", "GFLOP/s", "of the peak"]
    body = []
    for name, row in rows.items():
        for runtime, seconds in row["seconds"].items():
            if runtime not in RUNTIME_PRECISION:
                continue
            precision = RUNTIME_PRECISION[runtime] or row.get("openvino_default_precision") or "?"
            achieved = row["gflop"] / seconds
            peak = peaks.get({"f32": "fp32"}.get(precision, precision))
            share = f"{100 * achieved / peak:.0f}%" if peak else "-"
            body.append([name, runtime, precision, f"{seconds * 1e3:.2f}", f"{achieved:.0f}", share])
    return head, body


def int8_table(rows: dict) -> tuple[list[str], list[list[str]]]:
    """Per model: our int8 (``tvm_int8``) and the int8 peers' ms, our speed over each (peer time /
    ours), and the geometric mean and lowest of those ratios over the models."""
    peers = [p for p in INT8_PEERS if any(p in r["seconds"] for r in rows.values())]
    head = ["model", "TVM int8 ms", *[f"{INT8_PEERS[p]} ms" for p in peers],
            *[f"x vs {INT8_PEERS[p]}" for p in peers]]
    body, ratios = [], {p: [] for p in peers}
    for name, row in rows.items():
        s = row["seconds"]
        if "tvm_int8" not in s:
            continue
        cells = [name, f"{s['tvm_int8'] * 1e3:.2f}", *[f"{s[p] * 1e3:.2f}" if p in s else "-" for p in peers]]
        for p in peers:
            if p in s:
                ratios[p].append(s[p] / s["tvm_int8"])
            cells.append(f"{s[p] / s['tvm_int8']:.2f}" if p in s else "-")
        body.append(cells)
    blank = ["" for _ in peers]
    means = [f"{math.exp(sum(map(math.log, r)) / len(r)):.2f}" if r else "-" for r in ratios.values()]
    body.append(["geometric mean", "", *blank, *means])
    body.append(["lowest", "", *blank, *[f"{min(r):.2f}" if r else "-" for r in ratios.values()]])
    return head, body
