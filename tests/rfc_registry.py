"""A second, independent skills registry written from the Agent Skills
Discovery RFC v0.2.0 text alone, plus a GitHub API double shaped like the
real one.

It exists to check that rnixfs interoperates with any publisher that follows
the RFC, not just with the fixture it was developed against
(tests/pkg_registry.py). So it does what a plain publisher would do:

- ``GET``/``HEAD /.well-known/agent-skills/index.json`` as
  ``application/json`` with ``version: "0.2.0"``; every skill's files under
  ``/.well-known/agent-skills/{name}/{path}`` (``text/markdown`` for
  SKILL.md); ``404`` for anything else;
- packages as absolute URLs ``/.well-known/agent-skills/{name}.tar.gz`` or
  ``.zip`` whose archive root *is* the skill directory, built the way people
  build them: ``tar -czf - -C dir .`` (members ``./SKILL.md``, directory
  entries) and a zip with directory entries;
- ``GET /repos/{owner}/{repo}/tarball[/{ref}]`` answers ``302`` to
  ``/codeload/{owner}/{repo}/legacy.tar.gz/{ref}``, which serves
  ``git archive`` output of a real git repository with the single top
  directory ``{owner}-{repo}-{sha7}/`` and git's pax global header.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tempfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

PREFIX = "/.well-known/agent-skills/"


def file_digest(data: bytes) -> str:
    """RFC: ``sha256:{SHA-256(raw_bytes)}``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def rfc_skill_digest(files: dict[str, bytes]) -> str:
    """RFC "Skill-Level Digest": sort by path (byte order), ``{path}\\0{hex}\\n``, SHA-256."""
    lines = []
    for path in sorted(files, key=lambda p: p.encode("ascii")):
        lines.append(path.encode("ascii") + b"\x00" + hashlib.sha256(files[path]).hexdigest().encode() + b"\n")
    return "sha256:" + hashlib.sha256(b"".join(lines)).hexdigest()


def _write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        if rel.startswith("scripts/"):
            p.chmod(0o755)


def tar_gz_of(files: dict[str, bytes]) -> bytes:
    """``tar -czf - -C <skill dir> .`` with the system tar."""
    with tempfile.TemporaryDirectory() as d:
        _write_tree(Path(d), files)
        return subprocess.run(["tar", "-czf", "-", "-C", d, "."], check=True, capture_output=True).stdout


def zip_of(files: dict[str, bytes], members: dict[str, bytes] | None = None) -> bytes:
    """A zip with directory entries, like ``zip -r``; ``members`` adds raw names."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        dirs = sorted({"/".join(p.split("/")[:i]) + "/" for p in files for i in range(1, p.count("/") + 1)})
        for d in dirs:
            zf.writestr(d, b"")
        for path, data in files.items():
            zf.writestr(path, data)
        for name, data in (members or {}).items():
            zf.writestr(name, data)
    return buf.getvalue()


class RfcRegistry:
    def __init__(self):
        self.entries: dict[str, dict] = {}        # name -> index entry
        self.blobs: dict[str, tuple[bytes, str]] = {}   # path -> (body, content type)
        self.repos: dict[tuple[str, str], dict[str, bytes]] = {}   # (owner, repo) -> {ref: tarball}
        self.default_ref: dict[tuple[str, str], str] = {}
        self.requests: list[str] = []
        self.raw_index: dict | None = None        # served as-is instead of the built index
        self.index_path = PREFIX + "index.json"
        self.redirects: dict[str, str] = {}       # path -> Location (301), checked first
        self._tmp = tempfile.TemporaryDirectory()

    # --- publishing ---------------------------------------------------------------
    def publish(self, name: str, files: dict[str, bytes], *, description: str = "", package: str | None = None,
                version: str | None = None, archive: bytes | None = None, digests: dict | None = None,
                skill_digest: str | None = None, package_digest: str | None = None) -> dict:
        """Serve a skill; ``package`` is ``"tar.gz"``/``"zip"``. The keyword
        overrides publish wrong values (a tampered or desynchronized index)."""
        for rel in list(self.blobs):
            if rel.startswith(PREFIX + name + "/"):
                del self.blobs[rel]
        for rel, data in files.items():
            ctype = "text/markdown" if rel.endswith(".md") else "application/octet-stream"
            self.blobs[PREFIX + name + "/" + rel] = (data, ctype)
        entry = {"name": name, "description": description or f"The {name} skill.",
                 "digest": skill_digest or rfc_skill_digest(files),
                 "files": [{"path": p, "digest": (digests or {}).get(p) or file_digest(files[p])}
                           for p in sorted(files, key=lambda p: (p != "SKILL.md", p))]}
        if version is not None:
            entry["version"] = version
        if package is not None:
            body = archive if archive is not None else (tar_gz_of(files) if package == "tar.gz" else zip_of(files))
            path = f"{PREFIX}{name}.{package}"
            self.blobs[path] = (body, "application/gzip" if package == "tar.gz" else "application/zip")
            entry["package"] = {"url": self.url + path, "digest": package_digest or file_digest(body)}
        self.entries[name] = entry
        return entry

    def serve_blob(self, path: str, body: bytes, ctype: str = "application/octet-stream") -> str:
        self.blobs[path] = (body, ctype)
        return self.url + path

    def github_repo(self, owner: str, repo: str, files: dict[str, bytes], *, tag: str | None = None,
                    branch: str = "main") -> str:
        """A real git repository; its tarball is ``git archive`` of the commit. Returns the sha."""
        d = Path(self._tmp.name) / f"{owner}-{repo}"
        if not d.exists():
            d.mkdir()
            subprocess.run(["git", "init", "-q", "-b", branch, str(d)], check=True)
        for p in d.iterdir():
            if p.name != ".git":
                subprocess.run(["rm", "-rf", str(p)], check=True)
        _write_tree(d, files)
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t"}
        subprocess.run(["git", "-C", str(d), "add", "-A"], check=True, env=env)
        subprocess.run(["git", "-C", str(d), "commit", "-q", "-m", "c", "--allow-empty"], check=True, env=env)
        sha = subprocess.run(["git", "-C", str(d), "rev-parse", "HEAD"], check=True, capture_output=True,
                             text=True).stdout.strip()
        body = subprocess.run(["git", "-C", str(d), "archive", "--format=tar.gz",
                               f"--prefix={owner}-{repo}-{sha[:7]}/", "HEAD"],
                              check=True, capture_output=True).stdout
        refs = self.repos.setdefault((owner, repo), {})
        refs[branch] = refs[sha] = body
        if tag:
            refs[tag] = body
        self.default_ref[(owner, repo)] = branch
        return sha

    # --- serving ------------------------------------------------------------------
    def start(self) -> "RfcRegistry":
        reg = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body: bytes = b"", ctype: str = "text/plain", extra=None):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "max-age=60")
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                path = unquote(urlsplit(self.path).path)
                reg.requests.append(path)
                if path in reg.redirects:
                    return self._send(301, b"", "text/html", {"Location": reg.redirects[path]})
                if path == reg.index_path:
                    index = reg.raw_index or {"version": "0.2.0", "skills": list(reg.entries.values())}
                    body = json.dumps(index).encode()
                    return self._send(200, body, "application/json")
                if path in reg.blobs:
                    body, ctype = reg.blobs[path]
                    return self._send(200, body, ctype)
                parts = path.strip("/").split("/")
                if len(parts) in (4, 5) and parts[0] == "repos" and parts[3] == "tarball":
                    owner, repo = parts[1], parts[2]
                    refs = reg.repos.get((owner, repo))
                    ref = parts[4] if len(parts) == 5 else reg.default_ref.get((owner, repo), "")
                    if refs is None or ref not in refs:
                        return self._send(404, b'{"message":"Not Found"}', "application/json")
                    loc = f"{reg.url}/codeload/{owner}/{repo}/legacy.tar.gz/{ref}"
                    return self._send(302, b"", "text/html", {"Location": loc})
                if len(parts) == 5 and parts[0] == "codeload" and parts[3] == "legacy.tar.gz":
                    body = reg.repos.get((parts[1], parts[2]), {}).get(parts[4])
                    if body is not None:
                        return self._send(200, body, "application/x-gzip",
                                          {"Content-Disposition": f"attachment; filename={parts[1]}-{parts[2]}.tar.gz"})
                return self._send(404, b"Not Found")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._tmp.cleanup()
