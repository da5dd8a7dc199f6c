"""Scripts of skills installed without --allow-scripts: not runnable by agents."""
from __future__ import annotations

import json
import os

import pytest
import trio

from rnixfs.devices import shell
from rnixfs.kernel.errors import Code, SyscallError
from rnixfs.skills.packages.script_guard import blocked_script
from tests.mountutil import needs_fuse, sh
from tests.pkg_registry import skill_md
from tests.pkgutil import Sandbox

SCRIPT = "#!/bin/sh\necho hello-from-script\n"


def local_skill(root, name):
    d = root / name
    (d / "scripts").mkdir(parents=True)
    (d / "SKILL.md").write_bytes(skill_md(name))
    (d / "scripts" / "run.sh").write_text(SCRIPT)
    os.chmod(d / "scripts" / "run.sh", 0o755)
    return d


def test_guard_words(tmp_path):
    sb = Sandbox(tmp_path)
    src = tmp_path / "src"
    assert sb.run("skill", "install", str(local_skill(src, "locked"))).returncode == 0
    assert sb.run("skill", "install", str(local_skill(src, "open")), "--allow-scripts").returncode == 0
    proj = sb.project
    locked = ".rnix/skills/locked/scripts/run.sh"
    for cmd in (f"./{locked}", f"bash {locked}", f"cd /tmp && sh {proj / locked}",
                "echo hi; python3 '.rnix/skills/locked/SKILL.md'", f"FOO=1 ./{locked} arg",
                f"env -i A=b {locked}", f"timeout 5 bash -x {locked}", f"if true; then ./{locked}; fi",
                f"source {locked}", f". {locked}", f"bash -c 'sh {locked}'", f"true && (./{locked})",
                f"echo $(./{locked})", f"ls | xargs ./{locked}", f"echo ok\n./{locked}",
                f"nohup python3 -u {locked} &"):
        assert blocked_script(cmd, proj) is not None, cmd
    for cmd in ("bash .rnix/skills/open/scripts/run.sh", "ls .rnix/skills", "echo 'unbalanced",
                "cat README", "bash src/locked/scripts/run.sh", f"cat {locked}",
                f"grep -n echo {locked}", f"cp {locked} /tmp/x", f"X={locked} true", f"wc -l < {locked}",
                "cat .rnix/skills/locked/SKILL.md"):
        assert blocked_script(cmd, proj) is None, cmd
    # through the shell device: PERMISSION, and nothing ran
    marker = tmp_path / "ran"

    async def go():
        return await shell.run(f"bash .rnix/skills/locked/scripts/run.sh > {marker}", cwd=proj, env=None,
                               timeout=10, output_limit=4096)
    with pytest.raises(SyscallError) as info:
        trio.run(go)
    assert info.value.code is Code.PERMISSION and "--allow-scripts" in str(info.value)
    assert not marker.exists()

    async def go_open():
        return await shell.run("bash .rnix/skills/open/scripts/run.sh", cwd=proj, env=None,
                               timeout=10, output_limit=4096)
    assert b"hello-from-script" in trio.run(go_open).output


@needs_fuse
@pytest.mark.mount
def test_agents_bash_and_dev_shell_refuse_locked_scripts(mnt, scripted_server, tmp_path):
    """User-scope skills, named by absolute path and through the mount itself."""
    sb = Sandbox(tmp_path / "sb")
    sb.env["RNIXFS_CONFIG_DIR"] = str(mnt.config_dir)
    src = tmp_path / "src"
    assert sb.run("skill", "install", str(local_skill(src, "locked")), "-g").returncode == 0
    assert sb.run("skill", "install", str(local_skill(src, "open")), "-g", "--allow-scripts").returncode == 0
    locked = mnt.config_dir / "skills" / "locked" / "scripts" / "run.sh"
    opened = mnt.config_dir / "skills" / "open" / "scripts" / "run.sh"
    mark = "SCRIPTS-MARK"

    def call(cmd, cid):
        return {"id": cid, "type": "function",
                "function": {"name": "Bash", "arguments": json.dumps({"command": cmd})}}
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call(f"bash {locked}", "a"),
        call(f"bash {opened}", "b"),
        call(f"bash {mnt.path}/skills/locked/scripts/run.sh", "c"),     # through the mount itself
        call(f"cat {locked}", "d")]})
    scripted_server.enqueue({"match": mark, "content": "done"})
    pid = mnt.spawn(mark)
    assert mnt.wait(pid, timeout=120).startswith("exited(0)")
    results = [json.loads(line)["content"] for line in open(mnt.p(f"proc/{pid}/context"))
               if '"role": "tool"' in line]
    assert "hello-from-script" not in results[0] and "--allow-scripts" in results[0], results[0]
    # allowed: never refused by the guard; it runs unless a command sandbox hides this
    # test's /tmp config dir (a real ~/.config is visible read-only there)
    assert "--allow-scripts" not in results[1], results[1]
    assert "hello-from-script" in results[1] or "No such file" in results[1], results[1]
    assert "hello-from-script" not in results[2] and "--allow-scripts" in results[2], results[2]
    assert "--allow-scripts" not in results[3], results[3]                 # reading is allowed
    assert "echo hello-from-script" in results[3] or "No such file" in results[3], results[3]
    assert "PERMISSION" in open(mnt.p(f"proc/{pid}/trace")).read()
    res = sh(f'exec 3<>"{mnt.path}/dev/shell"; echo "bash {locked}" >&3; cat <&3')
    assert "hello-from-script" not in res.stdout, (res.stdout, res.stderr)
    res = sh(f'exec 3<>"{mnt.path}/dev/shell"; echo "bash {opened}" >&3; cat <&3')
    assert "hello-from-script" in res.stdout or "No such file" in res.stdout, (res.stdout, res.stderr)
