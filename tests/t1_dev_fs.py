"""dev/fs: the confined workspace device, and its path-escape suite.

The world: ``tmp/ws`` is the workspace; ``tmp/outside`` and ``tmp/ws-evil``
hold a secret that no operation may ever return; the workspace is full of
symlinks that try to reach them, the host root and /proc. Every hostile path
goes through every operation; an operation that returns outside content or
an outside inode, or changes anything outside, is an escape. There must be
none. Races: threads swap directories and files for symlinks to outside
while other threads open through them.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from rnixfs.devices.fs import (RENAME_EXCHANGE, FsError, Matches, Workspace, renameat2)
from rnixfs.kernel.errors import Code, SyscallError

P, I, N = Code.PERMISSION, Code.INVALID, Code.NOT_FOUND


# -- the world ---------------------------------------------------------------------------
def build_world(tmp_path: Path) -> SimpleNamespace:
    secret = b"OUTSIDE-SECRET-" + uuid.uuid4().hex.encode()
    ws = tmp_path / "ws"
    out = tmp_path / "outside"
    evil = tmp_path / "ws-evil"
    for d in (ws / "sub" / "deep", out / "dir", out / "sub", evil):
        d.mkdir(parents=True)
    (ws / "inside.txt").write_bytes(b"inside")
    (ws / "sub" / "file.txt").write_bytes(b"sub-file")
    (ws / "sub" / "deep" / "x.txt").write_bytes(b"deep")
    for f in (out / "secret", out / "f", out / "file.txt", out / "dir" / "secret", evil / "secret",
              out / "sub" / "f", out / "inside.txt"):
        f.write_bytes(secret)
    links = {
        "to_root": "/",
        "to_parent": "..",
        "to_outside_abs": str(out),
        "to_outside_rel": "../outside",
        "to_secret": "../outside/secret",
        "chain1": "sub/chain2",
        "sub/chain2": "../chain3",
        "chain3": "sub/../..",
        "sub/up": "..",
        "sub/upup": "../..",
        "sub/mid": "../../outside",
        "loop1": "loop2",
        "loop2": "loop1",
        "self": "self",
        "abs_inside": str(ws / "sub"),
        "abs_root": str(ws),
        "abs_inside_up": str(ws) + "/..",
        "abs_lookalike": str(evil),
        "proc_root": "/proc/self/root",
        "proc_cwd": "/proc/self/cwd",
        "proc_fd": "/proc/self/fd",
        "rel_proc": "../" * 40 + "proc/self/root",
        "dangling_out": "../outside/newfile",
        "dangling_in": "sub/created-through-link",
    }
    for name, target in links.items():
        os.symlink(target, ws / name)
    return SimpleNamespace(ws=Workspace(ws), root=ws, out=out, evil=evil, tmp=tmp_path, secret=secret)


@pytest.fixture
def world(tmp_path):
    w = build_world(tmp_path)
    yield w
    w.ws.close()


def snapshot(world) -> dict:
    """Everything outside the workspace that an escape could change."""
    snap = {}
    for base in (world.out, world.evil):
        for dirpath, dirnames, filenames in os.walk(base):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                st = p.lstat()
                body = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
                snap[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns, body)
    snap["<tmp>"] = sorted(os.listdir(world.tmp))
    return snap


def forbidden(world) -> tuple[set, list[bytes], list[set]]:
    """Inodes, contents and listings that must never come back."""
    inodes = set()
    for p in ("/", "/etc", "/etc/passwd", "/proc/self", world.tmp, world.out, world.out / "secret",
              world.out / "dir", world.evil, world.evil / "secret", world.out / "f"):
        try:
            st = os.stat(p)
            inodes.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    contents = [world.secret]
    try:
        contents.append(Path("/etc/passwd").read_bytes()[:32])
    except OSError:
        pass
    listings = [set(os.listdir(d)) for d in ("/", world.tmp, world.out, world.evil)]
    return inodes, contents, listings


# (path, code expected from stat/read_file, "tmp" when any escape could only reach tmp_path,
#  so mutating operations are safe to try; "sys" paths could reach the host's / and are
#  only ever read)
HOSTILE = [
    ("..", P, "tmp"),
    ("../", P, "tmp"),
    ("../x", P, "tmp"),
    ("../outside/secret", P, "tmp"),
    ("a/../../x", P, "tmp"),
    ("sub/../../outside/secret", P, "tmp"),
    ("sub/deep/../../../outside/secret", P, "tmp"),
    ("inside.txt/../../outside/secret", P, "tmp"),
    ("/etc/passwd", P, "sys"),
    ("//etc", P, "sys"),
    ("/", P, "sys"),
    ("./../", P, "tmp"),
    ("./..", P, "tmp"),
    ("a/./../..", P, "tmp"),
    ("sub/../..", P, "tmp"),
    ("../ws/inside.txt", P, "tmp"),                 # out and back in: refused all the same
    ("to_root", P, "sys"),
    ("to_root/", P, "sys"),
    ("to_root/etc/passwd", P, "sys"),
    ("to_parent", P, "tmp"),
    ("to_parent/outside/secret", P, "tmp"),
    ("to_outside_abs/secret", P, "tmp"),
    ("to_outside_rel/secret", P, "tmp"),
    ("to_outside_rel/../ws/inside.txt", P, "tmp"),
    ("to_secret", P, "tmp"),
    ("chain1", P, "tmp"),
    ("chain1/outside/secret", P, "tmp"),
    ("sub/upup/outside/secret", P, "tmp"),
    ("sub/up/../outside/secret", P, "tmp"),
    ("sub/mid/secret", P, "tmp"),
    ("abs_inside_up/outside/secret", P, "tmp"),
    ("abs_lookalike/secret", P, "tmp"),
    ("dangling_out", P, "tmp"),
    ("proc_root/etc/passwd", P, "sys"),
    ("proc_cwd", P, "sys"),
    ("proc_fd/3", P, "sys"),
    ("rel_proc/etc/passwd", P, "sys"),
    ("/proc/self/root/etc/passwd", P, "sys"),
    ("loop1", I, "tmp"),
    ("self/x", I, "tmp"),
    ("a\0b", I, "tmp"),
    ("../\0", I, "tmp"),
    ("x" * 256, I, "tmp"),
    ("a/" * 2100, I, "tmp"),
    # plain names that only look like dots or escapes
    ("proc/self/root/etc/passwd", N, "tmp"),
    ("\u2025/outside/secret", N, "tmp"),            # TWO DOT LEADER
    ("\uff0e\uff0e/outside/secret", N, "tmp"),      # FULLWIDTH FULL STOP x2
    ("\u2024\u2024/outside/secret", N, "tmp"),      # ONE DOT LEADER x2
    ("...", N, "tmp"),
    (".../outside/secret", N, "tmp"),
    ("..\u200b/outside/secret", N, "tmp"),          # zero-width space
    (".. /outside/secret", N, "tmp"),
    ("..\\outside\\secret", N, "tmp"),
    ("%2e%2e/outside/secret", N, "tmp"),
    ("~/../outside", N, "tmp"),
]


def test_at_least_30_hostile_paths():
    assert len(HOSTILE) >= 30
    assert len({p for p, _, _ in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize("path,code,_kind", HOSTILE, ids=[repr(p)[:40] for p, _, _ in HOSTILE])
def test_hostile_path_refused(world, path, code, _kind):
    for call in (lambda: world.ws.stat(path), lambda: world.ws.read_file(path, 1 << 20),
                 lambda: world.ws.resolve(path + "/x")):
        with pytest.raises(FsError) as info:
            call()
        assert info.value.code is code, (path, info.value)
        assert isinstance(info.value, SyscallError)
        assert info.value.device == "/dev/fs"
        if code is P:
            assert info.value.errno == errno.EACCES
    if code is P:
        assert world.secret not in str(info.value).encode()


def _sweep(world, path: str, kind: str, escapes: list, counts: dict) -> None:
    """Every operation on ``path``; record what escapes."""
    ws = world.ws
    inodes, contents, listings = forbidden(world)

    def leaked(what, value):
        escapes.append((path, what, repr(value)[:120]))

    def attempt(what, fn, check=None):
        counts["attempts"] += 1
        try:
            value = fn()
        except FsError:
            counts["refused"] += 1
            return
        except SyscallError:
            counts["refused"] += 1
            return
        if check is not None:
            check(what, value)

    def st_check(what, st):
        if (st.st_dev, st.st_ino) in inodes:
            leaked(what, st)

    def bytes_check(what, data):
        if isinstance(data, tuple):
            data = data[0]
        if any(c and c in data for c in contents):
            leaked(what, data)

    def list_check(what, names):
        names = {n if isinstance(n, str) else n[0] for n in names}
        if names and any(names == lst for lst in listings):
            leaked(what, names)

    def fd_check(what, fd):
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) in inodes:
                leaked(what, st)
            if stat.S_ISREG(st.st_mode):
                bytes_check(what, os.pread(fd, 1 << 16, 0))
        finally:
            os.close(fd)

    def str_check(what, rel):
        if rel.startswith("/") or rel == ".." or rel.startswith("../") or "/../" in rel:
            leaked(what, rel)

    for p in (path, path + "/", path + "/secret", path + "/etc/passwd"):
        attempt("resolve", lambda: ws.resolve(p), str_check)
        attempt("stat", lambda: ws.stat(p), st_check)
        attempt("lstat", lambda: ws.lstat(p), st_check)
        attempt("open", lambda: ws.open(p, os.O_RDONLY), fd_check)
        attempt("read_file", lambda: ws.read_file(p, 1 << 20), bytes_check)
        attempt("listdir", lambda: ws.listdir(p), list_check)
        attempt("entries", lambda: ws.entries(p), list_check)
        attempt("link_target", lambda: ws.link_target(p), lambda w, v: v and str_check(w, v))
        attempt("glob", lambda: ws.glob(p + "/*"), lambda w, v: [str_check(w, x) for x in v])
        attempt("grep", lambda: ws.grep("SECRET|root:", p), lambda w, v: [bytes_check(w, x[2].encode())
                                                                          for x in v])
    if kind != "tmp":
        return
    for p in (path, path + "/pwned", path + "/secret", path + "/dir"):
        attempt("write_file", lambda: ws.write_file(p, b"pwned"))
        attempt("write_file(create=False)", lambda: ws.write_file(p, b"pwned", create=False))
        attempt("open(O_CREAT)", lambda: ws.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC), fd_check)
        attempt("open(O_APPEND)", lambda: ws.open(p, os.O_RDWR | os.O_APPEND), fd_check)
        attempt("mkdir", lambda: ws.mkdir(p))
        attempt("symlink", lambda: ws.symlink("/etc/passwd", p))
        attempt("truncate", lambda: ws.truncate(p, 0))
        attempt("chmod", lambda: ws.chmod(p, 0o777))
        attempt("utime", lambda: ws.utime(p, (0, 0)))
        attempt("unlink", lambda: ws.unlink(p))
        attempt("rmdir", lambda: ws.rmdir(p))
        (world.root / "victim").write_bytes(b"victim")
        attempt("rename(into)", lambda: ws.rename("victim", p))
        attempt("rename(from)", lambda: ws.rename(p, "stolen"))
        if (world.root / "stolen").exists() or (world.root / "stolen").is_symlink():
            st = os.lstat(world.root / "stolen")
            if (st.st_dev, st.st_ino) in inodes:
                leaked("rename(from)", st)
            os.unlink(world.root / "stolen")


def test_zero_escapes(tmp_path, capsys):
    """Every hostile path through every operation, each in a fresh world."""
    escapes: list = []
    counts = {"attempts": 0, "refused": 0}
    changed: set = set()
    for i, (path, _code, kind) in enumerate(HOSTILE):
        world = build_world(tmp_path / f"w{i}")
        before = snapshot(world)
        try:
            _sweep(world, path, kind, escapes, counts)
        finally:
            world.ws.close()
        after = snapshot(world)
        changed |= {(path, k) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    with capsys.disabled():
        print(f"\n  path-escape suite: {len(HOSTILE)} hostile paths, {counts['attempts']} operations, "
              f"{counts['refused']} refused, {len(escapes)} escapes, {len(changed)} outside changes")
    assert escapes == []
    assert changed == set()
    assert counts["refused"] > counts["attempts"] * 0.7


def test_lookalike_names_stay_inside(world):
    """Unicode dot look-alikes, '...', backslashes are plain names inside the root."""
    for name in ("\u2025", "\uff0e\uff0e", "\u2024\u2024", "...", "..\u200b", ".. ", "..\\x",
                 "%2e%2e", "~", " .."):
        world.ws.write_file(name, b"plain")
        assert (world.root / name).read_bytes() == b"plain"
        assert world.ws.resolve(name) == name
        world.ws.mkdir(name + "d")
        assert (world.root / (name + "d")).is_dir()
    assert snapshot(world)["<tmp>"] == sorted(["ws", "outside", "ws-evil"])


# -- links that stay inside ---------------------------------------------------------------
def test_symlinks_inside_are_followed(world):
    ws = world.ws
    assert ws.resolve("sub/up/inside.txt") == "inside.txt"
    assert ws.read_file("sub/up/sub/file.txt", 100) == (b"sub-file", False)
    assert ws.resolve("abs_inside/file.txt") == "sub/file.txt"      # absolute, back inside: allowed
    assert ws.resolve("abs_root/inside.txt") == "inside.txt"
    assert ws.resolve("abs_root") == "."
    assert ws.resolve("sub/../inside.txt") == "inside.txt"
    assert ws.resolve("./sub//file.txt") == "sub/file.txt"
    assert ws.resolve("") == "." and ws.resolve(".") == "."
    assert ws.resolve("new-file") == "new-file"                      # a file about to be created
    assert ws.resolve("dangling_in") == "sub/created-through-link"
    ws.write_file("dangling_in", b"made")                            # creates the target inside
    assert (world.root / "sub" / "created-through-link").read_bytes() == b"made"
    assert os.path.islink(world.root / "dangling_in")


def test_absolute_link_through_the_roots_other_name(world, tmp_path):
    alias = tmp_path / "alias"
    os.symlink(world.root, alias)
    os.symlink(str(alias / "sub"), world.root / "via_alias")
    with Workspace(alias) as ws:
        assert ws.resolve("via_alias/file.txt") == "sub/file.txt"    # matches the given root
        assert ws.resolve("abs_inside/file.txt") == "sub/file.txt"   # matches the real root
        with pytest.raises(FsError) as info:
            ws.stat("abs_lookalike/secret")
        assert info.value.code is P


def test_links_outside_are_reported_not_followed(world):
    ws = world.ws
    assert ws.readlink("to_root") == "/"
    assert ws.readlink("to_secret") == "../outside/secret"
    assert ws.link_target("to_root") is None
    assert ws.link_target("sub/up") == "."
    assert stat.S_ISLNK(ws.lstat("to_outside_abs").st_mode)
    assert "to_outside_abs" in ws.listdir("")
    with pytest.raises(FsError) as info:
        ws.readlink("inside.txt")
    assert info.value.code is I and info.value.errno == errno.EINVAL
    ws.unlink("to_secret")                                           # removes the link only
    assert (world.out / "secret").read_bytes() == world.secret


def test_hard_link_to_outside_file_is_inside(world):
    """A hard link is the same inode under a name inside: readable by definition.

    Creating it needs access to the outside file already; see docs/devices.md.
    """
    os.link(world.out / "secret", world.root / "hard")
    assert world.ws.read_file("hard", 1000) == (world.secret, False)


def test_open_is_race_free_against_final_symlink(world):
    fd = world.ws.open("inside.txt", os.O_RDONLY | os.O_NOFOLLOW)
    os.close(fd)
    with pytest.raises(FsError) as info:
        world.ws.open("sub/up", os.O_RDONLY | os.O_NOFOLLOW)
    assert info.value.errno == errno.ELOOP


# -- the API -------------------------------------------------------------------------------
def test_open_read_write(world):
    ws = world.ws
    fd = ws.open("new.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    os.write(fd, b"hello")
    os.close(fd)
    assert (world.root / "new.txt").read_bytes() == b"hello"
    assert stat.S_IMODE(ws.stat("new.txt").st_mode) & 0o600 == 0o600
    assert ws.read_file("new.txt", 3) == (b"hel", True)
    assert ws.read_file("new.txt", 5) == (b"hello", False)
    assert ws.read_file("new.txt", 0) == (b"", True)
    fd = ws.open("sub", os.O_RDONLY | os.O_DIRECTORY)
    assert stat.S_ISDIR(os.fstat(fd).st_mode)
    os.close(fd)
    fd = ws.open("new.txt", os.O_RDONLY)
    assert os.get_blocking(fd) and os.get_inheritable(fd) is False
    os.close(fd)
    with pytest.raises(FsError) as info:
        ws.open("new.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    assert info.value.errno == errno.EEXIST
    with pytest.raises(FsError) as info:
        ws.open("missing", os.O_RDONLY)
    assert info.value.code is N and info.value.errno == errno.ENOENT
    with pytest.raises(FsError) as info:
        ws.open("", os.O_RDONLY)
    assert info.value.code is I
    with pytest.raises(FsError) as info:
        ws.read_file("sub", 10)
    assert info.value.errno == errno.EISDIR


def test_trailing_slash(world):
    ws = world.ws
    assert ws.resolve("sub/") == "sub"
    assert ws.listdir("sub/") == ["chain2", "deep", "file.txt", "mid", "up", "upup"]
    for call in (lambda: ws.stat("inside.txt/"), lambda: ws.read_file("inside.txt/", 10),
                 lambda: ws.unlink("inside.txt/")):
        with pytest.raises(FsError) as info:
            call()
        assert info.value.errno == errno.ENOTDIR
    ws.mkdir("newdir/")
    ws.rmdir("newdir/")


def test_fifo_and_devices_are_not_served(world):
    os.mkfifo(world.root / "fifo")
    t = time.monotonic()
    for flags in (os.O_RDONLY, os.O_WRONLY):
        with pytest.raises(FsError) as info:
            world.ws.open("fifo", flags)
        assert info.value.code is I
    with pytest.raises(FsError):
        world.ws.read_file("fifo", 10)
    assert time.monotonic() - t < 1          # never blocked on the FIFO
    assert world.ws.grep("x", "fifo") == []


def test_write_file_atomic_and_keeps_mode(world):
    ws = world.ws
    target = world.root / "script.sh"
    target.write_bytes(b"old")
    os.chmod(target, 0o751)
    ino = target.stat().st_ino
    assert ws.write_file("script.sh", "new") == 3
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o751
    assert target.stat().st_ino != ino                      # replaced, not rewritten in place
    assert not [n for n in os.listdir(world.root) if ".rnix-" in n]   # no temp file left
    with pytest.raises(FsError) as info:
        ws.write_file("nope.txt", b"x", create=False)
    assert info.value.code is N
    with pytest.raises(FsError) as info:
        ws.write_file("sub", b"x")
    assert info.value.errno == errno.EISDIR
    with pytest.raises(FsError) as info:
        ws.write_file("missing-dir/x", b"x")
    assert info.value.code is N
    ws.write_file("abs_inside/through-link.txt", b"ok")    # a link inside is written through
    assert (world.root / "sub" / "through-link.txt").read_bytes() == b"ok"


def test_write_file_concurrent_readers_never_see_a_mix(world):
    ws = world.ws
    a, b = b"A" * 200_000, b"B" * 200_000
    ws.write_file("big", a)
    stop = threading.Event()
    bad = []

    def reader():
        while not stop.is_set():
            data, _ = ws.read_file("big", 1 << 20)
            if data not in (a, b):
                bad.append(len(data))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(60):
            ws.write_file("big", a if i % 2 else b)
    finally:
        stop.set()
        t.join()
    assert bad == []


def test_mkdir_unlink_rmdir_rename(world):
    ws = world.ws
    ws.mkdir("d")
    with pytest.raises(FsError) as info:
        ws.mkdir("d")
    assert info.value.errno == errno.EEXIST and info.value.code is I
    ws.write_file("d/f", b"1")
    with pytest.raises(FsError) as info:
        ws.rmdir("d")
    assert info.value.errno == errno.ENOTEMPTY
    with pytest.raises(FsError) as info:
        ws.unlink("d")
    assert info.value.errno == errno.EISDIR
    ws.rename("d/f", "g")
    assert ws.read_file("g", 10) == (b"1", False)
    ws.write_file("h", b"2")
    with pytest.raises(FsError) as info:
        ws.rename("g", "h", noreplace=True)
    assert info.value.errno == errno.EEXIST
    ws.rename("g", "h", exchange=True)
    assert ws.read_file("g", 10)[0] == b"2" and ws.read_file("h", 10)[0] == b"1"
    ws.unlink("g")
    ws.rmdir("d")
    for call in (lambda: ws.rmdir(""), lambda: ws.rmdir("."), lambda: ws.unlink("sub/.."),
                 lambda: ws.rename(".", "x"), lambda: ws.rename("h", "sub/..")):
        with pytest.raises(FsError) as info:
            call()
        assert info.value.code in (I, Code.BUSY)
    ws.symlink("sub/file.txt", "ln")
    assert ws.read_file("ln", 100) == (b"sub-file", False)
    ws.rename("ln", "sub/ln")                            # the link moves, its text does not change
    assert ws.readlink("sub/ln") == "sub/file.txt"
    with pytest.raises(FsError):
        ws.read_file("sub/ln", 10)                       # now dangling (sub/sub/file.txt)


def test_chmod_truncate_utime_entries(world):
    ws = world.ws
    ws.chmod("inside.txt", 0o600)
    assert stat.S_IMODE((world.root / "inside.txt").stat().st_mode) == 0o600
    ws.chmod("sub/up/inside.txt", 0o644)                 # through a link inside
    assert stat.S_IMODE((world.root / "inside.txt").stat().st_mode) == 0o644
    ws.truncate("inside.txt", 2)
    assert (world.root / "inside.txt").read_bytes() == b"in"
    ws.utime("inside.txt", (10**9, 2 * 10**9))
    assert (world.root / "inside.txt").stat().st_mtime_ns == 2 * 10**9
    names = dict(ws.entries("sub"))
    assert stat.S_ISLNK(names["up"].st_mode) and stat.S_ISREG(names["file.txt"].st_mode)
    assert ws.exists("sub/file.txt") and not ws.exists("nope")


def test_glob(world):
    ws = world.ws
    (world.root / ".git").mkdir()
    (world.root / ".git" / "config").write_bytes(b"[core]")
    (world.root / "node_modules" / "m").mkdir(parents=True)
    (world.root / "node_modules" / "m" / "i.js").write_bytes(b"x")
    (world.root / "sub" / "a.py").write_bytes(b"print(1)\n")
    (world.root / "b.py").write_bytes(b"print(2)\n")
    assert ws.glob("*.py") == ["b.py"]
    assert ws.glob("**/*.py") == ["b.py", "sub/a.py"]
    assert ws.glob("sub/*.txt") == ["sub/file.txt"]
    assert ws.glob("sub/**") == ["sub/a.py", "sub/chain2", "sub/deep", "sub/deep/x.txt",
                                 "sub/file.txt", "sub/mid", "sub/up", "sub/upup"]
    assert ws.glob("abs_inside/*.txt") == ["sub/file.txt"]          # canonical paths
    assert ws.glob("s?b/[fa]*") == ["sub/a.py", "sub/file.txt"]
    everything = ws.glob("**", 10_000)
    assert ".git/config" not in everything and "node_modules/m/i.js" not in everything
    assert ".git" in everything                                     # listed, not descended
    assert ws.glob(".git/*") == [".git/config"]                     # named: descended
    for p in everything:                                            # no descent through links
        parts = p.split("/")
        for k in range(1, len(parts)):
            assert not os.path.islink(world.root.joinpath(*parts[:k])), p
    assert ws.glob("inside.txt") == ["inside.txt"] and ws.glob("missing") == []
    assert ws.glob("to_root") == ["to_root"]                       # the link itself is a name
    few = ws.glob("**", 3)
    assert isinstance(few, Matches) and len(few) == 3 and few.truncated
    assert not ws.glob("**", 10_000).truncated
    for bad, code in (("", I), ("/etc/*", P), ("../*", P), ("*/../*", I), ("to_root/*", P)):
        with pytest.raises(FsError) as info:
            ws.glob(bad)
        assert info.value.code is code, bad


def test_grep(world):
    ws = world.ws
    (world.root / "a.py").write_text("import os\nx = 1\n# TODO fix\n")
    (world.root / "sub" / "b.py").write_text("def f():\n    return 'todo'\n")
    (world.root / "bin.dat").write_bytes(b"TODO\0\1\2")
    (world.root / "long.txt").write_text("TODO " + "y" * 5000 + "\n")
    assert ws.grep("TODO", "*.py") == [("a.py", 3, "# TODO fix")]
    assert ws.grep("todo", "*.py", ignore_case=True) == [("a.py", 3, "# TODO fix"),
                                                        ("sub/b.py", 2, "    return 'todo'")]
    assert ws.grep("return", "sub") == [("sub/b.py", 2, "    return 'todo'")]
    assert ws.grep("return", "sub/b.py") == [("sub/b.py", 2, "    return 'todo'")]
    assert ws.grep("return", "abs_inside/b.py") == [("sub/b.py", 2, "    return 'todo'")]
    hits = ws.grep("TODO")
    assert ("bin.dat", 1, "TODO") not in hits                      # binary skipped
    long = [h for h in hits if h[0] == "long.txt"][0]
    assert len(long[2]) == 401 and long[2].endswith("…")
    assert all(world.secret.decode() not in h[2] for h in ws.grep("SECRET", "**"))
    cut = ws.grep(".", "**", 2)
    assert len(cut) == 2 and cut.truncated
    with pytest.raises(FsError) as info:
        ws.grep("(", "**")
    assert info.value.code is I
    with pytest.raises(FsError) as info:
        ws.grep("x", "to_outside_rel/*")
    assert info.value.code is P


def test_errors_are_syscall_errors(world):
    with pytest.raises(SyscallError) as info:
        world.ws.stat("../x")
    err = info.value
    assert err.code is P and err.syscall == "Stat" and err.device == "/dev/fs"
    assert "[PERMISSION]" in str(err) and "outside" in err.cause
    assert str(world.tmp) not in err.cause        # the host path of the root is not leaked


def test_closed_workspace(tmp_path):
    ws = Workspace(tmp_path)
    ws.close()
    ws.close()
    with pytest.raises(FsError) as info:
        ws.stat("")
    assert info.value.code is Code.INTERNAL
    with pytest.raises(FsError) as info:
        Workspace(tmp_path / "missing")
    assert info.value.code is N


# -- races ---------------------------------------------------------------------------------
RACE_SECONDS = 1.0


def _race(world, swap, readers: list, *, expect_refusals: bool = True):
    """Run ``swap()`` in a loop in one thread and each reader in another."""
    stop = threading.Event()
    stats = {"swaps": 0, "ok": 0, "refused": 0, "escapes": [], "errors": []}
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)

    def swapper():
        while not stop.is_set():
            try:
                swap()
                stats["swaps"] += 1
            except OSError:
                pass

    def run(reader):
        while not stop.is_set():
            try:
                reader(stats)
                stats["ok"] += 1
            except FsError as exc:
                stats["refused"] += 1
                if exc.code not in (P, N, I, Code.BUSY):
                    stats["errors"].append(repr(exc))
            except Exception as exc:  # noqa: BLE001 - anything else is a bug
                stats["errors"].append(repr(exc))

    threads = [threading.Thread(target=swapper)] + [threading.Thread(target=run, args=(r,))
                                                    for r in readers]
    try:
        for t in threads:
            t.start()
        time.sleep(RACE_SECONDS)
    finally:
        stop.set()
        for t in threads:
            t.join()
        sys.setswitchinterval(old)
    print(f"\n  race: {stats['swaps']} swaps, {stats['ok']} reads inside, {stats['refused']} refused, "
          f"{len(stats['escapes'])} escapes", end="")
    assert stats["errors"] == []
    assert stats["escapes"] == [], stats["escapes"][:5]
    assert stats["swaps"] > 100 and stats["ok"] > 10
    if expect_refusals:
        assert stats["refused"] > 10
    return stats


def _exchange(root: Path, a: str, b: str):
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        renameat2(fd, a, fd, b, RENAME_EXCHANGE)
    finally:
        os.close(fd)


def _reader(world, path: str, expected: bytes):
    def read(stats):
        data, _ = world.ws.read_file(path, 1 << 16)
        if world.secret in data or data != expected:
            stats["escapes"].append((path, data[:40]))
    return read


def _fd_reader(world, path: str, expected: bytes):
    out_ino = {os.stat(p).st_ino for p in (world.out / "f", world.out / "secret", world.out / "inside.txt")}

    def read(stats):
        fd = world.ws.open(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            data = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        if st.st_ino in out_ino or world.secret in data or data != expected:
            stats["escapes"].append((path, data[:40]))
    return read


def test_race_directory_swapped_for_symlink_to_outside(world):
    """d/ flips atomically (RENAME_EXCHANGE) between a real directory and a link to outside."""
    (world.root / "d").mkdir()
    (world.root / "d" / "f").write_bytes(b"inside-d")
    os.symlink("../outside", world.root / "d_alt")
    stats = _race(world, lambda: _exchange(world.root, "d", "d_alt"),
                  [_reader(world, "d/f", b"inside-d"), _fd_reader(world, "d/f", b"inside-d"),
                   _reader(world, "d/../d/f", b"inside-d")])
    assert stats["ok"] > 10 and stats["refused"] > 10


def test_race_directory_renamed_away_and_replaced(world):
    """Non-atomic variant: d/ is moved aside, a symlink to outside takes its name, and back."""
    (world.root / "d").mkdir()
    (world.root / "d" / "f").write_bytes(b"inside-d")
    root = world.root

    def swap():
        os.rename(root / "d", root / "d_real")
        os.symlink(str(world.out), root / "d")
        os.unlink(root / "d")
        os.symlink("../outside", root / "d")
        os.unlink(root / "d")
        os.rename(root / "d_real", root / "d")

    _race(world, swap, [_reader(world, "d/f", b"inside-d"), _fd_reader(world, "d/f", b"inside-d")])


def test_race_final_file_swapped_for_symlink_to_outside(world):
    (world.root / "f").write_bytes(b"inside-f")
    os.symlink("../outside/f", world.root / "f_alt")
    _race(world, lambda: _exchange(world.root, "f", "f_alt"),
          [_reader(world, "f", b"inside-f"), _fd_reader(world, "f", b"inside-f")])


def test_race_symlink_retargeted_between_inside_and_outside(world):
    """flip is a link that is atomically replaced: -> sub (inside) / -> ../outside."""
    root = world.root
    os.symlink("sub", root / "flip")
    n = [0]

    def swap():
        n[0] += 1
        tmp = root / f"flip.{n[0]}"
        os.symlink("sub" if n[0] % 2 else "../outside", tmp)
        os.rename(tmp, root / "flip")

    _race(world, swap, [_reader(world, "flip/file.txt", b"sub-file"),
                        _fd_reader(world, "flip/file.txt", b"sub-file")])


def test_race_writes_never_land_outside(world):
    (world.root / "d").mkdir()
    os.symlink("../outside", world.root / "d_alt")
    before = snapshot(world)
    counter = [0]

    def write(stats):
        counter[0] += 1
        world.ws.write_file(f"d/w{counter[0] % 7}", b"written")
        fd = world.ws.open(f"d/c{counter[0] % 5}", os.O_WRONLY | os.O_CREAT)
        os.close(fd)
        world.ws.mkdir(f"d/m{counter[0]}")

    _race(world, lambda: _exchange(world.root, "d", "d_alt"), [write])
    assert snapshot(world) == before
    leftovers = [n for n in os.listdir(world.out) if n.startswith(("w", "c", "m", "."))]
    assert leftovers == []


def test_race_parent_moved_while_dotdot_is_walked(world):
    """'..' pops our own fd stack: moving a directory out mid-walk cannot lift '..' outside."""
    (world.root / "a" / "b" / "c").mkdir(parents=True)
    (world.root / "a" / "inside.txt").write_bytes(b"inside-a")
    root = world.root

    def swap():
        os.rename(root / "a" / "b", world.out / "b")
        os.rename(world.out / "b", root / "a" / "b")

    # the kernel's own '..' would reach outside/inside.txt (the secret) while b is moved out
    _race(world, swap, [_reader(world, "a/b/c/../../inside.txt", b"inside-a"),
                        _fd_reader(world, "a/b/c/../../inside.txt", b"inside-a")])


# -- Grep and Glob match in linear time (docs/devices.md, "Grep and Glob") -----------------
def test_catastrophic_patterns_finish_fast(tmp_path):
    (tmp_path / "evil.txt").write_text(("a" * 34 + "c\n") * 2000)
    (tmp_path / ("a" * 240 + "c")).write_text("x")
    with Workspace(tmp_path) as ws:
        t0 = time.monotonic()
        assert ws.grep("(a*)*b") == []                         # hours under Python's re
        assert ws.grep("(x+x+)+y|(a|aa)+$b") == []
        assert ws.glob("*a" * 16 + "*b") == []                 # one name, 16 stars
        assert ws.glob("**/" + "*a" * 16 + "*b") == []
        assert ws.glob("*a" * 16 + "*c") == ["a" * 240 + "c"]
        assert time.monotonic() - t0 < 20


def test_grep_regex_semantics_and_refusals(tmp_path):
    (tmp_path / "t.txt").write_text("Alpha beta\nfoo123\ncafé\nend\n")
    with Workspace(tmp_path) as ws:
        assert ws.grep(r"^foo\d+$") == [("t.txt", 2, "foo123")]
        assert ws.grep(r"(?P<w>b\w+)") == [("t.txt", 1, "Alpha beta")]
        assert ws.grep("ALPHA", ignore_case=True) == [("t.txt", 1, "Alpha beta")]
        assert ws.grep("caf.$") == [("t.txt", 3, "café")]     # a character, not a byte
        assert ws.grep(r"end\Z") == [("t.txt", 4, "end")]      # Python's \Z is accepted
        assert ws.grep(r"caf\u00e9") == [("t.txt", 3, "café")]  # and \uXXXX
        assert ws.grep(r"end\\Z") == []                        # a literal backslash, then Z
        for bad in (r"(a)\1", r"foo(?=1)", r"(?<!x)foo", "(", "a{2000}", "x" * 5000):
            with pytest.raises(FsError) as info:
                ws.grep(bad)
            assert info.value.code is Code.INVALID, bad
        with pytest.raises(FsError) as info:
            ws.grep(r"(a)\1")
        assert "linear time" in info.value.cause


def test_glob_semantics_on_odd_names(tmp_path):
    for name in ("a.py", "b c.py", "x[1].txt", "dash-name", ".hidden", "é.md"):
        (tmp_path / name).write_text("x")
    os.close(os.open(os.path.join(os.fsencode(tmp_path), b"raw\xff.py"), os.O_CREAT | os.O_WRONLY))
    with Workspace(tmp_path) as ws:
        assert ws.glob("*.py") == ["a.py", "b c.py", os.fsdecode(b"raw\xff.py")]
        assert ws.glob("x[[]1].txt") == ["x[1].txt"]
        assert ws.glob("[!a-c]*") == [".hidden", "dash-name", "raw\udcff.py", "x[1].txt", "é.md"]
        assert ws.glob("?.md") == ["é.md"]
        assert ws.glob("raw?.py") == ["raw\udcff.py"]
        assert ws.glob("**/*-*") == ["dash-name"]


def test_search_cancel_and_timeout(tmp_path):
    for i in range(600):
        (tmp_path / f"f{i:03d}.txt").write_text("needle\n" * 100)
    with Workspace(tmp_path) as ws:
        cancel = threading.Event()
        cancel.set()
        for fn in (lambda: ws.grep("needle", cancel=cancel), lambda: ws.glob("**", cancel=cancel)):
            with pytest.raises(FsError) as info:
                fn()
            assert info.value.code is Code.INTERRUPTED
        late = ws.grep("needle", limit=10**6, timeout=1e-9)
        assert late.truncated and late.timed_out and len(late) < 600 * 100
        full = ws.grep("needle", limit=10**6, timeout=600)
        assert len(full) == 600 * 100 and not full.truncated and not full.timed_out


# -- link, mknod, chown, hidden ---------------------------------------------------------
def test_hard_link_mknod_chown_stay_inside(world):
    ws, root = world.ws, world.root
    before = snapshot(world)
    ws.link("inside.txt", "sub/hard.txt")
    assert os.path.samefile(root / "inside.txt", root / "sub" / "hard.txt")
    ws.link("to_secret", "link-of-link")            # a final symlink is linked itself
    assert os.readlink(root / "link-of-link") == "../outside/secret"
    for src, dst, code in (("to_outside_rel/secret", "x1", P), ("inside.txt", "to_outside_rel/x2", P),
                           ("../outside/secret", "x3", P), ("inside.txt", "/tmp/x4", P),
                           ("sub", "x5", P), ("inside.txt", "sub/file.txt", I), ("missing", "x6", N)):
        with pytest.raises(FsError) as info:
            ws.link(src, dst)
        assert info.value.code == code, (src, dst, info.value)
    ws.mknod("fifo", stat.S_IFIFO | 0o600)
    assert stat.S_ISFIFO(os.lstat(root / "fifo").st_mode)
    for mode in (stat.S_IFCHR | 0o600, stat.S_IFBLK | 0o600):
        with pytest.raises(FsError) as info:
            ws.mknod("dev", mode)
        assert info.value.code == P and info.value.errno == errno.EPERM
    with pytest.raises(FsError) as info:
        ws.mknod("to_outside_rel/fifo", stat.S_IFIFO | 0o600)
    assert info.value.code == P
    if os.geteuid() == 0:
        ws.chown("to_secret", 123, 456)                # the link itself, never its target
        assert os.lstat(root / "to_secret").st_uid == 123
        with pytest.raises(FsError):
            ws.chown("to_outside_rel/secret", 123, 456)
    assert snapshot(world) == before


def test_hidden_paths_are_never_served(tmp_path):
    root = tmp_path / "ws"
    (root / "sub" / "m").mkdir(parents=True)
    (root / "sub" / "m" / "x").write_text("x")
    os.symlink("sub/m", root / "to-m")
    os.symlink("sub", root / "to-sub")
    with Workspace(root, hidden=("sub/m",)) as ws:
        assert ws.listdir("sub") == []
        assert [n for n, _ in ws.entries("sub")] == []
        for path in ("sub/m", "sub/m/x", "to-m", "to-m/x", "to-sub/m/x", "sub/../sub/m"):
            with pytest.raises(FsError) as info:
                ws.stat(path)
            assert info.value.code == N, path
        for call in (lambda: ws.mkdir("sub/m"), lambda: ws.write_file("sub/m/y", b"y"),
                     lambda: ws.rename("sub", "sub/m"), lambda: ws.unlink("sub/m/x")):
            with pytest.raises(FsError):
                call()
        assert "sub/m/x" not in ws.glob("**") and not ws.grep("x", "**")
    assert (root / "sub" / "m" / "x").read_text() == "x"
