"""Files touched on a user's behalf, never through a link (DESIGN.md, invariants).

A folder the caller trusts (an admin's setting: the jobs folder, the user's root) is
opened once and resolved; everything below it is reached one component at a time,
relative to the descriptor of the folder above (``openat``: ``os.open(name, ...,
dir_fd=fd)``) with ``O_NOFOLLOW``, so a symbolic link anywhere below, made before or
during the use, is refused with :class:`UnsafeFile` (an ``OSError`` that names the path
and why). Files are opened non-blocking (a FIFO cannot hang the caller) and must be
regular files with one link (a hard link to someone else's file is refused too). New
folders are made with ``mkdir(dir_fd=)`` and handed over with ``fchown`` on their own
descriptor. Every read, write, mkdir and chown checks again: nothing is checked once at
submit and trusted later.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 64 * 1024
LINK_WHY = "is a symbolic link (files touched for a user are never reached through a link)"


class UnsafeFile(OSError):
    """A path refused because a component is a link, or not the expected kind of file."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.ELOOP, f"{path} {why}")
        self.path = path
        self.why = why

    def __str__(self) -> str:
        return f"refused: {self.path} {self.why}"


def parts_of(rel: str) -> list[str]:
    """The components of a path relative to a trusted folder (no '..', not absolute)."""
    text = str(rel).replace("\\", "/")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if text.startswith("/") or ".." in parts or not parts or "\0" in text:
        raise UnsafeFile(str(rel), "is not a path inside its folder")
    return parts


def _kind(dir_fd: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return None


def _refusal(dir_fd: int, name: str, shown: str, exc: OSError, want: str) -> OSError:
    """The clear error for ``exc`` raised opening ``name``: a link or the wrong kind."""
    mode = _kind(dir_fd, name)
    if mode is not None and stat.S_ISLNK(mode):
        return UnsafeFile(shown, LINK_WHY)
    if mode is not None and exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.ENXIO):
        return UnsafeFile(shown, f"is not a {want}")
    return exc


@dataclass
class Folder:
    """An open folder (its descriptor) and how to name it in messages; a context manager."""

    fd: int
    shown: str

    @classmethod
    def root(cls, path: str) -> Folder:
        """The trusted folder ``path`` (an admin's setting, resolved once, here)."""
        real = os.path.realpath(path)
        return cls(os.open(real, DIR_FLAGS), real)

    @classmethod
    def under(
        cls, root: str, rel: str, *, create: bool = False, mode: int = 0o755,
        owner: tuple[int, int] | None = None,
    ) -> Folder:
        """The folder ``rel`` below the trusted ``root``, reached without links."""
        with cls.root(root) as top:
            return top.sub(rel, create=create, mode=mode, owner=owner)

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _name(self, name: str) -> str:
        return os.path.join(self.shown, name)

    # -- folders ----------------------------------------------------------------------------

    def child(
        self, name: str, *, create: bool = False, mode: int = 0o755,
        owner: tuple[int, int] | None = None,
    ) -> Folder:
        """The folder ``name`` (one component) in this one; made (and handed to ``owner``)
        when missing and ``create``; a link or a file there is refused."""
        if "/" in name or name in ("", ".", ".."):
            raise UnsafeFile(self._name(name), "is not a name in its folder")
        shown = self._name(name)
        made = False
        if create:
            try:
                os.mkdir(name, mode, dir_fd=self.fd)
                made = True
            except FileExistsError:
                pass
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            raise _refusal(self.fd, name, shown, exc, "folder") from None
        if made and owner is not None:
            try:
                os.fchown(fd, *owner)
            except OSError:
                os.close(fd)
                raise
        return Folder(fd, shown)

    def sub(
        self, rel: str, *, create: bool = False, mode: int = 0o755,
        owner: tuple[int, int] | None = None,
    ) -> Folder:
        """The folder ``rel`` (any depth) below this one, one component at a time."""
        here = Folder(os.dup(self.fd), self.shown)
        for part in parts_of(rel):
            try:
                nxt = here.child(part, create=create, mode=mode, owner=owner)
            finally:
                here.close()
            here = nxt
        return here

    def chown(self, uid: int, gid: int) -> None:
        """Hand this folder (the one opened, whatever its name points to now) over."""
        os.fchown(self.fd, uid, gid)

    # -- files ------------------------------------------------------------------------------

    def stat(self, name: str) -> os.stat_result | None:
        """``name`` as it is (a link is not followed); None when missing."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return self.stat(name) is not None

    def open(self, name: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
        """A descriptor of the regular file ``name`` (one component), opened without
        following a link, non-blocking (a FIFO is refused, not waited on)."""
        if "/" in name or name in ("", ".", ".."):
            raise UnsafeFile(self._name(name), "is not a name in its folder")
        shown = self._name(name)
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode,
                         dir_fd=self.fd)
        except OSError as exc:
            raise _refusal(self.fd, name, shown, exc, "regular file") from None
        st = os.fstat(fd)
        why = None
        if not stat.S_ISREG(st.st_mode):
            why = "is not a regular file"
        elif st.st_nlink > 1:
            why = "has other hard links (files touched for a user must have one)"
        if why is not None:
            os.close(fd)
            raise UnsafeFile(shown, why)
        os.set_blocking(fd, True)
        return fd

    def read(self, name: str, limit: int) -> bytes:
        """The whole of a small file (at most ``limit`` bytes: more is an error)."""
        fd = self.open(name)
        try:
            size = os.fstat(fd).st_size
            if size > limit:
                raise UnsafeFile(self._name(name), f"is {size} bytes, over {limit}")
            return read_at(fd, 0, limit)
        finally:
            os.close(fd)

    def write_atomic(
        self, name: str, data: bytes, *, mode: int = 0o644, owner: tuple[int, int] | None = None,
    ) -> None:
        """Write ``name`` whole: a fresh temporary file (``O_EXCL``), then renamed over it
        (a rename replaces a link, never writes through it)."""
        tmp = f".{name}.tmp"
        self.unlink(tmp)
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            if owner is not None:
                os.fchown(fd, *owner)
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)


def read_at(fd: int, offset: int, max_bytes: int) -> bytes:
    """Up to ``max_bytes`` from ``offset`` of an open file, read in chunks."""
    parts = []
    got = 0
    while got < max_bytes:
        piece = os.pread(fd, min(CHUNK * 4, max_bytes - got), offset + got)
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[: CHUNK * 16]):]


def chunks(fd: int, size: int | None = None, chunk: int = CHUNK) -> Iterator[bytes]:
    """The bytes of an open file in pieces of ``chunk`` (at most ``size`` in all)."""
    offset = 0
    while size is None or offset < size:
        want = chunk if size is None else min(chunk, size - offset)
        piece = os.pread(fd, want, offset)
        if not piece:
            return
        offset += len(piece)
        yield piece


def copy_fd(src: int, dst: int, limit: int | None = None) -> int:
    """Copy an open file into another in chunks; over ``limit`` bytes is an error
    (nothing more is written than ``limit``); returns the bytes copied."""
    copied = 0
    for piece in chunks(src, None if limit is None else limit + 1, CHUNK * 16):
        if limit is not None and copied + len(piece) > limit:
            raise OverLimit(f"over {limit} bytes")
        write_all(dst, piece)
        copied += len(piece)
    return copied


class OverLimit(OSError):
    """A file is larger than the bound it is copied or read under."""


def open_file_under(root: str, rel: str) -> tuple[int, int]:
    """A descriptor and size of the regular file ``rel`` below the trusted ``root``."""
    parts = parts_of(rel)
    with Folder.root(root) as top:
        folder = top.sub("/".join(parts[:-1])) if len(parts) > 1 else Folder(
            os.dup(top.fd), top.shown)
        with folder:
            fd = folder.open(parts[-1])
    return fd, os.fstat(fd).st_size


def size_under(root: str, rel: str) -> int | None:
    """The size of ``rel`` below ``root`` as it is (no link followed), None when missing
    or not reachable without a link."""
    try:
        fd, size = open_file_under(root, rel)
    except OSError:
        return None
    os.close(fd)
    return size


def human_bytes(n: int) -> str:
    """``64 MiB``, ``1.5 GiB``, ``512 bytes``: how a limit is named in a reason."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"
