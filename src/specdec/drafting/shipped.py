"""Where learned drafters are found by name.

A drafter is named by its directory, or by the name of a folder (e.g. "gemma-3-270m-eagle3") inside one of:
1. the folders in the SPECDEC_DRAFTERS environment variable (several joined by os.pathsep), first to last;
2. the drafters shipped with the package (specdec/drafters/, package data in the wheel, the same folder in
   an editable install).
The first folder that holds a directory of that name wins, so SPECDEC_DRAFTERS can stand in for a shipped drafter.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "SPECDEC_DRAFTERS"


class DrafterNotFound(ValueError):
    """Neither a drafter directory nor a name found in any folder searched."""


def shipped_drafters_dir() -> Path:
    """The folder of the drafters shipped with the package."""
    return Path(__file__).resolve().parent.parent / "drafters"


def drafter_search_dirs() -> list[Path]:
    """The folders searched for a drafter name, first to last: $SPECDEC_DRAFTERS, then the shipped ones."""
    extra = [Path(part).expanduser() for part in os.environ.get(ENV_VAR, "").split(os.pathsep) if part.strip()]
    return [*extra, shipped_drafters_dir()]


def shipped_drafter_names() -> list[str]:
    """The names of the drafters shipped with the package."""
    folder = shipped_drafters_dir()
    if not folder.is_dir():
        return []
    return sorted(d.name for d in folder.iterdir() if (d / "config.json").is_file())


def resolve_drafter(name_or_path: str | os.PathLike) -> Path:
    """The drafter directory `name_or_path` names: itself when it is a directory, else the first folder of
    drafter_search_dirs() holding a directory of that name. DrafterNotFound (a ValueError) names the folders
    searched otherwise."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    searched = drafter_search_dirs()
    if not path.is_absolute():
        for folder in searched:
            candidate = folder / path
            if candidate.is_dir():
                return candidate
    shipped = ", ".join(shipped_drafter_names()) or "none"
    raise DrafterNotFound(
        f"drafter not found: {str(name_or_path)!r} is neither a directory nor a drafter in "
        f"{', '.join(str(folder) for folder in searched)} (shipped: {shipped}; set {ENV_VAR} to a folder of "
        f"drafters, several separated by {os.pathsep!r}, to search them first)")
