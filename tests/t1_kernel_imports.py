"""The kernel depends on typed ports, never on what implements them
(docs/architecture.md, "Layers"): no module under rnixfs/kernel imports the
devices, the agent catalog, pyfuse3 or httpx."""
from __future__ import annotations

import ast
from pathlib import Path

import rnixfs.kernel

FORBIDDEN = ("rnixfs.devices", "rnixfs.agents", "rnixfs.fuse", "pyfuse3", "httpx")


def _imports(path: Path) -> list[str]:
    """Absolute names of every module ``path`` imports (relative ones resolved)."""
    package = "rnixfs.kernel"
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


def _bad(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_no_kernel_module_imports_devices_agents_fuse_or_httpx():
    root = Path(rnixfs.kernel.__file__).parent
    files = sorted(root.glob("*.py"))
    assert len(files) > 5
    bad = {f.name: [n for n in _imports(f) if _bad(n)] for f in files}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_walker_sees_relative_and_absolute_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from ..devices.llm import base\nimport httpx\nfrom . import loop\n")
    found = _imports(probe)
    assert "rnixfs.devices.llm" in found and "httpx" in found and "rnixfs.kernel.loop" in found
    assert _bad("rnixfs.devices.llm") and _bad("httpx") and not _bad("rnixfs.kernel.loop")
