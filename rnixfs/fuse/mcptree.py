"""dev/mcp as files: names and inodes only; the device decides the rest.

    dev/mcp/<server>/status               JSON snapshot
    dev/mcp/<server>/ctl                  write start | stop | restart
    dev/mcp/<server>/tools/<tool>/schema  description + input schema (JSON)
    dev/mcp/<server>/tools/<tool>/call    per open handle: write args, read result
    dev/mcp/<server>/resources/<name>     a resource (URI %-escaped to one name)
    dev/mcp/<server>/prompts/<name>       the prompt's arguments (and messages)
"""
from __future__ import annotations

import errno
import json
import stat

import pyfuse3

from ..devices.mcp.device import McpDevices, file_name, tool_for_file
from . import inodes
from .inodemap import InodeMap

MCP_BASE = 1 << 46
DIR = stat.S_IFDIR | 0o555
RO = stat.S_IFREG | 0o444
RW = stat.S_IFREG | 0o600
SERVER_ENTRIES = ("status", "ctl", "tools", "resources", "prompts")
LIST_TIMEOUT = 1.0  # tool lists change when a server restarts


def _json(obj) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, indent=2) + "\n").encode()


class McpTree:
    def __init__(self, devices: McpDevices, attr):
        self.devices = devices
        self._attr = attr
        self.inodes = InodeMap(MCP_BASE, {"": inodes.DEV_MCP})

    def owns(self, inode: int) -> bool:
        return inode in self.inodes

    def _parts(self, inode: int) -> list[str]:
        path = self.inodes.path(inode)
        return path.split("/") if path else []

    async def _names(self, parts: list[str]) -> list[str] | None:
        """The children of a directory, or None if ``parts`` is a file."""
        n = len(parts)
        if n == 0:
            return self.devices.names()
        server = self.devices.get(parts[0])
        if n == 1:
            return list(SERVER_ENTRIES)
        kind = parts[1]
        if kind in ("tools", "resources", "prompts") and n == 2:
            await server.start()
            if kind == "tools":
                return sorted(file_name(t) for t in server.tools)
            if kind == "resources":
                return sorted(file_name(r["uri"]) for r in server.resources)
            return sorted(file_name(p["name"]) for p in server.prompts)
        if kind == "tools" and n == 3:
            server.tool(tool_for_file(server, parts[2]))
            return ["schema", "call"]
        return None

    async def _mode(self, parts: list[str]) -> int:
        n = len(parts)
        if n <= 1:
            if n == 1:
                self.devices.get(parts[0])
            return DIR
        if parts[1] not in SERVER_ENTRIES:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if n == 2:
            return RW if parts[1] == "ctl" else RO if parts[1] == "status" else DIR
        parent = await self._names(parts[:-1])
        if parent is None or parts[-1] not in parent:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if parts[1] == "tools":
            if n == 3:
                return DIR
            return RW if parts[3] == "call" else RO
        return RO

    async def getattr(self, inode: int) -> pyfuse3.EntryAttributes:
        parts = self._parts(inode)
        mode = await self._mode(parts)
        live = parts[1:2] in (["status"], ["tools"], ["resources"], ["prompts"])
        return self._attr(inode, mode, timeout=0.0 if live else LIST_TIMEOUT)

    async def lookup(self, parent: int, name: bytes) -> pyfuse3.EntryAttributes:
        parts = self._parts(parent)
        text = name.decode("utf-8", "surrogateescape")
        if "/" in text or text in ("", ".", ".."):
            raise pyfuse3.FUSEError(errno.ENOENT)
        names = await self._names(parts)
        if names is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if text not in names:
            raise pyfuse3.FUSEError(errno.ENOENT)
        ino = self.inodes.ino("/".join([*parts, text]))
        attr = await self.getattr(ino)
        self.inodes.ref(ino)
        return attr

    async def is_dir(self, inode: int) -> bool:
        return stat.S_ISDIR(await self._mode(self._parts(inode)))

    async def readdir(self, inode: int, start_id: int, token) -> None:
        parts = self._parts(inode)
        names = await self._names(parts)
        if names is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        for i, name in enumerate(names[start_id:], start_id):
            ino = self.inodes.ino("/".join([*parts, name]))
            try:
                attr = await self.getattr(ino)
            except pyfuse3.FUSEError:
                continue
            if not pyfuse3.readdir_reply(token, name.encode("utf-8", "surrogateescape"), attr, i + 1):
                break
            self.inodes.ref(ino)  # readdirplus: the kernel now holds the entry

    def where(self, inode: int) -> list[str]:
        return self._parts(inode)

    async def snapshot(self, parts: list[str]) -> bytes:
        """The bytes of a read-only file."""
        server = self.devices.get(parts[0])
        if parts[1] == "status":
            return _json(server.status())
        await server.start()
        if parts[1] == "tools":
            return _json(server.tool(tool_for_file(server, parts[2])).schema())
        if parts[1] == "resources":
            for r in server.resources:
                if file_name(r["uri"]) == parts[2]:
                    return await server.read_resource(r["uri"])
        if parts[1] == "prompts":
            for p in server.prompts:
                if file_name(p["name"]) == parts[2]:
                    return _json(await server.prompt(p))
        raise pyfuse3.FUSEError(errno.ENOENT)

    def forget(self, inode: int, count: int) -> None:
        self.inodes.forget(inode, count)
