"""dev/fs as a filesystem: symlinks stored as given, hard links, FIFOs, and
a real `python -m venv` inside the mount (see docs/devices.md, "POSIX")."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tests.mountutil import needs_fuse, sh

pytestmark = [needs_fuse, pytest.mark.mount]


def run(m, script, **kw):
    return sh(script, env={**os.environ, "M": str(m.path), "FS": m.p("dev/fs")}, **kw)


def test_symlinks_are_stored_as_given(mnt):
    (mnt.project / "a.txt").write_text("A\n")
    (mnt.project / "sub").mkdir()
    res = run(mnt, 'cd "$FS" && ln -s a.txt rel && ln -s ../a.txt sub/up && ln -s /etc/hostname abs'
                   ' && ln -s nowhere/x dangling && ln -s "$(printf "odd\\ttext")" odd && ls -l >/dev/null')
    assert res.returncode == 0, res.stderr
    for name, text in (("rel", "a.txt"), ("sub/up", "../a.txt"), ("abs", "/etc/hostname"),
                       ("dangling", "nowhere/x"), ("odd", "odd\ttext")):
        assert os.readlink(mnt.project / name) == text        # on disk, as given
        assert os.readlink(mnt.p(f"dev/fs/{name}")) == text   # and through the mount
        assert stat.S_ISLNK(os.lstat(mnt.p(f"dev/fs/{name}")).st_mode)
    assert open(mnt.p("dev/fs/sub/up")).read() == "A\n"
    # times of the link itself (touch -h), not of its target
    before = os.stat(mnt.project / "a.txt").st_mtime
    assert run(mnt, 'touch -h -d @1000000000 "$FS/rel"').returncode == 0
    assert os.lstat(mnt.project / "rel").st_mtime == 1000000000
    assert os.stat(mnt.project / "a.txt").st_mtime == before
    assert {"rel", "abs", "dangling", "odd"} <= set(os.listdir(mnt.p("dev/fs")))
    # renaming and removing a link touch the link, never its target
    assert run(mnt, 'cd "$FS" && mv rel sub/rel2 && rm abs dangling').returncode == 0
    assert os.readlink(mnt.project / "sub/rel2") == "a.txt" and (mnt.project / "a.txt").exists()
    assert not os.path.lexists(mnt.project / "abs") and os.path.exists("/etc/hostname")


def test_agent_tools_do_not_follow_a_link_out(mnt, scripted_server):
    """A link to outside made through the mount is a name to the agents' tools,
    never a way out: the daemon's walker refuses to go through it."""
    import json
    secret = mnt.project.parent / "outside-secret.txt"
    secret.write_text("OUTSIDE\n")
    assert run(mnt, f'ln -s "{secret}" "$FS/out" && ln -s ../outside-secret.txt "$FS/out2"').returncode == 0
    mark = "LINK-OUT"
    calls = [{"id": f"c{i}", "function": {"name": "Read", "arguments": json.dumps({"path": p})}}
             for i, p in enumerate(("out", "out2"))]
    calls.append({"id": "w", "function": {"name": "Write", "arguments": json.dumps(
        {"path": "out", "content": "overwritten"})}})
    scripted_server.enqueue({"match": mark, "tool_calls": calls})
    scripted_server.enqueue({"match": mark, "content": "done"})
    pid = mnt.spawn(mark)
    assert mnt.wait(pid).startswith("exited(0)")
    results = [json.loads(line)["content"] for line in open(mnt.p(f"proc/{pid}/context"))
               if '"role": "tool"' in line]
    assert all(r.startswith("error:") for r in results), results
    assert "OUTSIDE" not in "".join(results) and secret.read_text() == "OUTSIDE\n"


def test_hard_links(mnt):
    (mnt.project / "a.txt").write_text("one\n")
    (mnt.project / "d").mkdir()
    res = run(mnt, 'cd "$FS" && ln a.txt d/b.txt && echo two >> d/b.txt && cat a.txt')
    assert res.returncode == 0 and res.stdout == "one\ntwo\n", res.stderr
    assert os.stat(mnt.project / "a.txt").st_nlink == 2
    assert os.stat(mnt.p("dev/fs/d/b.txt")).st_nlink == 2
    assert os.path.samefile(mnt.project / "a.txt", mnt.project / "d/b.txt")
    res = run(mnt, 'ln "$FS/d" "$FS/d2"')
    assert res.returncode != 0 and "not allowed" in res.stderr.lower() or "Operation not permitted" in res.stderr
    res = run(mnt, 'ln "$FS/a.txt" "$FS/d/b.txt"')
    assert res.returncode != 0 and "File exists" in res.stderr
    res = run(mnt, 'ln "$M/proc/new" "$FS/stolen"')
    assert res.returncode != 0 and not os.path.lexists(mnt.project / "stolen")
    assert run(mnt, 'rm "$FS/a.txt" && cat "$FS/d/b.txt"').stdout == "one\ntwo\n"


def test_fifos_and_no_device_nodes(mnt):
    res = run(mnt, 'mkfifo "$FS/pipe" && test -p "$FS/pipe"')
    assert res.returncode == 0, res.stderr
    assert stat.S_ISFIFO(os.lstat(mnt.project / "pipe").st_mode)
    res = run(mnt, '(echo through > "$FS/pipe" &) ; timeout 20 cat "$FS/pipe"', timeout=30)
    assert res.returncode == 0 and res.stdout == "through\n", res.stderr
    for spec in ("c 1 3", "b 7 0"):
        res = run(mnt, f'mknod "$FS/dev{spec[0]}" {spec}')
        assert res.returncode != 0 and "Operation not permitted" in res.stderr, res.stderr
        assert not os.path.lexists(mnt.project / f"dev{spec[0]}")
    # a FIFO is not data to the agents' tools: Read refuses at once instead of hanging
    from rnixfs.devices.fs import FsError, Workspace
    with Workspace(mnt.project) as ws, pytest.raises(FsError):
        ws.read_file("pipe", 100)


def test_python_venv_inside_dev_fs(mnt):
    base = getattr(sys, "_base_executable", sys.executable)
    res = run(mnt, f'"{base}" -m venv --without-pip "$FS/venv" && "$FS/venv/bin/python" -c '
                   '"import sys; print(sys.prefix)"', timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == mnt.p("dev/fs/venv")
    assert os.path.islink(mnt.project / "venv/bin/python")
    cfg = (mnt.project / "venv/pyvenv.cfg").read_text()
    assert "home" in cfg
    res = run(mnt, '"$FS/venv/bin/python" -c "import json, sqlite3; print(42)"', timeout=120)
    assert res.stdout.strip() == "42", res.stderr


def test_a_removed_file_stays_usable_while_open(mnt):
    script = ('import os, sys\n'
              'p = sys.argv[1]\n'
              'fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o600)\n'
              'os.write(fd, b"Hello")\n'
              'os.unlink(p)\n'
              'st = os.fstat(fd)\n'
              'print(st.st_size, st.st_nlink, os.pread(fd, 5, 0).decode(), os.path.exists(p))\n')
    res = subprocess.run([sys.executable, "-c", script, mnt.p("dev/fs/tmpfile")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["5", "0", "Hello", "False"]
