"""Names and paths that come from inventory values, and the files the controller writes.

A value that becomes a file or folder name (a run id, an inventory host name) is a plain name: letters,
digits, '.', '_' and '-', no leading dot, at most NAME_MAX_CHARS. A path built from such values is resolved
and must stay inside the folder it belongs to. Files are written beside their target and renamed into place,
so a reader sees the old file or the new one, never half of one, with modes that do not open them to other
users (FILE_MODE, DIR_MODE).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from gpufleet.base.errors import InputError

NAME_MAX_CHARS = 128
NAME_RULE = f"letters, digits, '.', '_' and '-', not starting with a dot, at most {NAME_MAX_CHARS} characters"
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
# Results can name hosts and failures: readable by the owner and the group, not by everyone.
FILE_MODE = 0o640
DIR_MODE = 0o750
DEFAULT_REPORTS_DIR = "reports"  # the controller's folder of run folders where no --reports-dir names one
FULL_FREE_BYTES = 1 << 20  # a file system with less free than this is full for a writer of whole files and pages


def safe_name(value, what: str) -> str:
    """`value` when it is a plain name for a file or folder; InputError naming `what` otherwise."""
    if not isinstance(value, str) or not value:
        raise InputError(f"{what} must be a non-empty name ({NAME_RULE}); got {value!r}")
    if len(value) > NAME_MAX_CHARS or not _NAME.fullmatch(value):
        raise InputError(f"{what} {value!r} is not a plain name: expected {NAME_RULE}")
    return value


def inside(base: Path | str, *parts: str, what: str) -> Path:
    """base/parts resolved; InputError when the result leaves base (.., a link out, an absolute part)."""
    root = Path(base).resolve()
    path = root.joinpath(*parts).resolve()
    if path != root and root not in path.parents:
        raise InputError(f"{what} resolves to {path}, outside {root}; expected a path inside {root}")
    return path


def own_folder(base: Path | str, name: str, what: str) -> Path:
    """base/name, a folder of its own for `name` (a plain name): never a symbolic link, whatever it points at (what
    is written there would land in another folder), and inside base; InputError naming `what` otherwise."""
    safe_name(name, what)
    path = Path(base) / name
    if path.is_symlink():
        raise InputError(
            f"{what} {name!r}: {path} is a symbolic link (to {os.readlink(path)}), not a folder of its own; nothing "
            "was written through it: remove the link, or choose another name"
        )
    return inside(base, name, what=f"{what} {name!r}")


def make_dir(path: Path | str) -> Path:
    """Create a folder (and its missing parents, each) with DIR_MODE; an existing one is left as it is."""
    target = Path(path)
    missing, up = [], target
    while not up.exists() and up.parent != up:
        missing.append(up)
        up = up.parent
    try:
        for folder in reversed(missing):  # mkdir(parents=True) would give the parents the umask's mode (0755)
            folder.mkdir(mode=DIR_MODE, exist_ok=True)
        if not target.is_dir():
            raise FileExistsError(errno.EEXIST, "it exists and is not a folder")
    except OSError as exc:
        raise InputError(f"cannot create {target}: {exc.strerror}; expected a writable folder") from None
    return target


def write_atomic(path: Path | str, text: str, mode: int = FILE_MODE, *, durable: bool = True) -> Path:
    """Write text to path through a temporary file in the same folder and a rename.

    The temporary file starts with a dot, which the readers of run folders skip. On failure (a full disk, say)
    the temporary file is removed, the old file stays as it was and InputError names the file and the cause.
    durable=False skips the fsync, for files made again from others (a fleet's Prometheus files: one each).
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InputError(
            f"cannot write {path}: {exc.strerror or exc}; expected a writable folder with space left"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise InputError(
            f"cannot write {path}: {exc.strerror or exc}; expected a writable folder with space left"
        ) from None
    return path


def read_json(path: Path | str) -> tuple[Any, str | None]:
    """(document, None), or (None, why the file gives none: it cannot be read, its bytes are not UTF-8 text
    (random bytes over it), it is not JSON). The readers of the files the controller writes all say the same."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror or exc}"
    try:
        return json.loads(raw.decode("utf-8")), None
    except UnicodeDecodeError as exc:
        return None, f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}: damaged)"
    except json.JSONDecodeError as exc:
        return None, f"is not valid JSON ({exc.msg} at line {exc.lineno})"


def full_disk(path: Path | str) -> str | None:
    """'the file system of FOLDER is full (N bytes free)' when the file system holding path's folder is, else None."""
    try:
        st = os.statvfs(Path(path).parent)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= FULL_FREE_BYTES:
        return None
    return f"the file system of {Path(path).parent} is full ({free} bytes free)"


@contextlib.contextmanager
def folder_lock(folder: Path | str):
    """One holder at a time of this folder (flock on the folder itself, so nothing is left beside its files)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise InputError(f"cannot open {folder}: {exc.strerror}; expected a readable folder") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
