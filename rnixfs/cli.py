"""The rnixfs command: mount, umount, status, ps, show."""
from __future__ import annotations

import errno
import json
import os
import select
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import click

from . import __version__
from .config import ConfigError, default_config_dir, default_state_dir
from .textsafe import Column, block, clean, table

XATTR_DAEMON = "user.rnixfs.daemon"
READY_TIMEOUT = 60.0


def fail(msg: str) -> None:
    raise click.ClickException(clean(msg))


def rnixfs_mounts() -> list[str]:
    """Mount points of type fuse.rnixfs, from /proc/mounts."""
    out = []
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == "fuse.rnixfs":
                out.append(parts[1].replace("\\040", " "))
    return out


def is_mounted(path: Path) -> bool:
    return str(path) in rnixfs_mounts()


def query_daemon(mountpoint: Path) -> dict:
    """Ask the daemon behind a mount about itself (an xattr on the root).

    Raises ClickException with a one-line reason for a stale or foreign mount.
    """
    try:
        return json.loads(os.getxattr(mountpoint, XATTR_DAEMON))
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            fail(f"{mountpoint}: the daemon is gone (stale mount); run: rnixfs umount {mountpoint}")
        fail(f"{mountpoint}: not an rnixfs mount ({exc.strerror})")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rnixfs")
def main() -> None:
    """rnixfs: an operating system for AI agents, in a FUSE mount."""


@main.command()
@click.argument("mountpoint", type=click.Path(file_okay=False, path_type=Path))
@click.option("--project", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=".", show_default=True, help="Project root (the agents' workspace).")
@click.option("--foreground", "-f", is_flag=True, help="Stay in the foreground, log to stderr.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="State directory (SQLite store, logs). Default: $XDG_STATE_HOME/rnixfs.")
@click.option("--config-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Config directory (providers.yaml). Default: $XDG_CONFIG_HOME/rnix.")
@click.option("--linger", type=click.FloatRange(0, 365 * 86400), default=600.0, show_default=True,
              help="Seconds a zombie stays in proc/ before it is reaped.")
@click.option("--allow-other", is_flag=True, help="Let other users see the mount.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              default="INFO")
@click.option("--ready-fd", type=int, hidden=True)
def mount(mountpoint, project, foreground, state_dir, config_dir, linger, allow_other, log_level, ready_fd):
    """Mount rnixfs at MOUNTPOINT; returns once the mount is ready."""
    from .daemon import DaemonConfig

    mountpoint = mountpoint.absolute()
    if not mountpoint.is_dir():
        fail(f"{mountpoint}: not a directory")
    if is_mounted(mountpoint):
        fail(f"{mountpoint}: already mounted (rnixfs umount {mountpoint} first)")
    real_mp, real_project = Path(os.path.realpath(mountpoint)), project.resolve()
    if real_mp == real_project or real_mp in real_project.parents:
        fail(f"{mountpoint}: the mount would hide the project {real_project}; mount elsewhere"
             " (a mount point inside the project is fine)")
    cfg = DaemonConfig(
        mountpoint=mountpoint,
        project=project.resolve(),
        state_dir=(state_dir or default_state_dir()).absolute(),
        config_dir=(config_dir or default_config_dir()).absolute(),
        linger=linger,
        allow_other=allow_other,
    )
    try:  # fail fast, before any fork, on a broken providers.yaml
        from .config import load_providers

        load_providers(cfg.config_dir)
        from .limits import load_limits

        load_limits(cfg.config_dir)
    except ConfigError as exc:
        fail(str(exc))
    if foreground or ready_fd is not None:
        _run_foreground(cfg, log_level, ready_fd)
        return
    _spawn_daemon(cfg, log_level)


def _run_foreground(cfg, log_level: str, ready_fd: int | None) -> None:
    import trio

    from .daemon import Daemon
    from .logsetup import setup_logging

    setup_logging(cfg.state_dir / "daemon.log" if ready_fd is not None else None, log_level)

    def on_ready() -> None:
        if ready_fd is not None:
            os.write(ready_fd, f"ready {os.getpid()}\n".encode())
            os.close(ready_fd)

    try:
        trio.run(Daemon(cfg).run, on_ready)
    except Exception as exc:
        from .statelock import StateDirBusy

        msg = (str(exc) if isinstance(exc, StateDirBusy) else f"{type(exc).__name__}: {exc}").splitlines()[0]
        if ready_fd is not None:
            try:
                os.write(ready_fd, f"error: {msg}\n".encode())
            except OSError:
                pass
        import logging

        if isinstance(exc, StateDirBusy):  # expected: a reason, not a traceback
            logging.getLogger("rnixfs").error("mount refused: %s", msg)
        else:
            logging.getLogger("rnixfs").exception("daemon failed")
        fail(msg)


def _spawn_daemon(cfg, log_level: str) -> None:
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    r, w = os.pipe()
    args = [sys.executable, "-m", "rnixfs.cli", "mount", str(cfg.mountpoint),
            "--project", str(cfg.project), "--state-dir", str(cfg.state_dir),
            "--config-dir", str(cfg.config_dir), "--linger", str(cfg.linger),
            "--log-level", log_level, "--ready-fd", str(w)]
    if cfg.allow_other:
        args.append("--allow-other")
    with open(cfg.state_dir / "daemon.log", "ab") as log:
        child = subprocess.Popen(args, pass_fds=(w,), start_new_session=True,
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/")
    os.close(w)
    answer = b""
    deadline = time.monotonic() + READY_TIMEOUT
    with os.fdopen(r, "rb", buffering=0) as pipe:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = pipe.read(4096)
            if not chunk:
                break
            answer += chunk
            if answer.endswith(b"\n"):
                break
    text = answer.decode(errors="replace").strip()
    if text.startswith("ready"):
        click.echo(f"rnixfs mounted at {cfg.mountpoint} (daemon pid {child.pid}, "
                   f"state {cfg.state_dir}, log {cfg.state_dir / 'daemon.log'})")
        return
    if child.poll() is None:
        child.terminate()
    reason = text.removeprefix("error: ") or f"the daemon did not become ready in {READY_TIMEOUT:.0f}s"
    fail(f"mount failed: {reason} (see {cfg.state_dir / 'daemon.log'})")


def _fusermount(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("fusermount3") or shutil.which("fusermount")
    if exe is None:
        fail("fusermount3 not found (apt-get install fuse3)")
    return subprocess.run([exe, *args], capture_output=True, text=True)


@main.command()
@click.argument("mountpoint", type=click.Path(path_type=Path))
@click.option("--lazy", "-z", is_flag=True, help="Detach now even if the mount is busy.")
@click.option("--timeout", type=float, default=30.0, show_default=True,
              help="Seconds to wait for the daemon to exit.")
def umount(mountpoint, lazy, timeout):
    """Unmount MOUNTPOINT (also clears a stale mount whose daemon died)."""
    mountpoint = mountpoint.absolute()
    if not is_mounted(mountpoint):
        fail(f"{mountpoint}: not an rnixfs mount")
    pid = None
    try:
        pid = json.loads(os.getxattr(mountpoint, XATTR_DAEMON))["pid"]
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:
            fail(f"{mountpoint}: {exc.strerror}")
    res = _fusermount("-u", *(["-z"] if lazy else []), str(mountpoint))
    if res.returncode != 0 and pid is None:
        res = _fusermount("-u", "-z", str(mountpoint))
    if res.returncode != 0:
        fail(f"{mountpoint}: {res.stderr.strip() or 'unmount failed'} (busy? try --lazy)")
    if pid is not None and lazy:
        click.echo(f"detached {mountpoint}; daemon {pid} exits when its last user lets go")
        return
    if pid is not None:
        import psutil

        try:
            psutil.Process(pid).wait(timeout)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            fail(f"unmounted, but daemon {pid} did not exit within {timeout:.0f}s")
    click.echo(f"unmounted {mountpoint}")


def _format_status(info: dict) -> str:
    procs = info.get("processes", {})
    counts = " ".join(f"{k}={procs.get(k, 0)}" for k in ("created", "running", "zombie", "paused"))
    lines = [
        f"mount:     {info['mountpoint']}",
        f"daemon:    pid {info['pid']}, up {_duration(info['uptime'])}, rnixfs {info['version']}",
        f"project:   {info['project']}",
        f"state:     {info['state_dir']}",
        f"processes: {counts}",
        *([f"store:     DEGRADED, read-only (spawns refused; remount to retry): {info['store_degraded']}"]
          if info.get("store_degraded") else
          [f"store:     FAILING, retrying: {info['store_error']}"] if info.get("store_error") else []),
        *([_sandbox_line(info["sandbox"])] if info.get("sandbox") else []),
        *([_workers_line(info["workers"])] if info.get("workers") else []),
        "providers:",
    ]
    providers = info.get("providers", {})
    for name, desc in sorted(providers.get("providers", {}).items()):
        facts = ", ".join(f"{k}={v}" for k, v in desc.items() if v not in (None, ""))
        mark = " (default)" if name == providers.get("default") else ""
        lines.append(f"  {name}{mark}: {facts}")
    # Paths, provider facts and store errors are not ours: each line is escaped.
    return "\n".join(clean(line) for line in lines)


def _workers_line(w: dict) -> str:
    """Where agent loops run (docs/architecture.md, "Workers and the kernel protocol")."""
    if not w.get("workers"):
        return "workers:   none, agent loops run in the daemon (workers: 0)"
    pids = " ".join(str(p) for p in w.get("pids", []))
    lost = f", {w['lost']} lost" if w.get("lost") else ""
    return f"workers:   {w.get('ready', 0)} of {w['workers']} ready (pids {pids}){lost}"


def _sandbox_line(box: dict) -> str:
    """Which command sandbox is in force (docs/devices.md, "The command sandbox")."""
    if box.get("mode") == "bwrap":
        return f"sandbox:   bwrap ({box.get('reason', '')})"
    return f"sandbox:   NONE, commands run unsandboxed: {box.get('reason', '')} (policy {box.get('policy')})"


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@main.command()
@click.argument("mountpoint", required=False, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(mountpoint, as_json):
    """Daemon pid, uptime, processes by state and providers of a mount (or all)."""
    if mountpoint:
        info = query_daemon(mountpoint.absolute())
        click.echo(json.dumps(info, indent=2) if as_json else _format_status(info))
        return
    points = [Path(p) for p in rnixfs_mounts()]
    if not points:
        fail("no rnixfs mounts")
    infos, problems = [], []
    for point in points:  # one dead daemon must not hide the healthy mounts
        try:
            infos.append(query_daemon(point))
        except click.ClickException as exc:
            problems.append(exc.message)
    if as_json:
        click.echo(json.dumps(infos, indent=2))
    elif infos:
        click.echo("\n\n".join(_format_status(i) for i in infos))
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        sys.exit(1)


def _reader(state_dir: Path | None):
    from .store import StoreReader

    path = (state_dir or default_state_dir()) / "rnixfs.db"
    if not path.exists():
        fail(f"no state store at {path}")
    try:
        return StoreReader(path)
    except sqlite3.Error as exc:
        fail(f"state store {path}: {exc}")


STATE_DIR_OPTION = click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
                                help="State directory (default: $XDG_STATE_HOME/rnixfs).")


# Intents come from whoever spawned (an agent, via Spawn): cells are escaped
# and cut (rnixfs.textsafe), so one intent can neither move the cursor nor
# shift the columns.
PS_COLUMNS = (Column("PID"), Column("PPID"), Column("STATE", 0, 16), Column("EXIT"), Column("STEPS"),
              Column("TOKENS"), Column("AGENT", 0, 32), Column("INTENT", 0, 60, fold=True))


@main.command()
@click.option("--all", "-a", "show_all", is_flag=True, help="Include dead (reaped) processes.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@STATE_DIR_OPTION
def ps(show_all, as_json, state_dir):
    """List processes from the state store (live ones; --all for history)."""
    reader = _reader(state_dir)
    try:
        rows = reader.processes(include_dead=show_all)
    except sqlite3.Error as exc:
        fail(f"state store {reader.path}: {exc}")
    finally:
        reader.close()
    for problem in reader.skipped:
        click.echo(f"warning: {problem}", err=True)
    if as_json:
        for r in rows:
            click.echo(json.dumps(r))
        return
    cells = [
        (r["pid"], r["ppid"], r["state"] + ("+P" if r.get("paused") else ""),
         "" if r["exit_code"] is None else r["exit_code"], r["steps"],
         r["tokens"]["in"] + r["tokens"]["out"], r["agent"], r["intent"])
        for r in rows
    ]
    for line in table(PS_COLUMNS, cells, sep="  "):
        click.echo(line)


@main.command()
@click.argument("pid", type=click.IntRange(min=1))
@click.option("--trace/--no-trace", default=True, help="Include the trace.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (status, result, events).")
@STATE_DIR_OPTION
def show(pid, trace, as_json, state_dir):
    """Show a process from the store, live or dead: status, result, trace."""
    reader = _reader(state_dir)
    try:
        rec = reader.process(pid)
        if rec is None:
            fail(f"no process {pid} in the store")
        lines = reader.trace(pid) if trace else []
        events = reader.event_dicts(pid) if as_json else []
    except ValueError as exc:
        fail(str(exc))
    except sqlite3.Error as exc:
        fail(f"state store {reader.path}: {exc}")
    finally:
        reader.close()
    for problem in reader.skipped:
        click.echo(f"warning: {problem}", err=True)
    if as_json:
        rec["events"] = events
        click.echo(json.dumps(rec, indent=2))
        return
    result = rec.pop("result")
    click.echo(json.dumps(rec, indent=2))   # ensure_ascii: control characters come out escaped
    click.echo("--- result")
    click.echo(block(result) if result is not None else "(none)")
    if trace:
        click.echo("--- trace")
        click.echo(block("".join(lines)), nl=False)


from .cli_skills import skill, agent  # noqa: E402
main.add_command(skill); main.add_command(agent)  # noqa: E702
from .cli_packages import register as _register_packages  # noqa: E402
_register_packages(main)

if __name__ == "__main__":
    main()
