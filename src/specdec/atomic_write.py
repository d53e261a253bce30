"""Crash-safe writes of files and directories (drafters, training checkpoints).

What is written goes first to a temporary file or directory beside its target (same filesystem, so a rename
is atomic), is flushed to disk, and only then renamed into place: a crash leaves either the old complete
version or the new complete one, never a mix of both.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_TEMPORARY = re.compile(r"^\..+\.(tmp|new|old|trash)-\d+-[0-9a-f]{8}$")  # the names _sibling gives


def fsync_path(path: Path) -> None:
    """Flushes a file's data, or a directory's entries (a rename is durable only once its directory is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sibling(target: Path, tag: str) -> Path:
    """A hidden, unique name beside `target`: on its filesystem, never mistaken for a drafter."""
    return target.with_name(f".{target.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextmanager
def atomic_file(target: Path) -> Iterator[Path]:
    """Yields a temporary path to write `target`'s new content to; once the block ends without an error,
    that file is flushed and renamed over `target`. On an error `target` keeps its old content."""
    target = Path(target)
    tmp = _sibling(target, "tmp")
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, target)
        fsync_path(target.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(target: Path, text: str) -> None:
    with atomic_file(target) as tmp:
        tmp.write_text(text)


def _link_or_copy(source: str | Path, dest: str | Path) -> None:
    """A hard link costs no copy of a large file (a checkpoint); a copy where links are not supported."""
    try:
        os.link(source, dest, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, dest, follow_symlinks=False)


def _carry_over(old: Path, new: Path) -> None:
    """Entries of the old directory that the new one was not given (a model card, a training log or
    checkpoint beside the drafter's files) keep their place in it."""
    for entry in old.iterdir():
        dest = new / entry.name
        if dest.exists() or dest.is_symlink() or _TEMPORARY.match(entry.name):  # a killed write's leftover
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, dest, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, dest)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            if not path.is_symlink():
                fsync_path(path)
        fsync_path(Path(folder))


def _aside(target: Path) -> Path | None:
    prefix = f".{target.name}.old-"
    return next((p for p in target.parent.iterdir() if p.name.startswith(prefix)), None)


def restore_interrupted(target: Path) -> None:
    """Puts back the old directory when a crash came between moving it aside and moving the new one in
    (the only moment `target` is missing while an aside copy exists; that copy is complete: it is
    renamed away before it is deleted)."""
    target = Path(target)
    if not target.exists() and target.parent.is_dir() and (aside := _aside(target)) is not None:
        os.rename(aside, target)
        fsync_path(target.parent)


def replace_directory(target: Path, write: Callable[[Path], None]) -> None:
    """Writes the directory `target` anew: `write(folder)` fills an empty folder beside it, the old
    directory's other entries are carried over, all is flushed, and the new folder takes the old one's
    place (the old one is renamed aside, the new one in, then the old one is deleted)."""
    target = Path(target)
    if target.is_symlink():  # replace what the link points at, not the link
        target = target.resolve()
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"{target} exists and is not a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    restore_interrupted(target)
    new = _sibling(target, "new")
    new.mkdir()
    try:
        write(new)
        if target.is_dir():
            _carry_over(target, new)
        _fsync_tree(new)
        _move_in(new, target)
    finally:
        shutil.rmtree(new, ignore_errors=True)  # left only when something failed before the move


def _move_in(new: Path, target: Path) -> None:
    if not target.exists():
        os.rename(new, target)
        fsync_path(target.parent)
        return
    old = _sibling(target, "old")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    fsync_path(target.parent)
    # renamed before deleting, so that an `old` aside is always complete (a crash may cut the deletion)
    trash = _sibling(target, "trash")
    os.rename(old, trash)
    shutil.rmtree(trash)
