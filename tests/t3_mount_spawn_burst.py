"""Spawn bursts on one proc/new handle, and the kept spawn plans behind
them (docs/skills.md, "Caching"; docs/architecture.md, "The path of a
spawn"): every request spawns once, and a kept plan never outlives a
change to what it was made from."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.mountutil import needs_fuse, sh, wait_for

pytestmark = [needs_fuse, pytest.mark.mount]

BURST = r"""
import errno, json, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
failed = []
for i in range(int(sys.argv[2])):
    if i % 100 == 99:   # a request naming an agent that does not exist
        req = json.dumps({"intent": f"bad {i}", "agent": "no-such-agent"})
    else:
        req = f"burst {i}"
    try:
        os.write(fd, req.encode())   # one request per write(2)
    except OSError as exc:
        failed.append((i, exc.errno))
out = b""
while chunk := os.read(fd, 65536):
    out += chunk
os.close(fd)
print(json.dumps({"failed": failed, "out": out.decode()}))
"""


def test_a_burst_of_1000_writes_on_one_handle_spawns_each_request_once(mnt, scripted_server):
    res = subprocess.run([sys.executable, "-c", BURST, mnt.p("proc/new"), "1000"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["failed"] == [[i, 2] for i in range(99, 1000, 100)]  # ENOENT, each its own write
    lines = got["out"].splitlines()
    pids = [int(x) for x in lines if x.isdigit()]
    errors = [x for x in lines if not x.isdigit()]
    assert len(pids) == 990 and len(set(pids)) == 990 and pids == sorted(pids)
    assert errors == ['error: agent "no-such-agent" not found'] * 10
    intents = {}
    for pid in pids:
        with open(mnt.p(f"proc/{pid}/wait")) as f:  # blocks until that agent exits
            assert f.read().startswith("exited(0)")
        intents[pid] = mnt.status(pid)["intent"]
    assert sorted(intents.values()) == sorted(f"burst {i}" for i in range(1000) if i % 100 != 99)
    asked = [m["content"] for body in scripted_server.requests for m in body["messages"]
             if m["role"] == "user"]
    assert sorted(a for a in asked if a.startswith("burst ")) == sorted(intents.values())
    assert not [a for a in asked if a.startswith("bad ")]
    assert mnt.daemon_alive()


def resolver(m) -> dict:
    return json.loads(os.getxattr(m.p("skills"), "user.rnix.resolver"))


def run(m, script: str) -> subprocess.CompletedProcess:
    return sh(script, env={**os.environ, "M": str(m.path)})


def prompt(m, pid: int) -> str:
    """The system prompt the process was spawned with (first context line)."""
    return wait_for(lambda: open(m.p(f"proc/{pid}/context")).readline(), 30, what="the context")


def make_agent(m):
    skill = m.project / ".rnix" / "skills" / "kept"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: kept\ndescription: a skill\n---\nBODY-ONE\n")
    agent = m.project / ".rnix" / "agents" / "keeper"
    agent.mkdir(parents=True)
    (agent / "agent.yaml").write_text("name: keeper\nskills: [kept]\nplanning: false\n")
    (agent / "instructions.md").write_text("INSTRUCTIONS-ONE\n")
    (m.project / "AGENTS.md").write_text("DOC-ONE\n")
    wait_for(lambda: "keeper" in os.listdir(m.p("agents")) and "kept" in os.listdir(m.p("skills")), 10)
    return skill, agent


def spawn_keeper(m) -> int:
    return m.spawn(json.dumps({"intent": "x", "agent": "keeper"}))


def test_a_kept_plan_is_dropped_by_changes_through_the_mount(mnt):
    make_agent(mnt)
    first = prompt(mnt, spawn_keeper(mnt))
    assert "INSTRUCTIONS-ONE" in first and "BODY-ONE" in first and "DOC-ONE" in first
    reused = resolver(mnt)["plans_reused"]
    assert "INSTRUCTIONS-ONE" in prompt(mnt, spawn_keeper(mnt))
    assert resolver(mnt)["plans_reused"] > reused  # the second spawn used the kept plan

    assert run(mnt, 'printf "INSTRUCTIONS-TWO\\n" > "$M/agents/keeper/instructions.md"').returncode == 0
    assert "INSTRUCTIONS-TWO" in prompt(mnt, spawn_keeper(mnt))  # at once, no second of grace

    res = run(mnt, 'printf -- "---\\nname: kept\\ndescription: a skill\\n---\\nBODY-TWO\\n"'
                   ' > "$M/skills/kept/SKILL.md"')
    assert res.returncode == 0
    text = prompt(mnt, spawn_keeper(mnt))
    assert "BODY-TWO" in text and "BODY-ONE" not in text

    assert run(mnt, 'rm -r "$M/agents/keeper"').returncode == 0
    res = run(mnt, 'echo \'{"intent": "x", "agent": "keeper"}\' > "$M/proc/new"')
    assert res.returncode != 0 and "No such file" in res.stderr


@pytest.mark.parametrize("what", ["instructions", "agent.yaml", "AGENTS.md", "SKILL.md"])
def test_a_kept_plan_follows_edits_made_directly_on_disk(mnt, what):
    skill, agent = make_agent(mnt)
    prompt(mnt, spawn_keeper(mnt))
    reused = resolver(mnt)["plans_reused"]
    prompt(mnt, spawn_keeper(mnt))
    assert resolver(mnt)["plans_reused"] > reused
    if what == "instructions":
        (agent / "instructions.md").write_text("INSTRUCTIONS-TWO\n")
        mark = "INSTRUCTIONS-TWO"
    elif what == "agent.yaml":  # the agent no longer loads the skill
        (agent / "agent.yaml").write_text("name: keeper\nplanning: false\n")
        mark = None
    elif what == "AGENTS.md":
        (mnt.project / "AGENTS.md").write_text("DOC-TWO\n")
        mark = "DOC-TWO"
    else:
        (skill / "SKILL.md").write_text("---\nname: kept\ndescription: a skill\n---\nBODY-TWO\n")
        mark = "BODY-TWO"

    def changed():
        text = prompt(mnt, spawn_keeper(mnt))
        return "BODY-ONE" not in text if mark is None else mark in text

    wait_for(changed, 20, interval=0.2, what=f"a spawn to see the new {what}")
