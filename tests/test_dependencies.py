"""What the package needs is what pyproject.toml declares, and importing it has no side effects.

* Every third-party module the package's source imports (anywhere, lazily too) belongs to a
  distribution that pyproject.toml declares, in the core or in an extra.
* Every third-party module loaded at run time by ``import tvm_roialign`` and its runtime and CLI,
  and by the parts of TVM that ``tvm-roialign tune`` drives (MetaSchedule's process pool and cost
  model, TVM's RPC tracker and server), belongs to a declared distribution or to one of their own
  dependencies. A module TVM imports but does not declare (cloudpickle) has to be declared by us.
* ``import tvm_roialign`` leaves ``os.environ`` as it was and works where ``os.sched_getaffinity``
  does not exist (macOS, Windows).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tvm_roialign"
FIRST_PARTY = {"tvm_roialign"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> dict[str, set[str]]:
    """Distribution name -> the groups declaring it (``core`` or the extra's name)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"core": project["dependencies"], **project["optional-dependencies"]}
    declared: dict[str, set[str]] = {}
    for group, requirements in groups.items():
        for requirement in requirements:
            name = _name(requirement)
            if name != "tvm-roialign":
                declared.setdefault(name, set()).add(group)
    return declared


def _closure(names) -> set[str]:
    """``names`` and everything they require unconditionally (extras of theirs not followed)."""
    from packaging.requirements import Requirement

    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name.lower().replace("_", "-"))
    return seen


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return md.packages_distributions()


def _distributions(module: str) -> set[str]:
    return {d.lower().replace("_", "-") for d in _packages_distributions().get(module, [])}


def _imported_top_levels(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_module_the_source_imports_is_declared():
    declared = _declared()
    missing = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for module in _imported_top_levels(path) - set(sys.stdlib_module_names) - FIRST_PARTY:
            dists = _distributions(module)
            if not dists & declared.keys():
                missing.setdefault(module, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


_RUNTIME_MODULES = textwrap.dedent(
    """
    import json, sys
    import tvm_roialign, tvm_roialign.cli, tvm_roialign.runtime, tvm_roialign.tuning
    # what `tvm-roialign tune` makes TVM import: MetaSchedule's cost model and process pool
    # (its worker unpickles with cloudpickle), the RPC tracker and server
    import tvm.s_tir.meta_schedule.cost_model.xgb_model
    import tvm.support.popen_pool, tvm.exec.popen_worker
    import tvm.rpc.tracker, tvm.rpc.server
    print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
    """
)


def test_every_module_loaded_at_run_time_is_declared():
    proc = subprocess.run(
        [sys.executable, "-c", _RUNTIME_MODULES], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    allowed = _closure(_declared())
    third_party = loaded - set(sys.stdlib_module_names) - FIRST_PARTY
    undeclared = {
        module: sorted(dists)
        for module in third_party
        if (dists := _distributions(module)) and not dists & allowed
    }
    assert not undeclared, (
        f"loaded at run time, but neither declared in pyproject.toml nor required by a declared "
        f"package: {undeclared}"
    )


def test_the_tune_extra_declares_what_tvm_tuning_imports_without_declaring():
    """TVM imports cloudpickle (popen worker), psutil, tornado and xgboost lazily and declares none
    of them; the ``tune`` extra must."""
    tune = {name for name, groups in _declared().items() if "tune" in groups}
    assert {"cloudpickle", "psutil", "tornado", "xgboost"} <= tune


_IMPORT_CHECK = textwrap.dedent(
    """
    import os, sys
    import tvm                              # TVM's own loader reads sys.platform: patch after it
    {patch}
    before = dict(os.environ)
    import tvm_roialign, tvm_roialign.cli, tvm_roialign.runtime, tvm_roialign.target
    from tvm_roialign.host import usable_cores
    assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())
    assert usable_cores() >= 1
    print("ok")
    """
)


@pytest.mark.parametrize(
    "patch",
    [
        "",
        "del os.sched_getaffinity",
        "del os.sched_getaffinity; sys.platform = 'darwin'",
    ],
    ids=["linux", "no-affinity", "darwin"],
)
def test_import_has_no_side_effects_and_needs_no_linux_only_call(patch):
    env = {k: v for k, v in __import__("os").environ.items() if k != "TVM_NUM_THREADS"}
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK.format(patch=patch)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
