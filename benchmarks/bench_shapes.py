"""One build for every input size: a symbolic-shape TVM build against a static build per shape,
PyTorch eager and ONNX Runtime, in one run.

    python benchmarks/bench_shapes.py [--models resnet18,mobilenet_v2,resnet50] [--repeat 5] [--threads N]
                                      [--shapes 1x3x224x224,1x3x320x480,...]

Per model (torchvision, random weights, seed 0, batch norms calibrated on the sample photos: the
zoo's ``build_classifier``): the model is exported to ONNX with dynamic batch, height and width
(``torch.onnx.export(..., dynamo=False, opset_version=17, dynamic_axes={"x": {0: "n", 2: "h", 3:
"w"}})``) and compiled once, as ``tvm-roialign compile`` does (NHWC, the host CPU as target); for
each shape it is also exported and compiled with that static shape. At each shape the four
runtimes are timed interleaved (the median of ``--repeat`` blocks of calls), and the
symbolic build's output is compared with eager's. PyTorch's OpenMP threads sleep between calls
(``OMP_WAIT_POLICY=PASSIVE``, as in ``bench_models.py``, which found spinning threads taking the
cores from the next runner's block).

More models: add an entry to :data:`MODELS` (a name and a function returning the eval-mode
``torch.nn.Module`` and the input name; the input is ``[N, 3, H, W]`` float32), or call
:func:`register_model`.

Writes ``benchmarks/results/shapes.json`` and ``shapes.png`` and prints the table.
"""

from __future__ import annotations

import _omp_passive  # noqa: F401  # isort: skip  (first: before torch loads its OpenMP)
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import interleaved_blocks

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = ((1, 3, 224, 224), (1, 3, 320, 480), (1, 3, 237, 311), (2, 3, 224, 224), (3, 3, 160, 160))


def _torchvision(name: str):
    def make():
        from tvm_roialign.models.classifier_zoo import build_classifier

        # random weights of seed 0, batch norms calibrated on the sample photos: uncalibrated, the
        # outputs are of the order of 1e-15 and eager PyTorch runs into denormals
        return build_classifier(name, seed=0)

    return make


#: name -> function returning the eval-mode model (input ``x``: ``[N, 3, H, W]`` float32)
MODELS = {name: _torchvision(name) for name in ("resnet18", "mobilenet_v2", "resnet50")}


def register_model(name: str, make) -> None:
    """Benchmark ``make()`` (an eval-mode ``torch.nn.Module`` taking ``[N, 3, H, W]``) as ``name``."""
    MODELS[name] = make


def _export(model, shape, path: str, dynamic: bool) -> None:
    import torch

    axes = {"x": {0: "n", 2: "h", 3: "w"}} if dynamic else None
    torch.onnx.export(
        model,
        (torch.zeros(shape),),
        path,
        dynamo=False,
        opset_version=17,
        input_names=["x"],
        dynamic_axes=axes,
    )


def _compile(path: str, target):
    """``(VirtualMachine, seconds)``: the model at ``path`` built as ``tvm-roialign compile`` does."""
    import tvm
    from tvm import relax

    from tvm_roialign.cli._model_file import load_model
    from tvm_roialign.passes import ConvertLayout, desired_layouts
    from tvm_roialign.pipeline import build

    t0 = time.perf_counter()
    mod = ConvertLayout(desired_layouts("NHWC", "conv2d,roi_align"))(load_model(Path(path)))
    executable = build(mod, target, layout=None).executable
    seconds = time.perf_counter() - t0
    return relax.VirtualMachine(executable, tvm.cpu()), seconds


def _tvm_runner(vm, data):
    import tvm

    args = [tvm.runtime.tensor(data)]
    return lambda: vm["main"](*args).numpy()


def bench_model(name: str, shapes, target, threads: int, repeat: int, workdir: str) -> dict:
    import torch

    from tvm_roialign.bench.onnxruntime_peer import cpu_session

    model = MODELS[name]()
    dynamic = f"{workdir}/{name}_dyn.onnx"
    _export(model, shapes[0], dynamic, dynamic=True)
    vm_dyn, build_dyn = _compile(dynamic, target)
    session = cpu_session(dynamic, threads)
    rows = []
    for shape in shapes:
        static = f"{workdir}/{name}_{'x'.join(map(str, shape))}.onnx"
        _export(model, shape, static, dynamic=False)
        vm_static, build_static = _compile(static, target)
        data = np.random.default_rng(0).standard_normal(shape).astype("float32")
        tensor = torch.from_numpy(data)

        def eager(tensor=tensor):
            with torch.no_grad():
                return model(tensor).numpy()

        runners = {
            "symbolic": _tvm_runner(vm_dyn, data),
            "static": _tvm_runner(vm_static, data),
            "eager": eager,
            "onnxruntime": lambda data=data: session.run(None, {"x": data})[0],
        }
        reference = eager()
        diff = float(np.abs(runners["symbolic"]() - reference).max())
        times = interleaved_blocks(runners, repeat, block_s=0.2)
        rows.append(
            {
                "shape": list(shape),
                "times_s": times,
                "static_build_s": build_static,
                "max_abs_diff_vs_eager": diff,
                "reference_max_abs": float(np.abs(reference).max()),
            }
        )
        print(f"  {name} {shape}: {_row_text(name, rows[-1])}", file=sys.stderr)
    return {"model": name, "symbolic_build_s": build_dyn, "rows": rows}


def _ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def _row_text(name: str, row: dict) -> str:
    t = row["times_s"]
    return (
        f"| {name} | {'x'.join(map(str, row['shape']))} | {t['symbolic'] * 1e3:.2f} | "
        f"{t['static'] * 1e3:.2f} | {_ratio(t['symbolic'], t['static'])} | "
        f"{t['eager'] * 1e3:.2f} | {_ratio(t['eager'], t['symbolic'])} | "
        f"{t['onnxruntime'] * 1e3:.2f} | {_ratio(t['onnxruntime'], t['symbolic'])} | "
        f"{row['max_abs_diff_vs_eager']:.1e} |"
    )


def table(result: dict) -> str:
    lines = [
        "| model | shape | symbolic ms | static ms | symbolic / static | eager ms | eager / symbolic "
        "| ORT ms | ORT / symbolic | max abs diff vs eager |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in result["models"]:
        lines += [_row_text(entry["model"], row) for row in entry["rows"]]
    builds = ", ".join(
        f"{e['model']} {e['symbolic_build_s']:.1f} s (static: "
        f"{statistics.median(r['static_build_s'] for r in e['rows']):.1f} s per shape)"
        for e in result["models"]
    )
    lines.append(f"\nsymbolic builds (once for all shapes): {builds}")
    return "\n".join(lines)


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, series = [], {"symbolic": [], "static": [], "eager": [], "onnxruntime": []}
    for entry in result["models"]:
        for row in entry["rows"]:
            labels.append(f"{entry['model']}\n{'x'.join(map(str, row['shape']))}")
            for key in series:
                series[key].append(row["times_s"][key] * 1e3)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(labels)), 4))
    width = 0.2
    for i, (key, values) in enumerate(series.items()):
        ax.bar([j + (i - 1.5) * width for j in range(len(labels))], values, width, label=key)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("ms per call (median)")
    ax.set_title(f"One symbolic build vs a static build per shape ({result['threads']} threads)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _shapes(text: str | None):
    if not text:
        return SHAPES
    try:
        return tuple(tuple(int(d) for d in item.split("x")) for item in text.split(","))
    except ValueError:
        raise SystemExit(f"--shapes {text!r} must look like 1x3x224x224,2x3x224x224") from None


def main(argv=None) -> int:
    import tvm_roialign  # noqa: F401  (thread settings)
    from tvm_roialign.host import use_usable_cores
    from tvm_roialign.target import num_cores, parse_target

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--shapes", default=None, help="comma-separated NxCxHxW")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {', '.join(unknown)}; known: {', '.join(MODELS)}")
    threads = use_usable_cores(args.threads or num_cores())  # TVM's pool, before its first kernel
    import torch

    torch.set_num_threads(threads)
    target = parse_target("native")
    shapes = _shapes(args.shapes)
    with tempfile.TemporaryDirectory() as workdir:
        models = [bench_model(m, shapes, target, threads, args.repeat, workdir) for m in names]
    result = {"threads": threads, "target": str(target), "models": models}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "shapes.json").write_text(json.dumps(result, indent=1))
    try:
        chart(result, out / "shapes.png")
    except ImportError:
        print("matplotlib is not installed (the bench extra): no chart", file=sys.stderr)
    print(table(result))
    print(f"results: {out / 'shapes.json'}, {out / 'shapes.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
