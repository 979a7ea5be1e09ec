"""The house's structure: no import cycle between the package's modules (files), lazy imports
included; imports run down the package's layers (:data:`LAYERS`), never up; no file over 450
lines; no function over 80 lines.

The module graph is read from the source (every ``import`` and ``from ... import``, top-level and
inside functions), so an import placed in a function to dodge a cycle at load time still counts: it
is the same dependency. ``from . import name`` counts as an edge to the submodule ``name`` where
there is one, else to the package (its ``__init__``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tvm_roialign"
PACKAGE = ROOT.name


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        mods[".".join(parts)] = (path, is_package)
    return mods


def _targets(module: str, is_package: bool, node, mods) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == PACKAGE]
    if node.level == 0:
        base = node.module or ""
        if base.split(".")[0] != PACKAGE:
            return []
    else:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def module_deps(module: str, is_package: bool, tree: ast.AST, mods) -> set[str]:
    """The modules of ``mods`` that ``tree`` (the source of ``module``) imports, anywhere in it."""
    deps = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for dep in _targets(module, is_package, node, mods):
                while dep and dep not in mods:
                    dep = dep.rpartition(".")[0]
                if dep and dep != module:
                    deps.add(dep)
    return deps


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    return {
        module: module_deps(module, is_package, ast.parse(path.read_text(), str(path)), mods)
        for module, (path, is_package) in mods.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_are_edges_between_modules():
    pkg = f"{PACKAGE}.pkg"
    mods = {pkg: None, f"{pkg}.a": None, f"{pkg}.b": None, f"{pkg}.c": None}
    source = "from .b import name\n\ndef later():\n    from . import c\n    import os\n"
    assert module_deps(f"{pkg}.a", False, ast.parse(source), mods) == {f"{pkg}.b", f"{pkg}.c"}
    assert module_deps(f"{pkg}.b", False, ast.parse("from . import x\n"), mods) == {pkg}


def test_no_import_cycle_between_modules():
    found = cycles(import_graph())
    assert not found, f"import cycles between modules (lazy imports included): {found}"


#: The package's top-level modules and sub-packages by layer, the ground first: a unit imports only
#: units of lower layers (and, within itself, anything that makes no cycle). Units of one layer do
#: not import each other. The README's package map follows this order.
LAYERS = (
    ("_version", "_names", "_registry", "host", "profiling", "remote"),  # standard library and TVM only
    # TE computes; targets; linking; kernels built in threads; running artifacts
    ("topi", "target", "linking", "codegen", "runtime"),
    ("schedules",),  # schedule rules and tensor intrinsics
    ("strategies",),  # RoIAlign's per-target strategies
    ("ops",),  # Relax ops: struct info, legalization
    ("passes",),  # Relax passes, one per file
    ("frontend", "precision"),  # importers; a build's precision plan, calibration, QDQ phase
    ("pipeline_phases",),  # phases 1-3 and 5 of the CPU pipeline, shared with tuning
    ("tuning",),  # MetaSchedule tasks, records, search
    ("pipeline",),  # build(): the phases composed with the tuned schedules
    ("models", "testing"),  # detectors and classifiers compiled whole; test references
    ("datasets",),  # the synthetic detection dataset, its COCO evaluation, the reference detector
    ("_api",),  # the package's names and their registration
    ("__init__",),  # the package's face
    ("bench",),  # the measuring harness
    ("cli",),  # the command line
    ("__main__",),
)


def unit_of(module: str) -> str:
    """The top-level module or sub-package of the package that ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """``a -> b (unit layer i -> unit layer j)`` for every import of ``graph`` from one unit into
    another of the same or a higher layer of ``layers``; a unit on no layer is named too."""
    layer = {unit: i for i, units in enumerate(layers) for unit in units}
    found = []
    for module, deps in sorted(graph.items()):
        low = unit_of(module)
        for dep in sorted(deps):
            high = unit_of(dep)
            if low == high:
                continue
            if low not in layer or high not in layer:
                found.append(f"{module} -> {dep}: {low if low not in layer else high} is on no layer")
            elif layer[high] >= layer[low]:
                found.append(f"{module} -> {dep} ({low} on layer {layer[low]}, {high} on {layer[high]})")
    return found


def test_the_layer_check_finds_an_upward_import():
    pkg = PACKAGE
    graph = {f"{pkg}.topi.a": {f"{pkg}.schedules.b"}, f"{pkg}.schedules.b": {f"{pkg}.topi.c"},
             f"{pkg}.topi.c": set(), f"{pkg}.topi.d": {f"{pkg}.topi.c"}}
    assert upward_imports(graph) == [f"{pkg}.topi.a -> {pkg}.schedules.b (topi on layer 1, schedules on 2)"]
    assert upward_imports({f"{pkg}.attic.a": {f"{pkg}.topi.c"}, f"{pkg}.topi.c": set()}) == [
        f"{pkg}.attic.a -> {pkg}.topi.c: attic is on no layer"
    ]


def test_imports_run_down_the_layers():
    found = upward_imports(import_graph())
    assert not found, "imports that run back up the layers (lazy imports included):\n" + "\n".join(found)


def test_every_unit_is_on_a_layer():
    placed = {unit for units in LAYERS for unit in units}
    units = {unit_of(m) for m in import_graph()}
    assert units <= placed, f"place these in LAYERS: {sorted(units - placed)}"


def test_the_computes_take_the_target_as_an_argument():
    """Only the computes' entry point (``topi._args.resolve_target``) reads the current target; the
    TE math gets it passed down."""
    readers = [
        str(path.relative_to(ROOT.parent))
        for path in sorted((ROOT / "topi").rglob("*.py"))
        if "Target.current" in path.read_text()
    ]
    assert readers == [f"{PACKAGE}/topi/_args.py"]


#: The longest a file of the package may be, in lines.
MAX_FILE_LINES = 450


def long_files(limit: int = MAX_FILE_LINES) -> list[str]:
    """``path (N lines)`` of every file of the package over ``limit`` lines."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(ROOT.parent)} ({lines} lines)")
    return found


def test_no_file_over_450_lines():
    found = long_files()
    assert not found, "split these along their seams:\n" + "\n".join(found)


#: The longest a function of the package may be, in lines (``end_lineno - lineno + 1``, decorators
#: not counted, nested functions counted on their own as well as inside their parent).
MAX_FUNCTION_LINES = 80


def long_functions(limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (N lines)`` of every function (nested ones included) over ``limit`` lines."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    where = path.relative_to(ROOT.parent)
                    found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_over_80_lines():
    found = long_functions()
    assert not found, "split these into named steps:\n" + "\n".join(found)


def test_the_roi_family_builders_share_one_argument_order():
    """The tensors and output size by position, the rest by keyword, in one order, with the
    defaults of ``relax.op.vision.roi_align`` (the rotated op's ``aligned`` is detectron2's)."""
    import inspect

    import tvm_roialign

    shared = ["spatial_scale", "sampling_ratio", "aligned", "layout", "mode"]
    defaults = {"spatial_scale": 1.0, "sampling_ratio": -1, "aligned": False, "layout": "NCHW",
                "mode": "avg"}
    for name, positional, own_defaults in (
        ("roi_align", ["data", "rois", "output_size"], {}),
        ("multiscale_roi_align", ["features", "rois", "output_size", "spatial_scales"], {}),
        ("ps_roi_align", ["data", "rois", "output_size"], {}),
        ("roi_align_rotated", ["data", "rois", "output_size"], {"aligned": True}),
    ):
        params = inspect.signature(getattr(tvm_roialign, name)).parameters.values()
        by_position = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        keywords = [p for p in params if p.kind is p.KEYWORD_ONLY]
        assert by_position == positional, name
        names = [p.name for p in keywords]
        # the shared ones first, in the shared order, then the op's own
        ours = [n for n in shared if n in names]
        assert names[: len(ours)] == ours, name
        for p in keywords:
            if p.name in defaults:
                assert p.default == own_defaults.get(p.name, defaults[p.name]), (name, p.name)
