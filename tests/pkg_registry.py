"""A real HTTP skills registry on 127.0.0.1 for package tests.

Serves the Agent Skills Discovery index (RFC v0.2.0) at
``/.well-known/agent-skills/index.json``, each skill's files beside it,
package archives (.tar.gz / .zip) under ``/pkg/``, any blob under a chosen
path, and a GitHub-style ``/repos/{owner}/{repo}/tarball[/{ref}]`` endpoint
that redirects to ``/codeload/...`` like api.github.com does. Faults are
injected per path prefix: ``404``, ``500``, ``truncate`` (Content-Length
larger than the body), ``slow`` (sleeps before answering), ``loop``
(redirects to itself).
"""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def skill_digest(files: dict[str, bytes]) -> str:
    manifest = b"".join(p.encode() + b"\0" + hashlib.sha256(d).hexdigest().encode() + b"\n"
                        for p, d in sorted(files.items(), key=lambda kv: kv[0].encode()))
    return sha(manifest)


def skill_md(name: str, description: str = "", extra: str = "", declared: str | None = None) -> bytes:
    return (f"---\nname: {declared or name}\ndescription: {description or 'The ' + name + ' skill'}\n"
            f"{extra}---\n# {name}\nDo the {name} thing.\n").encode()


def make_tar_gz(files: dict[str, bytes], top: str = "", modes: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for path, data in files.items():
            info = tarfile.TarInfo((top + "/" if top else "") + path)
            info.size = len(data)
            info.mode = (modes or {}).get(path, 0o755 if path.startswith("scripts/") else 0o644)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_zip(files: dict[str, bytes], top: str = "") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr((top + "/" if top else "") + path, data)
    return buf.getvalue()


class Registry:
    def __init__(self):
        self.skills: dict[str, dict] = {}       # name -> entry (index JSON) + files
        self.blobs: dict[str, tuple[bytes, str]] = {}
        self.repos: dict[tuple[str, str, str], bytes] = {}
        self.faults: dict[str, str] = {}
        self.requests: list[tuple[str, dict]] = []
        self.index_override: dict | None = None
        self.well_known = "/.well-known/agent-skills"
        self.slow_seconds = 5.0
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # --- content ---------------------------------------------------------------------

    def add_skill(self, name: str, files: dict[str, bytes] | None = None, *, version: str = "",
                  package: str | None = "tar.gz", description: str = "", package_bytes: bytes | None = None,
                  package_digest: str | None = None, index_files: dict[str, bytes] | None = None,
                  top: str = "") -> dict:
        """Publish a skill. ``package_bytes`` replaces the real archive, ``package_digest``
        the archive digest, ``index_files`` the files the index's digests describe
        (all default to the honest values: tampering tests override one)."""
        files = files if files is not None else {"SKILL.md": skill_md(name, description)}
        described = index_files if index_files is not None else files
        entry = {"name": name, "description": description or f"The {name} skill",
                 "digest": skill_digest(described),
                 "files": [{"path": p, "digest": sha(d)} for p, d in described.items()]}
        if version:
            entry["version"] = version
        if package:
            data = package_bytes if package_bytes is not None else (
                make_tar_gz(files, top) if package == "tar.gz" else make_zip(files, top))
            path = f"/pkg/{name}.{package}"
            self.blobs[path] = (data, "application/octet-stream")
            entry["package"] = {"url": path, "digest": package_digest or sha(data)}
        with self.lock:
            self.skills[name] = {"entry": entry, "files": files}
        return entry

    def add_blob(self, path: str, data: bytes, ctype: str = "application/octet-stream") -> str:
        self.blobs[path] = (data, ctype)
        return self.url + path

    def add_repo(self, owner: str, repo: str, files: dict[str, bytes], ref: str = "main",
                 modes: dict[str, int] | None = None, raw: bytes | None = None) -> None:
        top = f"{owner}-{repo}-{hashlib.sha1(ref.encode()).hexdigest()[:7]}"
        self.repos[(owner, repo, ref)] = raw if raw is not None else make_tar_gz(files, top, modes)

    def index(self) -> dict:
        if self.index_override is not None:
            return self.index_override
        with self.lock:
            return {"version": "0.2.0", "skills": [s["entry"] for s in self.skills.values()]}

    # --- server ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "Registry":
        reg = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send(self, code: int, body: bytes = b"", ctype: str = "application/json",
                     headers: dict | None = None, length: int | None = None):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):
                path = self.path.split("?", 1)[0]
                reg.requests.append((path, dict(self.headers)))
                fault = next((f for p, f in reg.faults.items() if path.startswith(p)), None)
                if fault == "404":
                    return self.send(404, b"not found", "text/plain")
                if fault == "500":
                    return self.send(500, b"boom", "text/plain")
                if fault == "loop":
                    return self.send(302, b"", headers={"Location": path})
                if fault == "slow":
                    time.sleep(reg.slow_seconds)
                body, ctype = self.route(path)
                if body is None:
                    return self.send(404, b"not found", "text/plain")
                if isinstance(body, tuple):            # redirect
                    return self.send(302, b"", headers={"Location": body[1]})
                if fault == "truncate":
                    self.send(200, body[: len(body) // 2], ctype, length=len(body))
                    self.close_connection = True
                    return
                self.send(200, body, ctype)

            def route(self, path: str):
                wk = reg.well_known
                if path == wk + "/index.json":
                    return json.dumps(reg.index()).encode(), "application/json"
                if path.startswith(wk + "/"):
                    name, _, rel = path[len(wk) + 1:].partition("/")
                    s = reg.skills.get(name)
                    if s and rel in s["files"]:
                        return s["files"][rel], "application/octet-stream"
                if path in reg.blobs:
                    return reg.blobs[path]
                parts = path.strip("/").split("/")
                if len(parts) in (4, 5) and parts[0] == "repos" and parts[3] == "tarball":
                    ref = parts[4] if len(parts) == 5 else "main"
                    if (parts[1], parts[2], ref) in reg.repos:
                        return ("redirect", f"/codeload/{parts[1]}/{parts[2]}/{ref}"), ""
                    return None, ""
                if len(parts) == 4 and parts[0] == "codeload":
                    data = reg.repos.get((parts[1], parts[2], parts[3]))
                    if data is not None:
                        return data, "application/x-gzip"
                return None, ""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
