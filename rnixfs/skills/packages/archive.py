"""Safe extraction of skill archives (.tar.gz, .tar, .zip).

Nothing in an archive is trusted: member names with ``..``, absolute paths,
NUL or backslashes, device files and FIFOs, duplicate entries, paths that
pass through a symlink, and links leading out of the extraction root are
refused; the file count, the size of one file, the total size and the
compression ratio are capped while bytes are really written (headers may
lie). Every refusal is an UnsafeArchive naming the member; the caller owns
the destination directory and removes it on any error, so nothing is left.
"""
from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .package_errors import UnsafeArchive


@dataclass(frozen=True)
class Limits:
    max_files: int = 2000
    max_file_bytes: int = 32 << 20
    max_total_bytes: int = 64 << 20
    max_ratio: int = 200            # uncompressed / compressed, checked past ratio_floor
    ratio_floor: int = 4 << 20


DEFAULT_LIMITS = Limits()


def archive_kind(path: Path) -> str | None:
    with open(path, "rb") as f:
        head = f.read(512)
    if head[:2] == b"\x1f\x8b":
        return "tar.gz"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return None


class _Budget:
    """Counts what extraction really writes against the limits."""

    def __init__(self, limits: Limits, compressed: int, source: str):
        self.limits, self.compressed, self.source = limits, max(1, compressed), source
        self.files = 0
        self.total = 0

    def add_file(self, name: str) -> None:
        self.files += 1
        if self.files > self.limits.max_files:
            raise UnsafeArchive(f"{self.source}: more than {self.limits.max_files} files in the archive")

    def add_bytes(self, name: str, n: int, file_total: int) -> None:
        self.total += n
        lim = self.limits
        if file_total > lim.max_file_bytes:
            raise UnsafeArchive(f"{self.source}: member {name!r} is larger than {lim.max_file_bytes} bytes")
        if self.total > lim.max_total_bytes:
            raise UnsafeArchive(f"{self.source}: archive expands past {lim.max_total_bytes} bytes "
                                "(decompression bomb?)")
        if self.total > lim.ratio_floor and self.total > self.compressed * lim.max_ratio:
            raise UnsafeArchive(f"{self.source}: compression ratio above {lim.max_ratio}:1 "
                                "(decompression bomb?)")


class _CappedReader(io.RawIOBase):
    """Decompressed stream that stops a gzip bomb before tarfile buffers it."""

    def __init__(self, raw, cap: int, source: str):
        self.raw, self.cap, self.seen, self.source = raw, cap, 0, source

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.raw.read(len(b))
        self.seen += len(data)
        if self.seen > self.cap:
            raise UnsafeArchive(f"{self.source}: archive expands past {self.cap} bytes (decompression bomb?)")
        b[: len(data)] = data
        return len(data)


def clean_name(name: str, strip: int, source: str) -> str | None:
    """The member's safe relative path, or None for the stripped top levels."""
    if "\x00" in name or "\\" in name:
        raise UnsafeArchive(f"{source}: member name {name!r} holds NUL or a backslash")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"{source}: member {name!r} has an absolute path")
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(f"{source}: member {name!r} contains '..' (path traversal)")
    parts = parts[strip:]
    return "/".join(parts) if parts else None


class _Writer:
    def __init__(self, root: Path, budget: _Budget, source: str):
        self.root, self.budget, self.source = Path(root), budget, source
        self.links: list[str] = []
        self.written: set[str] = set()

    def _parent(self, rel: str) -> Path:
        """Create the parent directories, refusing any that is not a real directory."""
        d = self.root
        for part in rel.split("/")[:-1]:
            d = d / part
            try:
                os.mkdir(d, 0o755)
            except FileExistsError:
                pass
            if not stat.S_ISDIR(os.lstat(d).st_mode):
                raise UnsafeArchive(f"{self.source}: member {rel!r} passes through a link or file")
        return d

    def mkdir(self, rel: str) -> None:
        self._parent(rel + "/x")

    def file(self, rel: str, fobj, mode: int) -> None:
        self.budget.add_file(rel)
        parent = self._parent(rel)
        target = parent / rel.rsplit("/", 1)[-1]
        perm = 0o755 if mode & 0o111 else 0o644
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, perm)
        except FileExistsError:
            raise UnsafeArchive(f"{self.source}: duplicate member {rel!r}") from None
        written = 0
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = fobj.read(1 << 16)
                if not chunk:
                    break
                written += len(chunk)
                self.budget.add_bytes(rel, len(chunk), written)
                out.write(chunk)
        os.chmod(target, perm)
        self.written.add(rel)

    def symlink(self, rel: str, target: str) -> None:
        self.budget.add_file(rel)
        if not target or target.startswith("/") or "\x00" in target:
            raise UnsafeArchive(f"{self.source}: symlink {rel!r} -> {target!r} leaves the skill")
        lexical = os.path.normpath(os.path.join(os.path.dirname(rel), target))
        if lexical == ".." or lexical.startswith("../"):
            raise UnsafeArchive(f"{self.source}: symlink {rel!r} -> {target!r} leaves the skill")
        parent = self._parent(rel)
        try:
            os.symlink(target, parent / rel.rsplit("/", 1)[-1])
        except FileExistsError:
            raise UnsafeArchive(f"{self.source}: duplicate member {rel!r}") from None
        self.links.append(rel)

    def finish(self) -> None:
        """Every symlink, fully resolved once all members exist, stays inside."""
        real_root = os.path.realpath(self.root)
        for rel in self.links:
            real = os.path.realpath(self.root / rel)
            if real != real_root and not real.startswith(real_root + os.sep):
                raise UnsafeArchive(f"{self.source}: symlink {rel!r} leads out of the skill")


def extract(archive: Path, dest: Path, *, source: str, strip: int = 0,
            limits: Limits = DEFAULT_LIMITS) -> None:
    """Extract ``archive`` into the existing empty directory ``dest``."""
    kind = archive_kind(archive)
    if kind is None:
        raise UnsafeArchive(f"{source}: not a .tar.gz, .tar or .zip archive")
    budget = _Budget(limits, os.path.getsize(archive), source)
    w = _Writer(dest, budget, source)
    try:
        if kind == "zip":
            _zip(archive, w, strip, source)
        else:
            _tar(archive, kind, w, strip, source, limits)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, gzip.BadGzipFile, zipfile.LargeZipFile) as exc:
        raise UnsafeArchive(f"{source}: corrupt or truncated archive ({exc})") from None
    except zlib.error as exc:
        raise UnsafeArchive(f"{source}: corrupt or truncated archive ({exc})") from None
    w.finish()


def _tar(archive: Path, kind: str, w: _Writer, strip: int, source: str, limits: Limits) -> None:
    with open(archive, "rb") as raw:
        stream = raw
        if kind == "tar.gz":
            cap = limits.max_total_bytes + (limits.max_files + 16) * 1536 + (1 << 20)
            stream = io.BufferedReader(_CappedReader(gzip.GzipFile(fileobj=raw), cap, source))
        with tarfile.open(fileobj=stream, mode="r|") as tf:
            for m in tf:
                rel = clean_name(m.name, strip, source)
                if rel is None:
                    if m.isdir():
                        continue
                    raise UnsafeArchive(f"{source}: member {m.name!r} sits above the stripped top directory")
                if m.isdir():
                    w.mkdir(rel)
                elif m.isreg():
                    w.file(rel, tf.extractfile(m), m.mode)
                elif m.issym():
                    w.symlink(rel, m.linkname)
                elif m.islnk():
                    linked = clean_name(m.linkname, strip, source)
                    if linked is None or linked not in w.written:
                        raise UnsafeArchive(f"{source}: hard link {m.name!r} -> {m.linkname!r} leaves the skill")
                    with open(w.root / linked, "rb") as f:
                        w.file(rel, f, m.mode)
                elif m.ischr() or m.isblk():
                    raise UnsafeArchive(f"{source}: member {m.name!r} is a device file")
                elif m.isfifo():
                    raise UnsafeArchive(f"{source}: member {m.name!r} is a FIFO")
                else:
                    raise UnsafeArchive(f"{source}: member {m.name!r} has an unsupported type")


def _zip(archive: Path, w: _Writer, strip: int, source: str) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > w.budget.limits.max_files * 2:
            raise UnsafeArchive(f"{source}: more than {w.budget.limits.max_files} files in the archive")
        for info in infos:
            rel = clean_name(info.filename, strip, source)
            mode = (info.external_attr >> 16) & 0xFFFF
            if rel is None:
                if info.is_dir():
                    continue
                raise UnsafeArchive(f"{source}: member {info.filename!r} sits above the stripped top directory")
            ftype = stat.S_IFMT(mode)
            if info.is_dir():
                w.mkdir(rel)
            elif ftype == stat.S_IFLNK:
                with zf.open(info) as f:
                    target = f.read(4097)
                if len(target) > 4096:
                    raise UnsafeArchive(f"{source}: symlink {info.filename!r} has an oversized target")
                w.symlink(rel, target.decode("utf-8", "replace"))
            elif ftype in (stat.S_IFCHR, stat.S_IFBLK):
                raise UnsafeArchive(f"{source}: member {info.filename!r} is a device file")
            elif ftype == stat.S_IFIFO:
                raise UnsafeArchive(f"{source}: member {info.filename!r} is a FIFO")
            elif ftype in (0, stat.S_IFREG):
                with zf.open(info) as f:
                    w.file(rel, f, mode)
            else:
                raise UnsafeArchive(f"{source}: member {info.filename!r} has an unsupported type")
