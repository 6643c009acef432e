"""The project's one atomic write and one file lock: every file a reader must never see half
written (a record, the sweep's tables, a job's history, a cached reference model) goes through
`write_atomic`, and every lock (the sweep's store, a job's dir, the reference-model cache) is a
`file_lock`."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn


def write_atomic(path: Path, write: Callable[[Path], object], *, durable: bool = False) -> None:
    """Create or replace `path` whole: `write(tmp)` writes a file beside it, which is then
    renamed over it, so a reader never sees a partial file. If it fails, the file beside it is
    removed; an `OSError` that names no file (a full disk: `[Errno 28]` from a write) is raised
    again naming `path`. The file's mode follows the umask, like any other file.

    `durable`: the file is fsynced before its rename and the directory after it, so a crash
    (of the machine, not only of the process) leaves the old file or the whole new one.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as error:
        _raise_naming(error, path)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; follow the umask like any other file
        os.close(fd)
        write(Path(tmp))
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError):
            _raise_naming(error, path)
        raise
    if durable:
        _fsync(path.parent)


@contextlib.contextmanager
def file_lock(
    path: Path, on_wait: Callable[[], object] | None = None, *, mode: int = 0o666
) -> Iterator[bool]:
    """Hold an exclusive flock on `path` (released when the holder ends, even killed); yields
    whether another holder had to be waited for (`on_wait()` is called before waiting).

    The lock file is opened without following a symlink (one planted at `path`, in a shared
    directory, is refused with an OSError rather than followed to another file), never
    truncated, created if missing with `mode` less the umask (0o666: like any other file of a
    sweep; 0o600 for a private cache); its parent is created if missing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, mode)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
            waited = True
        yield waited
    finally:
        os.close(fd)  # closing releases the lock


def _fsync(path: str | Path) -> None:
    """fsync the file or directory at `path` (any descriptor of it flushes its data)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _raise_naming(error: OSError, path: Path) -> NoReturn:
    """Raise `error` again, as an OSError of the same kind naming `path` if it names no file."""
    if error.filename is not None or error.errno is None:
        raise error
    raise OSError(error.errno, error.strerror or str(error), str(path)) from error
