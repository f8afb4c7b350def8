"""The command line explains itself: a version, a description for every verb, help for every
option, and no unexplained jargon."""

from __future__ import annotations

import argparse
import re

import pytest

from explorer.cli import _parser
from tests.builders import run_cli


def _verbs() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_version_exits_0():
    from explorer import __version__

    proc = run_cli("--version", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"explorer {__version__}"


@pytest.mark.parametrize("verb", sorted(_verbs()))
def test_every_verb_has_a_description_and_every_option_help(verb):
    parser = _verbs()[verb]
    assert parser.description and len(parser.description) > 40, verb
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{verb} {action.option_strings or action.dest}: no help"


@pytest.mark.parametrize("verb", sorted(_verbs()))
def test_help_text_reads_plainly(verb):
    text = _verbs()[verb].format_help()
    assert "%%" not in text, verb
    # "ado" (the orchestrator explorer grew from) is never named without saying what it is
    if re.search(r"\bado\b", text):
        assert "orchestrator" in text, verb
