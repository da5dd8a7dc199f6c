"""`rnixfs skill ...` and `rnixfs agent ...`: skills and agents from the shell.

Output follows Rnix (`rnix skill list`): a ``[skill]``-prefixed 6-column
table, one stderr warning line per diagnostic, ``--json`` as one line
``{"ok": true, "data": {"skills": [...], "diagnostics": {...}}}`` (the
diagnostics node is always there; empty channels are omitted), ``--quiet``
for names only. Failures exit non-zero with one line on stderr.

Every human output passes text from SKILL.md files, manifests and paths
through :mod:`rnixfs.textsafe` (control characters and escape sequences
escaped, table cells cut to their column); ``--json`` stays exact.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from .agents import AgentError, list_agents, load_agent
from .config import default_config_dir
from .skills import (
    SKILL_FILE, SkillError, create_skill, delete_skill, ensure_builtins, find_project,
    resolve_skills, validate_strict, write_scope,
)
from .skills.manage import check_new_name, skill_template
from .skills.parse import MAX_SKILL_MD_BYTES, name_key
from .skills.resolve import dumps
from .textsafe import Column, block, clean, one_line, table

PREFIX = "[skill]"
APREFIX = "[agent]"
# Rnix's column widths are the minimums; a column grows to its longest
# cell up to its maximum and cuts longer cells with "..." (a name longer than
# the specification's 64 characters already carries a lenient warning).
SKILL_COLUMNS = (Column("NAME", 20, 64), Column("VERSION", 10, 16), Column("SOURCE", 11, 11),
                 Column("SCOPE", 9, 9), Column("NAMESPACE", 10, 10),
                 Column("DESCRIPTION", 0, 40, fold=True))
AGENT_COLUMNS = (Column("NAME", 20, 64), Column("SCOPE", 9, 9), Column("SOURCE", 9, 9),
                 Column("DESCRIPTION", 0, 60, fold=True))


def _fail(msg: str, as_json: bool = False, code: str = "ERROR") -> None:
    if as_json:
        click.echo(dumps({"ok": False, "error": {"code": code, "message": msg}}))
        sys.exit(1)
    raise click.ClickException(clean(msg))


def _dir_option(name: str, help_: str):
    return click.option(name, type=click.Path(file_okay=False, path_type=Path), default=None, help=help_)


def _common(f):
    f = _dir_option("--config-dir", "Config directory (default: $XDG_CONFIG_HOME/rnix).")(f)
    f = _dir_option("--project", "Project directory (default: the current directory).")(f)
    return f


def _config(config_dir: Path | None) -> Path:
    cfg = Path(config_dir) if config_dir is not None else default_config_dir()
    ensure_builtins(cfg)
    return cfg


def _project(project: Path | None) -> Path:
    if project is None:
        try:
            project = Path(os.getcwd())
        except OSError as exc:
            raise click.ClickException(f"cannot resolve the current directory: {exc.strerror}") from None
    return Path(os.path.abspath(project))


def _stderr(line: str) -> None:
    click.echo(clean(line), err=True)


def _out(line: str) -> None:
    click.echo(clean(line))


# --- skill ---------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def skill() -> None:
    """Skills: list, show, validate, create, delete (four-path model)."""


@skill.command("list")
@click.option("-g", "--global", "only_user", is_flag=True, help="Only user scope (~/.config/rnix/skills + ~/.agents/skills).")
@click.option("-p", "--project-scope", "only_project", is_flag=True, help="Only project scope (.rnix/skills + .agents/skills).")
@click.option("--json", "as_json", is_flag=True, help="JSON output, with a diagnostics node.")
@click.option("--quiet", "-q", is_flag=True, help="Only skill names, one per line.")
@click.option("--ancestors", is_flag=True, help="Also search the project's parent directories (monorepos).")
@_common
def skill_list(only_user, only_project, as_json, quiet, ancestors, project, config_dir):
    """List skills from all scopes; shadowed copies and problems go to stderr."""
    if only_user and only_project:
        _fail("-g/--global and -p/--project-scope are mutually exclusive", as_json, "USAGE")
    if as_json and quiet:
        _fail("--json and --quiet are mutually exclusive", as_json, "USAGE")
    scope = "user" if only_user else "project" if only_project else None
    proj = _project(project)
    try:
        res = resolve_skills(proj, _config(config_dir), ancestors=ancestors, scope=scope)
    except (OSError, SkillError, ValueError) as exc:
        _fail(f"failed to list skills: {exc}", as_json, "LIST_ERROR")
    if as_json:
        click.echo(dumps({"ok": True, "data": res.to_json()}))
        return
    entries = res.list_entries()
    if quiet:
        for e in entries:
            _out(e["name"])
    else:
        rows = [(e["name"], e["version"], e["source"], e["scope"], e["namespace"], e["description"])
                for e in entries]
        for line in table(SKILL_COLUMNS, rows, prefix=PREFIX):
            click.echo(line)
        if not entries:
            click.echo(f"{PREFIX} No skills found. Scanned paths:")
            for p in res.paths:
                if not p.ancestor:
                    _out(f"{PREFIX}   - {p.path} ({p.status})")
            click.echo(f"{PREFIX} Tip: rnixfs skill create <name> to add a skill.")
    for line in res.warning_lines():
        _stderr(line)


@skill.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--ancestors", is_flag=True, help="Also search the project's parent directories.")
@_common
def skill_show(name, as_json, ancestors, project, config_dir):
    """Show a skill's metadata, where it came from, and its body."""
    res = resolve_skills(_project(project), _config(config_dir), ancestors=ancestors)
    s = res.lookup(name)
    if s is None:
        _fail(f'skill "{name}" not found', as_json, "NOT_FOUND")
    info = res.describe(name)
    if not s.valid:
        _fail(f'skill "{name}" is not loaded: {s.error} ({s.path})', as_json, "INVALID")
    try:
        body = s.body()
    except SkillError as exc:
        _fail(str(exc), as_json, "INVALID")
    if as_json:
        info["body"] = body
        info["resources"] = s.resources()
        click.echo(dumps({"ok": True, "data": info}))
        return
    lines = [("name", s.ref_name), ("directory", s.name if s.name != s.ref_name else ""),
             ("description", one_line(s.description)),
             ("scope", s.scope), ("namespace", s.namespace), ("path", str(s.path)),
             ("version", s.version), ("source", s.source), ("license", s.license or ""),
             ("compatibility", s.compatibility or ""),
             ("allowed-tools", " ".join(s.allowed_tools) or "(unrestricted)"),
             ("trust", info["trust"])]
    for key, value in lines:
        if value:
            _out(f"{key}: {value}")
    for c in info["shadowed"]:
        _out(f"shadowed: {c['path']} ({c['scope']}/{c['namespace']})")
    for d in info["diagnostics"]:
        _out(f"warning: {d}")
    for r in s.resources():
        _out(f"resource: {r}")
    click.echo("---")
    click.echo(block(body))


def _validate_target(arg: str, project: Path | None, config_dir: Path | None) -> Path:
    """A path as given, or, for a bare word that is not a path, the winning
    copy of the skill of that name (valid or not: validating a broken copy
    is the point)."""
    path = Path(arg)
    if os.sep in arg or arg in (".", "..") or os.path.lexists(path):
        return path
    try:
        res = resolve_skills(_project(project), _config(config_dir))
    except (OSError, SkillError, ValueError):
        return path
    s = res.lookup(arg)
    return s.path if s is not None else path


@skill.command("validate")
@click.argument("target", metavar="NAME|PATH")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@_common
def skill_validate(target, as_json, project, config_dir):
    """Validate a skill strictly, like `skills-ref validate`.

    NAME|PATH is a skill directory, its SKILL.md, or the name of a skill
    (its winning copy is validated); an existing path wins over a name.
    """
    path = _validate_target(target, project, config_dir)
    errors = validate_strict(path)
    target = path.parent if path.name == SKILL_FILE and not path.is_dir() else path
    if as_json:
        click.echo(dumps({"ok": not errors, "data": {"path": str(target), "valid": not errors,
                                                    "errors": errors}}))
        sys.exit(1 if errors else 0)
    if errors:
        _stderr(f"Validation failed for {target}:")
        for e in errors:
            _stderr(f"  - {e}")
        sys.exit(1)
    _out(f"Valid skill: {target}")


def _read_source(file: str) -> bytes:
    try:
        if file == "-":
            data = sys.stdin.buffer.read(MAX_SKILL_MD_BYTES + 1)
        else:
            p = Path(file)
            if p.is_dir():
                p = p / SKILL_FILE
            with open(p, "rb") as f:
                if not os.path.isfile(p):
                    raise SkillError(f"{file}: not a regular file")
                data = f.read(MAX_SKILL_MD_BYTES + 1)
    except OSError as exc:
        raise SkillError(f"{file}: {exc.strerror}") from None
    if len(data) > MAX_SKILL_MD_BYTES:
        raise SkillError(f"{file}: larger than {MAX_SKILL_MD_BYTES} bytes")
    return data


def _editor() -> list[str]:
    """The user's editor command ($VISUAL, then $EDITOR, then vi), split like a shell would."""
    for var in ("VISUAL", "EDITOR"):
        value = os.environ.get(var, "").strip()
        if value:
            try:
                argv = shlex.split(value)
            except ValueError as exc:
                _fail(f"${var} cannot be parsed: {exc}")
            if argv:
                return argv
    if shutil.which("vi"):
        return ["vi"]
    _fail("--edit needs an editor: set $EDITOR (or $VISUAL)")
    return []


def _edit_draft(name: str, text: bytes | None, description: str | None) -> tuple[bytes, Path]:
    """Open a draft SKILL.md in the editor; (the edited bytes, the draft's path).

    The draft lives in a private temporary directory, so nothing lands in a
    skill root until the edited file passes strict validation; on failure
    the draft stays there and the error names it.
    """
    editor = _editor()
    if text is None:
        try:
            text = skill_template(name, description).encode()
        except SkillError as exc:
            _fail(str(exc))
    draft_dir = tempfile.mkdtemp(prefix=f"rnixfs-skill-{name[:40]}-")
    draft = Path(draft_dir) / SKILL_FILE
    draft.write_bytes(text)
    try:
        rc = subprocess.run([*editor, str(draft)]).returncode
    except OSError as exc:
        _fail(f"cannot run the editor {editor[0]!r}: {exc.strerror}; draft kept at {draft}")
    if rc != 0:
        _fail(f"the editor exited with status {rc}; nothing created, draft kept at {draft}")
    try:
        return _read_source(str(draft)), draft
    except SkillError as exc:
        _fail(f"{exc}; draft kept at {draft}")
    return b"", draft


@skill.command("create")
@click.argument("name")
@click.option("--from-template", "from_template", is_flag=True, help="Start from the built-in template (the default).")
@click.option("-f", "--file", "file", metavar="FILE", help="Use FILE (or - for stdin) as the SKILL.md.")
@click.option("-d", "--description", help="Description for the template.")
@click.option("-g", "--global", "to_user", is_flag=True, help="Create in the user scope (~/.config/rnix/skills).")
@click.option("--shared", is_flag=True,
              help="Create in the shared .agents/skills namespace of the write scope (read by other agent tools).")
@click.option("--edit", is_flag=True, help="Open the new SKILL.md in $EDITOR first; created only if it then validates.")
@_common
def skill_create(name, from_template, file, description, to_user, shared, edit, project, config_dir):
    """Create a skill in the write scope (project .rnix/skills, else user)."""
    name = name_key(name)     # one normal form (NFKC), as validation compares names
    if from_template and file:
        _fail("--from-template and -f/--file are mutually exclusive")
    if file and description:
        _fail("--description only applies to the template")
    if edit and file == "-":
        _fail("--edit cannot read the SKILL.md from stdin")
    cfg = _config(config_dir)
    if to_user:
        proj = None
    elif project is not None:
        proj = Path(os.path.abspath(project))
    else:
        proj = find_project(_project(None))
    target = write_scope(proj, cfg, "skills", shared=shared)
    draft = None
    try:
        check_new_name(name)
        text = _read_source(file) if file else None
        if edit:
            text, draft = _edit_draft(name, text, description)
            description = None
        path = create_skill(name, target.path, description=description, text=text,
                            confine=proj if target.scope == "project" else None)
    except SkillError as exc:
        _fail(str(exc) + (f"; the edited SKILL.md is kept at {draft}" if draft is not None else ""))
    except OSError as exc:
        _fail(f"cannot create skill {name!r}: {exc.strerror}"
              + (f"; the edited SKILL.md is kept at {draft}" if draft is not None else ""))
    if draft is not None:
        shutil.rmtree(draft.parent, ignore_errors=True)
    _out(f"{PREFIX} Created {name} ({target.scope}/{target.namespace}: {path})")


@skill.command("delete")
@click.argument("name")
@_common
def skill_delete(name, project, config_dir):
    """Delete the winning copy of a skill (the one `skill list` shows)."""
    proj, cfg = _project(project), _config(config_dir)
    try:
        res = resolve_skills(proj, cfg)
        gone = delete_skill(res, name)
    except SkillError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot delete skill {name!r}: {exc.strerror}")
    _out(f"{PREFIX} Deleted {name} ({gone.scope}/{gone.namespace}: {gone.path})")
    after = resolve_skills(proj, cfg).lookup(name)
    if after is not None:
        _out(f"{PREFIX} {name} now resolves to {after.path} ({after.scope}/{after.namespace})")


# --- agent ---------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def agent() -> None:
    """Agents: list and show (project .rnix/agents over ~/.config/rnix/agents)."""


@agent.command("list")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--quiet", "-q", is_flag=True, help="Only agent names.")
@_common
def agent_list(as_json, quiet, project, config_dir):
    """List agents; invalid ones say why."""
    entries = list_agents(_project(project), _config(config_dir))
    if as_json:
        click.echo(dumps({"ok": True, "data": {"agents": [e.to_json() for e in entries]}}))
        return
    if quiet:
        for e in entries:
            if e.error is None:
                _out(e.name)
        return
    rows = [(e.name, e.scope, e.source, f"(invalid: {e.error})" if e.error else e.description)
            for e in entries]
    for line in table(AGENT_COLUMNS, rows, prefix=APREFIX):
        click.echo(line)
    if not entries:
        click.echo(f"{APREFIX} No agents found.")
    for e in entries:
        for p in e.shadowed:
            _stderr(f"{APREFIX} warning: shadowed agent \"{e.name}\": winner={e.path} ({e.scope}); shadowed={p}")


@agent.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@_common
def agent_show(name, as_json, project, config_dir):
    """Show an agent's manifest (with defaults applied) and instructions."""
    try:
        m = load_agent(name, _project(project), _config(config_dir))
    except AgentError as exc:
        _fail(str(exc), as_json, "NOT_FOUND" if type(exc).__name__ == "AgentNotFound" else "INVALID")
    if as_json:
        d = m.to_json()
        d["instructions"] = m.instructions
        click.echo(dumps({"ok": True, "data": d}))
        return
    d = m.to_json()
    for key in ("name", "description", "scope", "path", "source"):
        if d.get(key):
            _out(f"{key}: {one_line(d[key]) if key == 'description' else d[key]}")
    models = {k: v for k, v in d["models"].items() if v}
    if models:
        _out("models: " + ", ".join(f"{k}={v}" for k, v in models.items()))
    for key in ("skills", "deferred_skills", "tools", "alternatives"):
        if d[key]:
            _out(f"{key}: {' '.join(map(str, d[key]))}")
    for key in ("planning", "project_doc", "max_steps", "max_tokens", "max_cost",
                "context_budget", "ctx_size", "step_timeout", "language"):
        if d[key] not in ("", None):
            _out(f"{key}: {str(d[key]).lower() if isinstance(d[key], bool) else d[key]}")
    for w in m.warnings:
        _out(f"warning: {w}")
    click.echo("---")
    click.echo(block(m.instructions.rstrip("\n")))
