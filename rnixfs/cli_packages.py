"""`rnixfs skill install|update|search|remove|check`, `rnixfs trust` and
`rnixfs agent create|skill`: skill packages from the shell (docs/packages.md).

``--json`` prints one line ``{"ok": true, "data": {...}}`` or
``{"ok": false, "error": {"code", "message", "exit_code"}}``. Exit codes:
0 ok, 1 other error, 2 usage, 3 not found, 4 verification failed, 5 network
error, 6 already installed, 7 unsafe archive, 8 confirmation required.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from .agents import AgentError
from .cli_skills import PREFIX, APREFIX, _config, _project, agent, skill
from .config import default_state_dir
from .skills import SkillError, find_project, resolve_skills
from .skills.packages.package_errors import PackageError
from .skills.packages.fetch import Fetcher
from .skills.packages.install import Packages, target_scope
from .skills.packages.registries import load_registries, parse_header
from .skills.packages.sources import Context
from .skills.resolve import dumps

GITHUB_API_DEFAULT = "https://api.github.com"


def _terminate_cleanly() -> None:
    """SIGTERM/SIGHUP unwind like Ctrl-C, so work directories are removed and
    an interrupted install or update leaves the previous state as it was."""
    import signal

    def stop(signum, frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


HINTS = {
    "VERIFICATION_FAILED": "nothing was installed; the package does not match what its publisher "
                           "signed off - report it to them rather than retrying",
    "UNSAFE_ARCHIVE": "nothing was installed; the archive is unsafe - report it to its publisher",
    "NETWORK_ERROR": "nothing was installed; check the URL and your connection, then retry",
}


def _die(exc: Exception, as_json: bool, data: dict | None = None) -> None:
    code = getattr(exc, "code", "ERROR")
    exit_code = getattr(exc, "exit_code", 1)
    hint = HINTS.get(code)
    if hint and "nothing was installed" not in str(exc):
        exc = type(exc)(f"{exc} ({hint})")
    if as_json:
        out = {"ok": False, "error": {"code": code, "message": str(exc), "exit_code": exit_code}}
        if data:
            out["data"] = data          # what was done before the error (several REFs)
        click.echo(dumps(out))
    else:
        click.echo(f"{PREFIX} error: {exc}", err=True)
    sys.exit(exit_code)


def _opts(f):
    f = click.option("--config-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="Config directory (default: $XDG_CONFIG_HOME/rnix).")(f)
    f = click.option("--project", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="Project directory (default: the nearest one holding .rnix/).")(f)
    f = click.option("--json", "as_json", is_flag=True, help="One line of JSON (see docs/packages.md).")(f)
    return f


def _net(f):
    f = click.option("--registry", "registry", metavar="URL", default=None,
                     help="Registry origin (default: $RNIXFS_REGISTRY, then registries.yaml 'default').")(f)
    f = click.option("--header", "headers", metavar="'K: V'", multiple=True,
                     help="HTTP header for private sources (never logged or stored).")(f)
    return f


def _context(config_dir: Path, registry: str | None, headers, as_json: bool) -> Context:
    hdrs = dict(parse_header(h) for h in headers)
    warnings: list[str] = []

    def warn(line: str) -> None:
        warnings.append(line)
        if not as_json:
            click.echo(f"{PREFIX} warning: {line}", err=True)

    ctx = Context(Fetcher(hdrs, progress=sys.stdout.isatty() and not as_json),
                  load_registries(config_dir),
                  registry or os.environ.get("RNIXFS_REGISTRY") or None,
                  os.environ.get("RNIXFS_GITHUB_API") or GITHUB_API_DEFAULT, warn=warn)
    ctx.warnings = warnings          # type: ignore[attr-defined]
    return ctx


def _project_for(project: Path | None) -> Path | None:
    if project is not None:
        return Path(os.path.abspath(project))
    return find_project(_project(None))


def _confirm_tty(as_json: bool):
    if not (sys.stdin.isatty() and sys.stdout.isatty()) or as_json:
        return None

    def ask(f, scripts: list[str]) -> bool:
        click.echo(f"{PREFIX} {f.name} from {f.url} ships {len(scripts)} script(s):")
        for s in scripts:
            click.echo(f"{PREFIX}   {s}")
        return click.confirm(f"{PREFIX} Install {f.name}?", default=False)
    return ask


def _line(r) -> str:
    what = {"installed": "Installed", "updated": "Updated", "unchanged": "Up to date", "removed": "Removed"}
    ver = f" {r.version}" if r.version else ""
    verified = " (verified)" if r.verified else ""
    scripts = ""
    if r.scripts and r.outcome in ("installed", "updated"):
        scripts = f"; {len(r.scripts)} script(s) " + ("allowed" if r.allow_scripts else
                                                      "not runnable by agents (--allow-scripts to allow)")
    return f"{PREFIX} {what.get(r.outcome, r.outcome)} {r.name}{ver} ({r.scope}/{r.namespace}: {r.path}){verified}{scripts}"


@skill.command("install")
@click.argument("refs", nargs=-1, required=True)
@click.option("-g", "--global", "global_", is_flag=True, help="Install into the user scope.")
@click.option("--shared", is_flag=True, help="Install into the shared .agents/skills namespace.")
@click.option("--force", is_flag=True, help="Overwrite an installed skill of the same name.")
@click.option("--all", "all_", is_flag=True, help="Install every skill a source holds.")
@click.option("--allow-scripts", is_flag=True, help="Let agents run the skill's scripts.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask before installing a remote skill with scripts.")
@_net
@_opts
def skill_install(refs, global_, shared, force, all_, allow_scripts, yes, registry, headers, as_json,
                  project, config_dir):
    """Install skills from a registry NAME, prefix:NAME, github:owner/repo[/path][@ref],
    owner/repo, an https archive or index origin, a git URL, or a local path."""
    _terminate_cleanly()
    results = []
    try:
        cfg = _config(config_dir)
        proj = _project_for(project)
        scope = target_scope(proj, cfg, global_=global_, shared=shared)
        ctx = _context(cfg, registry, headers, as_json)
        pk = Packages(ctx, default_state_dir(), yes=yes, confirm=_confirm_tty(as_json))
        try:
            for ref in refs:
                for r in pk.install(ref, scope, force=force, all_=all_, allow_scripts=allow_scripts,
                                    confine=proj if scope.scope == "project" else None):
                    results.append(r)
                    if not as_json:
                        click.echo(_line(r))
        finally:
            ctx.fetcher.close()
    except (PackageError, SkillError) as exc:
        if results and not as_json:
            click.echo(f"{PREFIX} {len(results)} skill(s) were installed before the error", err=True)
        data = {"installed": [r.to_json() for r in results]} if results else {}
        names = getattr(exc, "names", None)
        if names:                    # a source with several skills: list them
            data["available"] = names
            if not as_json:
                click.echo(f"{PREFIX} Available skills (install one by path or name, or pass --all):")
                for n in names:
                    click.echo(f"{PREFIX}   {n}")
        _die(exc, as_json, data or None)
    if as_json:
        click.echo(dumps({"ok": True, "data": {"installed": [r.to_json() for r in results],
                                               "warnings": ctx.warnings}}))


@skill.command("update")
@click.argument("names", nargs=-1)
@click.option("--allow-scripts/--no-allow-scripts", "allow_scripts", default=None,
              help="Change whether agents may run the scripts (default: keep).")
@click.option("-y", "--yes", is_flag=True, help="Do not ask before updating a remote skill with scripts.")
@_net
@_opts
def skill_update(names, allow_scripts, yes, registry, headers, as_json, project, config_dir):
    """Update installed skills (all, or NAME...) from where they came from, in place."""
    _terminate_cleanly()
    results, failures = [], []
    try:
        cfg = _config(config_dir)
        ctx = _context(cfg, registry, headers, as_json)
        pk = Packages(ctx, default_state_dir(), yes=yes, confirm=_confirm_tty(as_json))
        res = resolve_skills(_project(project), cfg)
        targets = pk.installed(res, list(names))
        try:
            for s, rec in targets:
                try:
                    r = pk.update_one(s, rec, allow_scripts=allow_scripts)
                except PackageError as exc:
                    if names and len(names) == 1:
                        raise
                    failures.append((s.name, exc))
                    if not as_json:
                        click.echo(f"{PREFIX} error: {s.name}: {exc}", err=True)
                    continue
                results.append(r)
                if not as_json:
                    click.echo(_line(r))
        finally:
            ctx.fetcher.close()
    except (PackageError, SkillError) as exc:
        _die(exc, as_json)
    if as_json:
        click.echo(dumps({"ok": not failures, "data": {
            "updated": [r.to_json() for r in results],
            "failed": [{"name": n, "code": e.code, "message": str(e)} for n, e in failures],
            "warnings": ctx.warnings}}))
    elif not targets:
        click.echo(f"{PREFIX} No installed skills to update.")
    if failures:
        sys.exit(failures[0][1].exit_code)


@skill.command("check")
@click.argument("names", nargs=-1)
@_net
@_opts
def skill_check(names, registry, headers, as_json, project, config_dir):
    """Which installed skills have updates (by digest); writes nothing."""
    rows, failures = [], []
    try:
        cfg = _config(config_dir)
        ctx = _context(cfg, registry, headers, as_json)
        pk = Packages(ctx, default_state_dir())
        targets = pk.installed(resolve_skills(_project(project), cfg), list(names))
        try:
            for s, rec in targets:
                try:
                    rows.append(pk.check_one(s, rec))
                except PackageError as exc:
                    failures.append((s.name, exc))
        finally:
            ctx.fetcher.close()
    except (PackageError, SkillError) as exc:
        _die(exc, as_json)
    if as_json:
        click.echo(dumps({"ok": not failures, "data": {
            "skills": [r.to_json() for r in rows],
            "failed": [{"name": n, "code": e.code, "message": str(e)} for n, e in failures]}}))
    else:
        row = "{} {:<20} {:<10} {:<26} {}"
        click.echo(row.format(PREFIX, "NAME", "VERSION", "STATUS", "SOURCE").rstrip())
        for r in rows:
            status = r.outcome + (" (modified)" if r.modified else "")
            click.echo(row.format(PREFIX, r.name, r.version or "-", status, r.url).rstrip())
        for n, e in failures:
            click.echo(f"{PREFIX} error: {n}: {e}", err=True)
    if failures:
        sys.exit(failures[0][1].exit_code)


@skill.command("search")
@click.argument("keyword", required=False)
@_net
@click.option("--json", "as_json", is_flag=True, help="One line of JSON.")
@click.option("--config-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def skill_search(keyword, registry, headers, as_json, config_dir):
    """Search the registry's index by name and description (remote only)."""
    try:
        cfg = _config(config_dir)
        ctx = _context(cfg, registry, headers, as_json)
        try:
            url, found = Packages(ctx, default_state_dir()).search(keyword)
        finally:
            ctx.fetcher.close()
    except (PackageError, SkillError) as exc:
        _die(exc, as_json)
    if as_json:
        click.echo(dumps({"ok": True, "data": {"index": url, "skills": found, "warnings": ctx.warnings}}))
        return
    row = "{} {:<24} {:<10} {}"
    click.echo(row.format(PREFIX, "NAME", "VERSION", "DESCRIPTION").rstrip())
    for s in found:
        desc = " ".join(s["description"].split())
        click.echo(row.format(PREFIX, s["name"], s["version"] or "-", desc[:60]).rstrip())
    if not found:
        click.echo(f"{PREFIX} No skills match{' ' + repr(keyword) if keyword else ''} in {url}.")


@skill.command("remove")
@click.argument("name")
@click.option("-g", "--global", "global_", is_flag=True, help="Remove the user-scope copy.")
@click.option("--shared", is_flag=True, help="Remove the copy in the shared .agents/skills namespace.")
@_opts
def skill_remove(name, global_, shared, as_json, project, config_dir):
    """Remove an installed skill (the winning copy, or the one in the scope -g/--shared name)."""
    try:
        cfg = _config(config_dir)
        proj = _project_for(project)
        scope = target_scope(proj, cfg, global_=global_, shared=shared) if (global_ or shared) else None
        pk = Packages(Context(Fetcher()), default_state_dir())
        r = pk.remove(resolve_skills(proj, cfg), name, scope)
    except (PackageError, SkillError) as exc:
        _die(exc, as_json)
    except OSError as exc:
        _die(PackageError(f"cannot remove {name!r}: {exc.strerror}"), as_json)
    if as_json:
        click.echo(dumps({"ok": True, "data": {"removed": r.to_json()}}))
    else:
        click.echo(_line(r))


# --- trust ---------------------------------------------------------------------------


@click.command("trust")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), default=".")
@click.option("--revoke", is_flag=True, help="Remove the trust marker.")
def trust(directory, revoke):
    """Trust a project's skills: write DIRECTORY/.rnix/state/trusted."""
    from .skills.trust import TRUST_MARKER, is_trusted

    d = Path(os.path.abspath(directory))
    if not d.is_dir():
        raise click.ClickException(f"{d}: not a directory")
    marker = d / TRUST_MARKER
    if revoke:
        try:
            os.unlink(marker)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise click.ClickException(f"cannot remove {marker}: {exc.strerror}")
        click.echo(f"[trust] {d} is no longer trusted")
        return
    try:
        if os.path.lexists(marker) and not is_trusted(d):
            os.unlink(marker)            # a symlink or a directory never counts: replace it
        marker.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        os.close(fd)
    except OSError as exc:
        raise click.ClickException(f"cannot write {marker}: {exc.strerror}")
    click.echo(f"[trust] {d} is trusted ({marker})")


# --- agents --------------------------------------------------------------------------


@agent.command("create")
@click.argument("name")
@click.option("--skills", default="", help="Comma-separated skill names.")
@click.option("--model", default="", help="Preferred model.")
@click.option("--provider", default="", help="Provider name (providers.yaml).")
@click.option("-d", "--description", default="", help="One-line description.")
@click.option("-g", "--global", "global_", is_flag=True, help="Create in the user scope.")
@click.option("--config-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--project", type=click.Path(file_okay=False, path_type=Path), default=None)
def agent_create(name, skills, model, provider, description, global_, config_dir, project):
    """Create an agent (agent.yaml + instructions.md) in the write scope."""
    from .agents.edit import create_agent
    from .skills import write_scope

    cfg = _config(config_dir)
    proj = None if global_ else _project_for(project)
    base = write_scope(proj, cfg, "agents")
    names = [s.strip() for s in skills.split(",") if s.strip()]
    from .skills.parse import check_name
    for s in names:
        if check_name(s):
            raise click.ClickException(f"invalid skill name {s!r}: {check_name(s)[0]}")
    try:
        path = create_agent(name, base.path, skills=names, model=model, provider=provider,
                            description=description)
    except AgentError as exc:
        raise click.ClickException(str(exc))
    except OSError as exc:
        raise click.ClickException(f"cannot create agent {name!r}: {exc.strerror}")
    click.echo(f"{APREFIX} Created {name} ({base.scope}: {path})")


@agent.group("skill")
def agent_skill():
    """Add, remove or list an agent's skills (comments and key order are kept)."""


def _agent_yaml(name: str, project: Path | None, config_dir: Path | None) -> Path:
    from .agents.manifest import AGENT_FILE, find_agent_dir

    d, _, _ = find_agent_dir(name, _project(project), _config(config_dir))
    return d / AGENT_FILE


@agent_skill.command("add")
@click.argument("name")
@click.argument("skills", nargs=-1, required=True)
@click.option("--config-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--project", type=click.Path(file_okay=False, path_type=Path), default=None)
def agent_skill_add(name, skills, config_dir, project):
    """Add SKILL... to agent NAME."""
    from .agents.edit import edit_skills
    from .skills.parse import check_name

    for s in skills:
        if check_name(s):
            raise click.ClickException(f"invalid skill name {s!r}: {check_name(s)[0]}")
    try:
        new = edit_skills(_agent_yaml(name, project, config_dir), add=list(skills))
    except AgentError as exc:
        raise click.ClickException(str(exc))
    click.echo(f"{APREFIX} {name} skills: {' '.join(new) or '(none)'}")


@agent_skill.command("remove")
@click.argument("name")
@click.argument("skills", nargs=-1, required=True)
@click.option("--config-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--project", type=click.Path(file_okay=False, path_type=Path), default=None)
def agent_skill_remove(name, skills, config_dir, project):
    """Remove SKILL... from agent NAME."""
    from .agents.edit import edit_skills

    try:
        new = edit_skills(_agent_yaml(name, project, config_dir), remove=list(skills))
    except AgentError as exc:
        raise click.ClickException(str(exc))
    click.echo(f"{APREFIX} {name} skills: {' '.join(new) or '(none)'}")


@agent_skill.command("list")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.option("--config-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--project", type=click.Path(file_okay=False, path_type=Path), default=None)
def agent_skill_list(name, as_json, config_dir, project):
    """List agent NAME's skills."""
    from .agents.edit import read_skills

    try:
        names = read_skills(_agent_yaml(name, project, config_dir))
    except AgentError as exc:
        raise click.ClickException(str(exc))
    if as_json:
        click.echo(dumps({"ok": True, "data": {"agent": name, "skills": names}}))
    else:
        for s in names:
            click.echo(s)


# --- audit of skill create / delete -------------------------------------------------


def _root_entries(kwargs: dict) -> dict[tuple, set[str]]:
    """Names in every skill root the command could touch: {(path, scope, ns): names}."""
    from .skills import skill_roots

    cfg = _config(kwargs.get("config_dir"))
    projects = []
    if kwargs.get("project") is not None:
        projects.append(Path(os.path.abspath(kwargs["project"])))
    else:
        try:
            cwd = Path(os.getcwd())
        except OSError:
            cwd = None
        if cwd is not None:
            projects += [cwd] + [p for p in [find_project(cwd)] if p is not None]
    roots = {}
    for proj in projects or [None]:
        for r in skill_roots(proj, cfg):
            try:
                names = {e.name for e in os.scandir(r.path) if not e.name.startswith(".")}
            except OSError:
                names = set()
            roots[(str(r.path), r.scope, r.namespace)] = names
    return roots


def _audited(cmd_name: str, action: str) -> None:
    """Wrap ``skill create``/``skill delete`` so each success is one audit line
    (docs/packages.md), whatever options those commands grow."""
    import functools

    from .skills.packages.audit import audit

    cmd = skill.commands.get(cmd_name)
    if cmd is None or getattr(cmd.callback, "_audited", False):
        return
    original = cmd.callback

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        try:
            before = _root_entries(kwargs)
        except Exception:              # auditing never stands in the command's way
            before = None
        rv = original(*args, **kwargs)
        if before is not None:
            try:
                after = _root_entries(kwargs)
                for key in after.keys() | before.keys():
                    a, b = after.get(key, set()), before.get(key, set())
                    for n in sorted(a - b if action == "create" else b - a):
                        audit(default_state_dir(), action, n, scope=key[1], namespace=key[2],
                              source="local", url=os.path.join(key[0], n))
            except Exception as exc:   # noqa: BLE001 - the command itself succeeded
                click.echo(f"{PREFIX} warning: could not write the audit log: {exc}", err=True)
        return rv
    wrapped._audited = True            # type: ignore[attr-defined]
    cmd.callback = wrapped


_audited("create", "create")
_audited("delete", "delete")


def register(main: click.Group) -> None:
    """Hook the top-level commands onto the root group (skill/agent subcommands
    register themselves on import)."""
    main.add_command(trust)
