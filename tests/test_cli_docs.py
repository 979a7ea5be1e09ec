"""docs/cli.md against the command line's parsers: every flag a subcommand's ``--help`` lists is in
that subcommand's section of the page (``## compile`` up to the next ``## ``), and every flag the
page names exists in some subcommand."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tvm_roialign import cli

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _subcommand_flags() -> dict[str, set[str]]:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {
        name: {o for a in p._actions for o in a.option_strings if o.startswith("--")}
        for name, p in sub.choices.items()
    }


def _sections() -> dict[str, str]:
    """The page's text per ``## `` heading (its first word), the text before the first as ''."""
    sections, name = {"": ""}, ""
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            name = line[3:].split()[0].strip("`")
            sections.setdefault(name, "")
        sections[name] += line + "\n"
    return sections


@pytest.mark.parametrize("command", ["compile", "run", "maskrcnn", "tune"])
def test_every_flag_of_a_subcommand_is_in_its_section(command):
    documented = set(FLAG.findall(_sections()[command]))
    missing = sorted(_subcommand_flags()[command] - documented - {"--help", "--quiet"})
    assert not missing, f"docs/cli.md's '## {command}' section lacks {missing}"


def test_every_flag_the_page_names_exists():
    """A section may name another subcommand's flags (``run --image`` under ``compile``)."""
    everywhere = set().union(*_subcommand_flags().values()) | {"--version"}
    unknown = sorted(set(FLAG.findall(PAGE.read_text())) - everywhere)
    assert not unknown, f"docs/cli.md names flags the command does not have: {unknown}"
