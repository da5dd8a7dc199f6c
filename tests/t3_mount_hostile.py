"""Inputs that once crashed the daemon (pyfuse3 ends its loop on any
exception that is not a FUSEError): each must give an errno, and the mount
must stay up."""
from __future__ import annotations

import os

import pytest

from rnixfs.fuse.ops import Operations
from tests.mountutil import needs_fuse, sh

pytestmark = [needs_fuse, pytest.mark.mount]


def run(m, script, **kw):
    return sh(script, env={**os.environ, "M": str(m.path)}, **kw)


def test_every_handler_is_guarded():
    for name in ("getattr", "lookup", "readdir", "read", "write", "open", "create", "getxattr",
                 "readlink", "setattr", "mkdir", "unlink", "rename", "fsync", "flush", "release"):
        assert hasattr(getattr(Operations, name), "__wrapped__"), name


@pytest.mark.expect_log('name mismatch')
def test_hostile_inputs_keep_the_daemon_up(mnt):
    p = mnt.project
    os.symlink("nodir/x", p / "dangling")
    os.symlink("loop", p / "loop")
    (p / "ok.txt").write_text("fine\n")
    res = run(mnt, 'ls "$M/dev/fs"')
    assert res.returncode == 0 and "ok.txt" in res.stdout and "dangling" in res.stdout  # a link, listed
    res = run(mnt, 'cat "$M/dev/fs/loop"')
    assert res.returncode != 0
    res = run(mnt, """echo '{"intent": "x", "cwd": "loop"}' > "$M/proc/new" """)
    assert res.returncode != 0 and ("Invalid argument" in res.stderr or "No such file" in res.stderr)
    deep = "[" * 30000 + "]" * 30000
    res = run(mnt, f"""printf '%s' '{{"intent": "x", "n": {deep}}}' > "$M/proc/new" """)
    assert res.returncode != 0 and "Invalid argument" in res.stderr
    res = run(mnt, f"""exec 3<>"$M/dev/llm/scripted"; printf '%s' '{{"messages": {deep}}}' >&3""")
    assert res.returncode != 0 and "Invalid argument" in res.stderr
    bad = os.fsencode(str(mnt.config_dir / "skills")) + b"/bad\xff"
    os.makedirs(bad)
    with open(bad + b"/SKILL.md", "w") as f:
        f.write("---\nname: x\ndescription: y\n---\n")
    run(mnt, 'ls "$M/skills" >/dev/null; getfattr -d "$M"/skills/* >/dev/null 2>&1')
    assert mnt.daemon_alive()
    assert run(mnt, 'cat "$M/dev/fs/ok.txt"').stdout == "fine\n"
