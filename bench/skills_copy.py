"""`cp -r` of a 30-file skill into $M/skills/, with 1 and with 400 skills
installed, side by side (docs/skills.md, "Caching"):

    python bench/skills_copy.py [--skills 400] [--files 30] [--rounds 3]

Each round mounts rnixfs on a fresh temporary tree holding N installed
skills (user scope), copies a 30-file skill (SKILL.md, references/,
scripts/, two relative symlinks) with `cp -r`, and reads the resolver's
counters (`user.rnix.resolver` on skills/). Prints one line per size with
the median time and how many SKILL.md parses the copy caused.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.mountutil import cleanup, do_mount  # noqa: E402

SKILL = "---\nname: {name}\ndescription: skill {name} for the bench\nmetadata:\n  version: '1'\n---\n# {name}\n\nBody.\n"


def install(root: Path, n: int) -> None:
    for i in range(n):
        d = root / f"installed-{i:04d}"
        (d / "references").mkdir(parents=True)
        (d / "SKILL.md").write_text(SKILL.format(name=d.name))
        (d / "references" / "notes.md").write_text("notes\n" * 20)


def source_skill(base: Path, files: int) -> Path:
    src = base / "copied"
    (src / "references").mkdir(parents=True)
    (src / "scripts").mkdir()
    (src / "SKILL.md").write_text(SKILL.format(name="copied"))
    made = 1
    while made < files - 2:
        sub = "references" if made % 2 else "scripts"
        (src / sub / f"file-{made:03d}.md").write_text(f"content {made}\n" * 50)
        made += 1
    os.symlink("references/file-001.md", src / "main.md")
    os.symlink("references", src / "refs")
    return src


def counters(m) -> dict:
    try:
        return json.loads(os.getxattr(m.p("skills"), "user.rnix.resolver"))
    except OSError:  # a daemon without the counters (an older build)
        return {"parses": 0, "updates": 0, "sweeps": 0}


def one_round(n: int, files: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory(prefix="rnix-bench-skills-") as tmp:
        tmp = Path(tmp)
        install(tmp / "config" / "skills", n)
        src = source_skill(tmp / "src", files)
        m = do_mount(tmp, None)
        try:
            names = os.listdir(m.p("skills"))      # the first resolution, not timed
            assert len(names) >= n
            before = counters(m)
            t0 = time.perf_counter()
            subprocess.run(["cp", "-r", str(src), m.p("skills/")], check=True)
            elapsed = time.perf_counter() - t0
            after = counters(m)
            assert (m.project / ".rnix/skills/copied/SKILL.md").is_file()
            return elapsed, {k: after[k] - before[k] for k in after}
        finally:
            cleanup(m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skills", type=int, default=400)
    ap.add_argument("--files", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results = {1: [], args.skills: []}
    for _ in range(args.rounds):
        for n in results:                      # interleaved: load hits both sides
            results[n].append(one_round(n, args.files))
    print(f"cp -r of a {args.files}-file skill into $M/skills/ (median of {args.rounds} rounds)")
    for n, rows in results.items():
        t = statistics.median(r[0] for r in rows)
        c = rows[-1][1]
        print(f"  {n:5d} skills installed: {t:7.3f} s   (during the copy: {c['parses']} SKILL.md "
              f"parses, {c['updates']} one-skill updates, {c['sweeps']} full sweeps)")


if __name__ == "__main__":
    main()
