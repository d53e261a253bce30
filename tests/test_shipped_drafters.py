"""Drafters by name (drafting/shipped.py): the shipped ones (package data), SPECDEC_DRAFTERS searched first, and a
clear error naming the folders searched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specdec.drafting.shipped import (
    ENV_VAR,
    DrafterNotFound,
    drafter_search_dirs,
    resolve_drafter,
    shipped_drafter_names,
    shipped_drafters_dir,
)

SHIPPED = ["gemma-3-270m-dflash-b16", "gemma-3-270m-dflash-b8", "gemma-3-270m-eagle3", "gemma-3-270m-medusa",
           "gemma-3-270m-mtp"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def _drafter(folder: Path, name: str) -> Path:
    directory = folder / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    return directory


def test_shipped_names_resolve_to_a_drafter_directory():
    assert shipped_drafter_names() == SHIPPED
    for name in SHIPPED:
        path = resolve_drafter(name)
        assert path == shipped_drafters_dir() / name
        assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def test_a_directory_is_taken_as_it_is(tmp_path):
    own = _drafter(tmp_path, "mine")
    assert resolve_drafter(own) == own
    assert resolve_drafter(str(own)) == own


def test_the_environment_variable_is_searched_first(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    override = _drafter(first, "gemma-3-270m-eagle3")
    _drafter(second, "gemma-3-270m-eagle3")
    extra = _drafter(second, "custom")
    monkeypatch.setenv(ENV_VAR, os.pathsep.join([str(first), "", str(second)]))
    assert drafter_search_dirs() == [first, second, shipped_drafters_dir()]
    assert resolve_drafter("gemma-3-270m-eagle3") == override
    assert resolve_drafter("custom") == extra
    assert resolve_drafter("gemma-3-270m-mtp") == shipped_drafters_dir() / "gemma-3-270m-mtp"  # still found


def test_an_unknown_name_names_the_folders_searched(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    with pytest.raises(DrafterNotFound) as raised:
        resolve_drafter("no-such-drafter")
    message = str(raised.value)
    assert isinstance(raised.value, ValueError)  # the CLI and the server report ValueErrors as user errors
    assert "'no-such-drafter'" in message and str(tmp_path) in message and str(shipped_drafters_dir()) in message
    assert ENV_VAR in message and "gemma-3-270m-eagle3" in message


def test_the_drafters_and_training_resolve_through_it(tmp_path):
    from specdec.drafting import dflash, eagle3, medusa, mtp
    from specdec.training.commands import _init_from

    assert eagle3.resolve_drafter is dflash.resolve_drafter is medusa.resolve_drafter is mtp.resolve_drafter is resolve_drafter
    assert _init_from("gemma-3-270m-medusa") == shipped_drafters_dir() / "gemma-3-270m-medusa"
    assert _init_from(None) is None
    checkpoint = tmp_path / "run-step300"  # any existing path is taken as it is, as before
    checkpoint.mkdir()
    assert _init_from(str(checkpoint)) == checkpoint
    with pytest.raises(DrafterNotFound):
        _init_from("no-such-drafter")


def test_the_wheel_ships_every_file_of_the_shipped_drafters():
    """pyproject's package data globs (relative to src/specdec) cover each file, and the folder is not a package."""
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_root = shipped_drafters_dir().parent
    shipped = {path for pattern in config["package-data"]["specdec"] for path in package_root.glob(pattern)}
    files = {path for path in shipped_drafters_dir().rglob("*") if path.is_file() and "__pycache__" not in path.parts}
    assert len(files) >= 5 * 2 and files - shipped == set()
    assert "specdec.drafters*" in config["packages"]["find"]["exclude"]
