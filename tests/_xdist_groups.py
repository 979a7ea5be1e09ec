"""A pytest plugin (conftest.py loads it): ``--dist loadgroup`` keeps each ``xdist_group`` on one worker.

xdist's scheduler groups the tests whose node id ends in ``@group``. pytest-xdist 3.8 adds that suffix on
each worker by assigning ``item._nodeid``, which pytest 9.2's ``nodeid`` (a property over ``item._id``) no
longer reads: every group is then spread over the workers, and the session fixtures its tests share (a
compiled detector, a tuning run) are built on each. This hook gives the grouped items the suffixed id.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers under --dist loadgroup
        return
    try:
        from _pytest.nodes import NodeId
    except ImportError:  # a pytest whose nodeid is the attribute xdist writes
        return

    for item in items:
        marks = item.iter_markers("xdist_group")
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks})
        if names and "@" not in item.nodeid.rpartition("]")[2]:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


#: the scopes whose fixtures a group should build once
SHARED_SCOPES = ("session", "module")


def _param_token(callspec, name: str) -> str:
    """The parameter of fixture ``name`` as text: its value when a plain one (the same for every
    test that parametrizes the fixture, whatever its position in that test's list), else its index."""
    value = callspec.params[name]
    if isinstance(value, str | int | float | bool):
        return str(value)
    return str(callspec.indices.get(name))


def module_fixture_group(item) -> str | None:
    """The group of a test that uses a session- or module-scoped fixture defined in its own module
    (a compiled model, an exported program): the module's name, and the parameter of each such
    fixture that is parametrized, so that each parameter's fixture is built on one worker and the
    parameters still spread over the workers. ``None`` for a test that uses none."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module = item.nodeid.split("::")[0]
    callspec = getattr(item, "callspec", None)
    shared, params = False, []
    for name, defs in sorted(info.name2fixturedefs.items()):
        fixture = defs[-1]
        if fixture.scope in SHARED_SCOPES and fixture.baseid == module:
            shared = True
            if callspec is not None and name in callspec.params:
                params.append(f"{name}={_param_token(callspec, name)}")
    if not shared:
        return None
    stem = module.rpartition("/")[2].removesuffix(".py")
    return "-".join([stem, *params])
