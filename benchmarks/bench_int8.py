"""int8 against fp32 and ONNX Runtime's int8, in one process, interleaved: torchvision resnet50.

The model: resnet50 at 1x3x224x224, random weights (seed 0), batch-norm statistics from three
training passes on the sample photos (:func:`tvm_roialign.models.classifier_zoo.build_classifier`).
Runners: ours fp32 and int8 (``pipeline.build(..., precision="int8")``, calibrated on the sample
photos; and with layer1's ten convolutions kept in fp32, ``keep_fp32=range(10)``), ONNX Runtime
fp32 on the ONNX export and ONNX Runtime int8
(``onnxruntime.quantization.quantize_static`` of the same export: QDQ, per-channel weights,
uint8 activations, int8 weights, calibrated on the same photos), and ours on that QDQ model
(its own scales; on a CPU whose kernels take weights within +-64, AVX2's, both on the
``reduce_range=True`` model instead), and OpenVINO on the same export: f32
(``INFERENCE_PRECISION_HINT=f32``) and its int8, NNCF's ``nncf.quantize`` of it calibrated on the
same photos (:func:`tvm_roialign.bench.openvino_peer.nncf_int8`), at the plugin's default precision
for the layers NNCF leaves in float (bf16 on a CPU with AVX512-BF16 or AMX: what a user gets) and
with them pinned to f32 (skipped with ``--no-openvino`` or without ``openvino``/``nncf``). The
runners take turns in blocks of calls of
about 0.25 s, round after round (``_common.interleaved_blocks``; OpenMP threads sleep between
calls); the table has the median of the rounds. Accuracy: cosine similarity and largest relative
error (of the largest logit) of each int8 runner's logits against its fp32's, on every sample photo.
Usage::

    python benchmarks/bench_int8.py [--rounds 7] [--threads N] [--keep DIR]
"""

from __future__ import annotations

import _omp_passive  # noqa: F401  # isort: skip  (first: before torch loads its OpenMP)

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import tvm
from _common import interleaved_blocks
from tvm import relax

from tvm_roialign.frontend import from_exported_program
from tvm_roialign.host import request_amx, use_usable_cores
from tvm_roialign.models.classifier_zoo import build_classifier, photo_batch
from tvm_roialign.pipeline import build
from tvm_roialign.schedules.lowp.int8 import int8_instructions, int8_weight_limit
from tvm_roialign.target import describe, parse_target


def _tvm_runner(model, x, target, precision, **options):
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=False)
    start = time.perf_counter()
    vm = relax.VirtualMachine(build(mod, target, precision=precision, **options).executable, tvm.cpu())
    print(f"built ours {precision} in {time.perf_counter() - start:.0f} s", flush=True)

    def run(array):
        out = vm["main"](tvm.runtime.tensor(array))
        return (out[0] if not hasattr(out, "numpy") else out).numpy()

    return run


def _ort_runners(model, x, photos, threads: int, folder: Path, reduce_range: bool):
    """ONNX Runtime's runners of fp32 and int8 (``reduce_range``: the weights within +-64), and the
    int8 model's path."""
    from tvm_roialign.bench.onnxruntime_peer import cpu_session, quantized_int8

    fp32, int8 = folder / "r50.onnx", folder / "r50_int8.onnx"
    torch.onnx.export(model, (x,), str(fp32), input_names=["x"], output_names=["y"], dynamo=False)
    quantized_int8(str(fp32), str(int8), {"x": [p[None] for p in photos]}, reduce_range=reduce_range)
    runners = {}
    for name, path in (("fp32", fp32), ("int8", int8)):
        session = cpu_session(str(path), threads)
        runners[name] = lambda a, s=session: s.run(None, {"x": a})[0]
    return runners, int8


def _qdq_runner(path: Path, target):
    """Ours on ONNX Runtime's QDQ model: its quantized layers on our int8 kernels, its own scales."""
    import onnx

    from tvm_roialign.frontend.onnx import from_onnx

    mod = from_onnx(onnx.load(str(path)), keep_params_in_input=False)
    start = time.perf_counter()
    vm = relax.VirtualMachine(build(mod, target).executable, tvm.cpu())
    print(f"built ours on the QDQ model in {time.perf_counter() - start:.0f} s", flush=True)
    return lambda array: vm["main"](tvm.runtime.tensor(array)).numpy()


def _openvino_runners(onnx_path: Path, photos, threads: int) -> dict:
    """OpenVINO f32 and NNCF int8 (default precision elsewhere, and f32) of the ONNX file."""
    from tvm_roialign.bench.openvino_peer import OpenVINOModel, nncf_int8

    start = time.perf_counter()
    int8 = nncf_int8(onnx_path, [p[None] for p in photos])
    print(f"NNCF quantized the OpenVINO model in {time.perf_counter() - start:.0f} s", flush=True)
    f32, default, pinned = (OpenVINOModel(onnx_path, threads, "f32"), OpenVINOModel(int8, threads, None),
                            OpenVINOModel(int8, threads, "f32"))
    return {
        "OpenVINO f32": lambda a: f32(a)[0],
        f"OpenVINO int8 (NNCF; {default.precision} elsewhere)": lambda a: default(a)[0],
        "OpenVINO int8 (NNCF; f32 elsewhere)": lambda a: pinned(a)[0],
    }


def _accuracy(int8, fp32, photos) -> tuple[float, float]:
    """Lowest cosine and largest error relative to the largest logit, over the photos."""
    cosines, errors = [], []
    for photo in photos:
        a, b = int8(photo[None]).ravel().astype(np.float64), fp32(photo[None]).ravel().astype(np.float64)
        cosines.append(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
        errors.append(np.abs(a - b).max() / np.abs(b).max())
    return min(cosines), max(errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of every runtime (default: the cores this process may use)")
    parser.add_argument("--keep", default=None, help="a folder for the ONNX files (default: temporary)")
    parser.add_argument("--no-openvino", dest="openvino", action="store_false",
                        help="skip OpenVINO f32 and its NNCF int8")
    args = parser.parse_args()
    # TVM's pool sized before its first kernel: left alone, TVM 0.27 takes half the x86 cores
    # (it assumes two hyperthreads a core), one thread of two vCPUs
    args.threads = use_usable_cores(args.threads)
    torch.set_num_threads(args.threads)
    request_amx(required=False)
    target = parse_target("native")
    model = build_classifier("resnet50")
    photos = photo_batch().numpy()
    x = torch.from_numpy(photos[:1].copy())
    cpu = next(line for line in open("/proc/cpuinfo") if line.startswith("model name"))
    print(f"{cpu.split(':', 1)[1].strip()}; target {describe(target)}; int8 kernels "
          f"{int8_instructions(target)}; {args.threads} threads")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        reduce_range = int8_weight_limit(int8_instructions(target)) < 127
        ort, int8_path = _ort_runners(model, x, photos, args.threads, folder, reduce_range)
        ort_name = "ONNX Runtime int8 (quantize_static, QDQ, per-channel{})".format(
            ", reduce_range" if reduce_range else "")
        runners = {
            "tvm-roialign fp32": _tvm_runner(model, x, target, "fp32"),
            "tvm-roialign int8": _tvm_runner(model, x, target, "int8"),
            # resnet50's first 10 contractions are layer1's convolutions
            "tvm-roialign int8, layer1 in fp32": _tvm_runner(
                model, x, target, "int8", keep_fp32=list(range(10))
            ),
            "tvm-roialign on ONNX Runtime's int8 model": _qdq_runner(int8_path, target),
            "ONNX Runtime fp32": ort["fp32"],
            ort_name: ort["int8"],
        }
        from tvm_roialign.bench.openvino_peer import available, nncf_available

        openvino = (_openvino_runners(folder / "r50.onnx", photos, args.threads)
                    if args.openvino and available() and nncf_available() else {})
        runners.update(openvino)
        ours = _accuracy(runners["tvm-roialign int8"], runners["tvm-roialign fp32"], photos)
        kept = _accuracy(runners["tvm-roialign int8, layer1 in fp32"], runners["tvm-roialign fp32"], photos)
        theirs = _accuracy(ort["int8"], ort["fp32"], photos)
        qdq = _accuracy(runners["tvm-roialign on ONNX Runtime's int8 model"], ort["fp32"], photos)
        theirs_ov = [(n, _accuracy(r, openvino["OpenVINO f32"], photos)) for n, r in openvino.items()
                     if "int8" in n]
        medians = interleaved_blocks({n: (lambda r=r: r(x.numpy())) for n, r in runners.items()}, args.rounds)
    print(f"\nresnet50 1x3x224x224, median of {args.rounds} interleaved rounds")
    bases = {"ONNX Runtime int8": medians[ort_name]}
    # OpenVINO's int8 as a user gets it: the first, at the plugin's default precision elsewhere
    if len(openvino) > 1:
        bases["OpenVINO int8"] = medians[list(openvino)[1]]
    print("| runner | ms | " + " | ".join(f"vs {b}" for b in bases) + " |\n|---|---|" + "---|" * len(bases))
    for name, seconds in medians.items():
        ratios = " | ".join(f"{base / seconds:.2f}x" for base in bases.values())
        print(f"| {name} | {seconds * 1e3:.1f} | {ratios} |")
    print(f"\nint8 against fp32 on {len(photos)} sample photos "
          "(lowest cosine, largest error / largest logit):")
    print(f"tvm-roialign: {ours[0]:.5f}, {ours[1]:.4f}; with layer1 in fp32: {kept[0]:.5f}, {kept[1]:.4f}; "
          f"ONNX Runtime: {theirs[0]:.5f}, {theirs[1]:.4f}; ours on its model (against its fp32): "
          f"{qdq[0]:.5f}, {qdq[1]:.4f}")
    for name, (cosine, error) in theirs_ov:
        print(f"{name} against OpenVINO f32: {cosine:.5f}, {error:.4f}")


if __name__ == "__main__":
    main()
