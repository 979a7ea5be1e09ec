"""A build's precision is resolved once: ``tvm-roialign compile`` of a model file, of an ONNX QDQ
model and of a detector name each call :func:`tvm_roialign.precision.resolve` exactly once, and
the plan it makes is what the pipeline builds (its metadata in the artifact's ``.json``)."""

from __future__ import annotations

import json

import pytest
from _cli import run_cli

import tvm_roialign.precision.policy as policy


@pytest.fixture
def resolves(monkeypatch):
    """The plans :func:`~tvm_roialign.precision.resolve` returns while the fixture is active."""
    made = []
    real = policy.resolve

    def counted(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(policy, "resolve", counted)
    return made


def test_a_model_file_is_resolved_once(pt2_model, tmp_path, capsys, resolves):
    out = tmp_path / "m.so"
    code, _, err = run_cli(["compile", str(pt2_model[0]), "-o", str(out), "--precision", "auto"], capsys)
    assert code == 0, err
    assert len(resolves) == 1 and resolves[0].asked == "auto"
    assert json.loads((tmp_path / "m.so.json").read_text())["precision"] == resolves[0].precision


def test_a_qdq_model_is_resolved_once(tmp_path, capsys, resolves):
    pytest.importorskip("onnxruntime")
    from _qdq import qdq_model

    path = qdq_model(tmp_path, reduce_range=True)
    resolves.clear()  # quantize_static's own imports do not count
    out = tmp_path / "q.so"
    target = "llvm -mcpu=haswell"  # AVX2: the reduce_range model's weights fit its kernels
    code, _, err = run_cli(
        ["compile", path, "--target", target, "-o", str(out), "--precision", "int8"], capsys
    )
    assert code == 0, err
    assert len(resolves) == 1 and resolves[0].quantized and resolves[0].precision == "int8"
    meta = json.loads((tmp_path / "q.so.json").read_text())
    assert (meta["precision"], meta["int8_kernels"], meta["quantization"]) == ("int8", "avx2", "qdq")


class _Exported(Exception):
    """Raised where the detector's artifact would be written: the build is done."""


def test_a_detector_name_is_resolved_once(tmp_path, capsys, monkeypatch, resolves):
    """The detector's torch model and import are stood in for by a one-op module (the count is of
    the precision decisions, not of the import); its build runs the whole pipeline."""
    from tvm import relax

    from tvm_roialign.models import detection

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.add(x, x)))
    mod = bb.get()
    built = {}

    def export(artifact, _out):
        built.update(artifact.meta)
        raise _Exported

    monkeypatch.setattr(detection, "build_torch_detector", lambda name, config: object())
    monkeypatch.setattr(detection, "_import", lambda *args: (mod, {"any_size": True}))
    monkeypatch.setattr(detection, "graph_options", lambda model, fast: {})
    monkeypatch.setattr(detection.DetectorArtifact, "export", export)
    with pytest.raises(_Exported):
        run_cli(["compile", "fasterrcnn_resnet50_fpn", "-o", str(tmp_path / "d.so"), "--precision", "auto"],
                capsys)
    assert len(resolves) == 1 and resolves[0].asked == "auto"
    assert built["precision"] == resolves[0].precision
