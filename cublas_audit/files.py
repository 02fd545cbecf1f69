"""The one writer of output files: every file a command leaves behind (plan.json, the tables,
env.json, the reports in Markdown and JSON, the shapes tables, every plot) goes through
`write_file`.

It writes a new, uniquely named temporary file in the target's directory and renames it over the
target, so a crash or a Ctrl-C never leaves half a file that a later `report`, `diff` or
`--resume` would read back. It renames only over a regular file (or nothing): a FIFO, a device, a
directory, or a symlink to any of them is refused, never replaced or written into. And it never
replaces an input of the command: `never_replacing` names the files a command reads, and a write
to one of them under any name (the same path, a symlink, a hard link: compared by device and
inode) is refused. Every OS failure is a one-line AuditError naming the path (a full disk says
"no space left on device"), never a traceback.

A bottom-level module (beside errors.py), so that the plan and the table stages both write
through it without either importing the other.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from cublas_audit.errors import AuditError

if TYPE_CHECKING:
    # for the annotation only: planning/cases.py, which the probe child imports at start-up,
    # writes plan.json through this module and must not pull pandas in
    import pandas as pd

InodeKey = tuple[int, int]  # (st_dev, st_ino): a file, whatever its name
Content = str | bytes | Callable[[BinaryIO], object]

_TEMP_SUFFIX = ".tmp"
_TEMP_STEM = 40  # characters of the target's name in its temporary file's name
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)

# The files the running command reads: no write may replace one (see never_replacing).
_inputs: ContextVar[frozenset[InodeKey]] = ContextVar("cublas_audit_inputs", default=frozenset())


def write_file(path: Path, content: Content) -> Path:
    """Writes `content` (text as UTF-8, bytes, or a function that writes to a binary file) to
    `path` through a temporary file in its directory and a rename; the directory is made if
    missing. Refused (AuditError, one line): a target that is not a regular file, an input of
    the command, or any OS failure (a full disk, a name too long, no permission)."""
    path = Path(path)
    check_target(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise AuditError(f"{path}: {_first_file(path.parent)} is not a directory") from exc
    except OSError as exc:
        raise os_error(path, exc) from exc
    temporary: str | None = None
    try:
        fd, temporary = tempfile.mkstemp(
            prefix=_temp_prefix(path), suffix=_TEMP_SUFFIX, dir=path.parent
        )
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(fd, _new_file_mode())  # as open() would have made it, not mkstemp's 0600
            if isinstance(content, str):
                handle.write(content.encode())
            elif isinstance(content, bytes):
                handle.write(content)
            else:
                content(handle)
        check_target(path)  # again: the target may have appeared while the content was written
        os.replace(temporary, path)
        temporary = None
    except OSError as exc:
        raise os_error(path, exc) from exc
    finally:
        if temporary is not None:
            with suppress(OSError):
                os.unlink(temporary)
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """Text (UTF-8) through write_file."""
    return write_file(path, text)


def write_csv_atomic(frame: pd.DataFrame, path: Path) -> Path:
    """A table as CSV (or Parquet for a .parquet path) through write_file."""
    path = Path(path)
    if path.suffix == ".parquet":
        # zstd: a third of snappy's bytes for a map's table, in about the same time
        return write_file(
            path, lambda handle: frame.to_parquet(handle, index=False, compression="zstd")
        )
    return write_file(path, lambda handle: frame.to_csv(handle, index=False, float_format="%.6g"))


@contextmanager
def never_replacing(paths: Iterable[Path]) -> Iterator[frozenset[InodeKey]]:
    """The files the command reads: while inside, write_file refuses to write any of them, under
    whatever name (yields their identities; a path that does not exist is no file to protect)."""
    keys = inode_keys(paths)
    token = _inputs.set(_inputs.get() | keys)
    try:
        yield keys
    finally:
        _inputs.reset(token)


def inode_keys(paths: Iterable[Path]) -> frozenset[InodeKey]:
    """The identities (device, inode) of the files at `paths` that exist, symlinks followed."""
    keys = set()
    for path in paths:
        try:
            info = os.stat(path)
        except (OSError, ValueError):
            continue
        keys.add((info.st_dev, info.st_ino))
    return frozenset(keys)


def check_target(path: Path, inputs: Iterable[InodeKey] = ()) -> None:
    """Refuses (AuditError, one line) a file that write_file could not or must not write: a name
    longer than the file system takes (its temporary file's name counted), a parent that is not a
    directory, an existing target that is not a regular file (a symlink followed), or one of the
    `inputs` or of the running command's inputs (never_replacing)."""
    path = Path(path)
    _check_names(path)
    _check_parents(path)
    try:
        os.lstat(path)
    except FileNotFoundError:
        return  # nothing there: a new file
    except OSError as exc:
        raise os_error(path, exc) from exc
    try:
        info = os.stat(path)  # a symlink is judged by what it points to
    except FileNotFoundError:
        return  # a dangling symlink: the rename replaces the link, nothing it points to
    except OSError as exc:
        raise os_error(path, exc) from exc
    if stat.S_ISDIR(info.st_mode):
        raise AuditError(f"{path}: is a directory; name a file")
    if not stat.S_ISREG(info.st_mode):
        kind = "a symlink to a special file" if path.is_symlink() else "a special file"
        raise AuditError(f"{path}: {kind} (a FIFO, a device or a socket); not overwritten")
    if (info.st_dev, info.st_ino) in (_inputs.get() | frozenset(inputs)):
        raise AuditError(
            f"{path}: would overwrite an input of this command (the same file, under this or "
            "another name)"
        )


def os_error(path: Path, exc: OSError) -> AuditError:
    """An OSError while writing `path` as one line naming it."""
    if exc.errno in _NO_SPACE:
        return AuditError(f"{path}: no space left on device")
    reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    return AuditError(f"{path}: {reason}")


def _check_names(path: Path) -> None:
    """Each part of the path, and the name of the file's temporary file, no longer than NAME_MAX
    of the file system it would be made on."""
    try:
        name_max = os.pathconf(_nearest_existing(path), "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    temporary = _temp_prefix(path) + "X" * 8 + _TEMP_SUFFIX  # mkstemp's 8 random characters
    for part in [*path.parts, temporary]:
        length = len(part.encode(errors="surrogateescape"))
        if length > name_max:
            shown = part[:24] + "..." if len(part) > 27 else part
            raise AuditError(
                f"{path}: file name too long ({shown}: {length} bytes; the file system takes "
                f"{name_max})"
            )


def _temp_prefix(path: Path) -> str:
    return "." + path.name[:_TEMP_STEM] + "."


def _check_parents(path: Path) -> None:
    """Each existing ancestor a directory (symlinks followed)."""
    for parent in reversed(path.parents):
        try:
            info = os.stat(parent)
        except FileNotFoundError:
            return  # it and what is below it will be made
        except NotADirectoryError as exc:
            raise AuditError(f"{path}: {_first_file(parent)} is not a directory") from exc
        except OSError as exc:
            raise os_error(path, exc) from exc
        if not stat.S_ISDIR(info.st_mode):
            raise AuditError(f"{path}: {parent} is not a directory")


def _first_file(path: Path) -> Path:
    """The first ancestor of `path` (or itself) that exists and is not a directory."""
    for candidate in [*reversed(path.parents), path]:
        if candidate.exists() and not candidate.is_dir():
            return candidate
    return path


def _nearest_existing(path: Path) -> Path:
    absolute = Path(os.path.abspath(path))
    for candidate in [absolute, *absolute.parents]:
        with suppress(OSError, ValueError):
            if candidate.is_dir():
                return candidate
    return Path("/")


def _new_file_mode() -> int:
    """0666 less the umask, as a file made by open() has."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask
