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
import stat
import tempfile
from pathlib import Path
from typing import Any

from gpufleet.base import layout
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


def run_id(value, what: str) -> str:
    """`value` when it may name a run (a run folder of the reports folder): a plain name, and none the reports folder
    keeps for its own files (layout.reserved_names: the store, the baseline, their journals and damaged forms);
    InputError naming `what` otherwise. Every way a run gets its id comes here."""
    safe_name(value, what)
    taken = layout.reserved(value)
    if taken:
        raise InputError(
            f"{what} {value!r} is a name the reports folder keeps for its own {taken}"
            + ("" if value == taken else f" (and its forms, {taken}-* and {taken}.*)")
            + ": a run folder of that name would take its place; choose another run id"
        )
    return value


def inside(base: Path | str, *parts: str, what: str) -> Path:
    """base/parts resolved; InputError when the result leaves base (.., a link out, an absolute part)."""
    root = Path(base).resolve()
    path = root.joinpath(*parts).resolve()
    if path != root and root not in path.parents:
        raise InputError(f"{what} resolves to {path}, outside {root}; expected a path inside {root}")
    return path


def own_folder(base: Path | str, name: str, what: str) -> Path:
    """base/name, the folder of the run `name` (run_id()): never a symbolic link, whatever it points at (what
    is written there would land in another folder), and inside base; InputError naming `what` otherwise."""
    run_id(name, what)
    path = Path(base) / name
    if path.is_symlink():
        raise InputError(
            f"{what} {name!r}: {path} is a symbolic link (to {os.readlink(path)}), not a folder of its own; nothing "
            "was written through it: remove the link, or choose another name"
        )
    return inside(base, name, what=f"{what} {name!r}")


def make_dir(path: Path | str) -> Path:
    """Create a folder (and its missing parents, each) with DIR_MODE; an existing one is left as it is. A symbolic
    link there is refused, whatever it points at: what is written in a folder of a run stays in it."""
    target = Path(path)
    if os.path.islink(target):
        raise InputError(
            f"cannot use {target}: it {not_a_file(target).removeprefix('is ')}; nothing was written through it: "
            "remove the link"
        )
    missing, up = [], target
    while not os.path.exists(up) and up.parent != up:  # what cannot be looked at (a folder's mode) is made, and said
        missing.append(up)
        up = up.parent
    try:
        for folder in reversed(missing):  # mkdir(parents=True) would give the parents the umask's mode (0755)
            folder.mkdir(mode=DIR_MODE, exist_ok=True)
        if not target.is_dir():
            raise FileExistsError(errno.EEXIST, "it exists and is not a folder")
    except OSError as exc:
        raise InputError(f"cannot create {target}: {exc.strerror}; {_to_do(target, folder=True)}") from None
    return target


def _to_do(path: Path, *, folder: bool = False) -> str:
    """What to do about a file (or `folder`) that cannot be written where it is."""
    if os.path.lexists(path) and (folder or path.is_dir() or not_a_file(path)):
        return "move what is there aside, then run this again"
    return "make its folder writable, with space left, then run this again"


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
        raise InputError(f"cannot write {path}: {exc.strerror or exc}; {_to_do(path)}") from None
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
        raise InputError(f"cannot write {path}: {exc.strerror or exc}; {_to_do(path)}") from None
    return path


def file_kind(mode: int) -> str:
    """What a file of this mode is, in words: 'a FIFO (named pipe)', 'a folder', ..."""
    for test, words in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return words
    return "a file" if stat.S_ISREG(mode) else "no plain file"


def not_a_file(path: Path | str) -> str | None:
    """Why the entry at path is no plain file of its own to read or open (a symbolic link, which is not followed:
    whatever it points at is no file of this folder; a FIFO, whose open would wait for a writer; a folder, a
    socket, a device), or None for a plain file or nothing there. Never opens it."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"is a symbolic link (to {target}), not a file of its own"
    if not stat.S_ISREG(st.st_mode):
        return f"is {file_kind(st.st_mode)}, not a file"
    return None


def read_bytes(path: Path | str, *, follow: bool = False) -> tuple[bytes | None, str | None]:
    """(the bytes of the file at path, None), or (None, why it gives none). The one reader of the files a run, a
    reports folder or a node lock holds: it never waits (a FIFO is opened with O_NONBLOCK and named, never read),
    never follows a symbolic link (O_NOFOLLOW), and names a folder, a socket or a device as what it is. `follow`: a
    file an operator names (a profile, a config, `-e @FILE`), which may well be a link, is read through it."""
    try:
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            why = not_a_file(path)
            if why:
                return None, why
        return None, f"cannot be read: {exc.strerror or exc}"
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            return None, f"is {file_kind(mode)}, not a file"
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks), None
            chunks.append(chunk)
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror or exc}"
    finally:
        os.close(fd)


def read_denied(path: Path | str) -> bool:
    """Whether opening the file at path to read it is refused for want of permission (its mode, its owner)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC))
    except PermissionError:
        return True
    except OSError:
        pass
    return False


def text_of(raw: bytes) -> tuple[str | None, str | None]:
    """(the bytes as UTF-8 text, None), or (None, why they are none)."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}: damaged)"


def json_of(raw: bytes) -> tuple[Any, str | None]:
    """(the document the bytes hold, None), or (None, why they hold none: no UTF-8 text, no JSON)."""
    text, why = text_of(raw)
    if text is None:
        return None, why
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"is not valid JSON ({exc.msg} at line {exc.lineno})"


def read_text(path: Path | str, *, follow: bool = False) -> tuple[str | None, str | None]:
    """(the file's text, None), or (None, why it gives none: read_bytes's reasons, or bytes that are no UTF-8 text)."""
    raw, why = read_bytes(path, follow=follow)
    return (None, why) if raw is None else text_of(raw)


def read_json(path: Path | str, *, follow: bool = False) -> tuple[Any, str | None]:
    """(document, None), or (None, why the file gives none: it cannot be read or is no plain file (read_bytes), its
    bytes are not UTF-8 text (random bytes over it), it is not JSON). The readers of the files the controller writes
    all say the same."""
    raw, why = read_bytes(path, follow=follow)
    return (None, why) if raw is None else json_of(raw)


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
