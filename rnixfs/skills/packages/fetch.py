"""HTTP downloads for packages: capped, timed out, optionally with a progress bar.

Plain ``http://`` is refused except on loopback (tests, local mirrors): an
index fetched in the clear could be swapped along with its digests. Request
headers (tokens for private sources) are sent, never logged, never put in an
error message, never stored.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from .package_errors import NetworkError, NotFound, UsageError

log = logging.getLogger(__name__)

MAX_DOWNLOAD_BYTES = 64 << 20
MAX_INDEX_BYTES = 8 << 20
MAX_REDIRECTS = 10


def _timeout() -> float:
    try:
        return float(os.environ.get("RNIXFS_HTTP_TIMEOUT", "30"))
    except ValueError:
        return 30.0


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname and is_loopback(parts.hostname):
        return
    if parts.scheme == "http":
        raise UsageError(f"{url}: plain http is refused (use https)")
    raise UsageError(f"{url}: not an https URL")


@dataclass
class Fetcher:
    """One HTTP client for a whole command; ``progress`` draws a bar on a TTY."""

    headers: dict[str, str] = field(default_factory=dict)
    progress: bool = False
    _client: httpx.Client | None = None

    def client(self) -> httpx.Client:
        if self._client is None:
            t = _timeout()
            self._client = httpx.Client(follow_redirects=True, max_redirects=MAX_REDIRECTS,
                                        timeout=httpx.Timeout(t, connect=min(t, 10.0)),
                                        headers={"User-Agent": "rnixfs-skill-packages"})
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _stream(self, url: str, sink, cap: int, what: str) -> int:
        check_url(url)
        try:
            with self.client().stream("GET", url, headers=self.headers) as r:
                if r.status_code == 404 or r.status_code == 410:
                    raise NotFound(f"{url}: {what} not found (HTTP {r.status_code}); check the name or URL")
                if r.status_code in (401, 403):
                    raise NetworkError(f"{url}: access denied (HTTP {r.status_code}); "
                                       "pass credentials with --header \"Authorization: ...\"")
                if r.status_code >= 400:
                    raise NetworkError(f"{url}: server answered HTTP {r.status_code}; try again later")
                total = int(r.headers.get("content-length") or 0) or None
                if total and total > cap:
                    raise NetworkError(f"{url}: {what} is {total} bytes, over the {cap}-byte cap")
                bar = self._bar(total, url)
                n = 0
                try:
                    for chunk in r.iter_bytes():
                        n += len(chunk)
                        if n > cap:
                            raise NetworkError(f"{url}: {what} is over the {cap}-byte cap")
                        sink(chunk)
                        if bar is not None:
                            bar.update(len(chunk))
                finally:
                    if bar is not None:
                        bar.close()
                if str(r.url) != url:
                    check_url(str(r.url))
                return n
        except httpx.TooManyRedirects:
            raise NetworkError(f"{url}: too many redirects (a redirect loop?)") from None
        except httpx.TimeoutException:
            raise NetworkError(f"{url}: timed out; the server is slow or unreachable, try again") from None
        except httpx.RemoteProtocolError as exc:
            raise NetworkError(f"{url}: the download was cut short ({exc}); try again") from None
        except httpx.HTTPError as exc:
            raise NetworkError(f"{url}: {type(exc).__name__}: {exc}") from None

    def _bar(self, total, url):
        if not self.progress:
            return None
        from tqdm import tqdm
        return tqdm(total=total, unit="B", unit_scale=True, desc=os.path.basename(urlsplit(url).path)[:30] or "download",
                    file=sys.stderr, leave=False)

    def download(self, url: str, dest: Path, *, what: str = "archive", cap: int = MAX_DOWNLOAD_BYTES) -> Path:
        with open(dest, "wb") as f:
            self._stream(url, f.write, cap, what)
        return dest

    def get_bytes(self, url: str, *, what: str = "file", cap: int = MAX_DOWNLOAD_BYTES) -> bytes:
        buf = bytearray()
        self._stream(url, buf.extend, cap, what)
        return bytes(buf)

    def get_json(self, url: str, *, what: str = "index"):
        data = self.get_bytes(url, what=what, cap=MAX_INDEX_BYTES)
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise NetworkError(f"{url}: {what} is not valid JSON ({exc})") from None
