"""Every command's --help renders (argparse formats help strings with %: a stray one crashed `serve --help`)."""

import argparse

import pytest

from specdec.cli import build_parser


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _commands(sub, (*prefix, name))
    return out


@pytest.mark.parametrize("command", _commands(build_parser()), ids=lambda c: " ".join(c) or "specdec")
def test_help_renders(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out
