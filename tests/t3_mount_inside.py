"""A mount point inside the project: dev/fs and the agents' tools never step
on it (a stat of it would wait on the daemon itself); see docs/devices.md."""
from __future__ import annotations

import json
import os

import pytest

from tests.mountutil import mounted_points, needs_fuse, rnixfs, scripted_providers, sh

pytestmark = [needs_fuse, pytest.mark.mount]


def call(name, args, cid):
    return {"id": cid, "function": {"name": name, "arguments": json.dumps(args)}}


def test_mount_point_inside_the_project_is_hidden(mount_factory, scripted_server, tmp_path):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "a.py").write_text("x = 1\n")
    m = mount_factory(scripted_providers(scripted_server.url), name="project/m")
    assert m.path.parent == m.project
    os.symlink("m", project / "to-mount")
    os.symlink("m/proc", project / "to-proc")
    os.symlink(str(m.path), project / "abs-to-mount")

    M = m.path
    res = sh(f'ls -a "{M}/dev/fs"', timeout=20, check=True)
    names = res.stdout.split()
    assert "src" in names and "m" not in names and "to-mount" in names
    for path in ("m", "m/proc", "m/dev/fs", "to-mount/proc", "to-proc"):
        res = sh(f'ls "{M}/dev/fs/{path}/"', timeout=20)
        assert res.returncode != 0 and "No such file or directory" in res.stderr, (path, res)
        res = sh(f'stat -L "{M}/dev/fs/{path}"', timeout=20)
        assert res.returncode != 0, path
    # a link with the mount's absolute path is followed by the caller's kernel, not the daemon
    res = sh(f'ls "{M}/dev/fs/abs-to-mount/proc"', timeout=20)
    assert res.returncode == 0 and "new" in res.stdout.split(), res.stderr
    for script in (f'mkdir "{M}/dev/fs/m/x"', f'touch "{M}/dev/fs/m/y"', f'mkdir "{M}/dev/fs/m"',
                   f'mv "{M}/dev/fs/src" "{M}/dev/fs/m"'):
        assert sh(script, timeout=20).returncode != 0, script
    sh(f'rm -rf "{M}/dev/fs/m"', timeout=20)
    assert str(M) in mounted_points() and (M / "proc").is_dir()
    res = sh(f'ls -R "{M}/dev/fs" | wc -l', timeout=60, check=True)
    assert int(res.stdout) < 50
    res = sh(f'find "{M}/dev/fs" | sort', timeout=60)
    assert f"{M}/dev/fs/src/a.py" in res.stdout.split() and "/m/" not in res.stdout.replace(str(M), "")

    # the agents' tools do not see it either
    mark = "INSIDE-MARK"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Glob", {"pattern": "**"}, "a"), call("Grep", {"pattern": "x", "glob": "**"}, "b"),
        call("Read", {"path": "m/proc/new"}, "c"), call("Glob", {"pattern": "m/*"}, "d")]})
    scripted_server.enqueue({"match": mark, "content": "done"})
    pid = m.spawn(mark)
    assert m.wait(pid, timeout=60).startswith("exited(0)")
    results = [json.loads(line)["content"] for line in open(m.p(f"proc/{pid}/context"))
               if '"role": "tool"' in line]
    assert "src/a.py" in results[0] and not any(r.startswith("m/") or r == "m" for r in results[0].split("\n"))
    assert "src/a.py:1:" in results[1] and "m/" not in results[1]
    assert results[2].startswith("error:")
    assert "m/" not in results[3]

    # the daemon still answers, and the mount unmounts cleanly
    assert sh(f'stat "{M}/proc"', timeout=10).returncode == 0
    rnixfs("umount", str(M), timeout=60)
    assert str(M) not in mounted_points()


def test_mount_over_the_project_is_refused(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    for target, proj in ((project, project), (tmp_path, project)):
        res = rnixfs("mount", str(target), "--project", str(proj), "--state-dir", str(tmp_path / "s"),
                     "--config-dir", str(tmp_path / "c"), check=False)
        assert res.returncode != 0 and "would hide the project" in res.stderr, res.stderr
        assert str(target) not in mounted_points()
