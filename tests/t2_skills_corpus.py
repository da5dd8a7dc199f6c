"""rnixfs's strict validation vs the reference validator `skills-ref validate`.

Every case under tests/corpus/skills/ is a directory holding one skill
directory; CASES.yaml gives the expected verdicts. Where the two validators
disagree the case must say why (``differs``) and docs/skills.md must list it.
The reference verdict comes from the real `skills-ref validate` command
(PyPI skills-ref==0.1.1, a test dependency) run as a subprocess.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from rnixfs.skills import resolve_skills, validate_strict

CORPUS = Path(__file__).parent / "corpus" / "skills"
CASES = yaml.safe_load((CORPUS / "CASES.yaml").read_text(encoding="utf-8"))
DOCS = (Path(__file__).parent.parent / "docs" / "skills.md").read_text(encoding="utf-8")

skills_ref = pytest.importorskip("skills_ref", reason="skills-ref (test extra) is not installed")


def case_dir(cid: str) -> Path:
    return CORPUS / cid / CASES[cid]["dir"]


def ref_validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skills_ref.cli", "validate", str(path)],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def ref_verdicts() -> dict[str, str]:
    with ThreadPoolExecutor(8) as pool:
        results = dict(zip(CASES, pool.map(lambda c: ref_validate(case_dir(c)), CASES)))
    return {c: "valid" if r.returncode == 0 else "invalid" for c, r in results.items()}


def test_corpus_is_complete():
    on_disk = {p.name for p in CORPUS.iterdir() if p.is_dir()}
    assert on_disk == set(CASES), "every corpus directory needs a CASES.yaml entry and back"
    for cid in CASES:
        assert case_dir(cid).is_dir(), cid
    assert len(CASES) >= 60
    assert sum(1 for c in CASES.values() if c["rnixfs"] == "valid") >= 20
    assert sum(1 for c in CASES if c.startswith("realworld-")) >= 8


def test_skills_ref_cli_is_the_reference():
    ok = ref_validate(case_dir("minimal"))
    assert ok.returncode == 0 and "Valid skill" in ok.stdout
    bad = ref_validate(case_dir("missing-name"))
    assert bad.returncode == 1 and "Missing required field in frontmatter: name" in bad.stderr


@pytest.mark.parametrize("cid", list(CASES))
def test_rnixfs_verdict(cid):
    errors = validate_strict(case_dir(cid))
    assert ("invalid" if errors else "valid") == CASES[cid]["rnixfs"], errors


@pytest.mark.parametrize("cid", list(CASES))
def test_skills_ref_verdict(cid, ref_verdicts):
    assert ref_verdicts[cid] == CASES[cid]["skills_ref"]


@pytest.mark.parametrize("cid", list(CASES))
def test_agreement_or_documented_difference(cid, ref_verdicts):
    mine = "invalid" if validate_strict(case_dir(cid)) else "valid"
    differs = CASES[cid].get("differs")
    if mine == ref_verdicts[cid]:
        assert not differs, f"{cid}: verdicts agree, drop 'differs'"
    else:
        assert differs, f"{cid}: rnixfs says {mine}, skills-ref says {ref_verdicts[cid]}: undocumented"
        assert f"`{cid}`" in DOCS, f"{cid}: list the difference in docs/skills.md"


def test_cli_validate_agrees_on_every_case(tmp_path):
    """`rnixfs skill validate` exits like `skills-ref validate` except documented cases."""
    def run(cid):
        return subprocess.run([sys.executable, "-m", "rnixfs.cli", "skill", "validate", str(case_dir(cid))],
                              capture_output=True, text=True, timeout=60)
    with ThreadPoolExecutor(8) as pool:
        results = dict(zip(CASES, pool.map(run, CASES)))
    for cid, res in results.items():
        want = CASES[cid]["rnixfs"]
        assert res.returncode == (0 if want == "valid" else 1), (cid, res.stderr)
        if want == "invalid":
            assert res.stderr.startswith("Validation failed for "), cid
            assert "Traceback" not in res.stderr


@pytest.mark.parametrize("cid", list(CASES))
def test_lenient_tier_in_resolution(cid, tmp_path):
    """Placed in a skill root, each case loads, warns-and-loads, or is skipped."""
    src = case_dir(cid)
    root = tmp_path / "cfg" / "skills"
    root.mkdir(parents=True)
    shutil.copytree(src, root / src.name, symlinks=True)
    res = resolve_skills(None, tmp_path / "cfg", home=tmp_path / "home")
    s = res.winners[src.name]
    tier = "skip" if not s.valid else ("warn" if s.lenient else "load")
    assert tier == CASES[cid]["lenient"], s.error
    diag = res.diagnostics
    if tier == "skip":
        assert [e.path for e in diag.skipped] == [str(root / src.name)]
        assert s not in res.skills.values()
    elif tier == "warn":
        assert diag.lenient and not diag.skipped and res.skills[s.ref_name] is s
    else:
        assert not diag.lenient and not diag.skipped and res.skills[s.ref_name] is s
