"""SKILL.md: frontmatter parsing, strict validation and the lenient tiers.

Three layers, from the bytes up:

* :func:`parse_skill_md` splits a SKILL.md into its YAML frontmatter (a dict)
  and its Markdown body. Structural errors use Rnix's exact wording:
  ``SKILL.md must start with ---`` / ``SKILL.md missing closing ---``.
* :func:`validate_strict` checks a skill directory against the agentskills.io
  specification and returns a list of error messages; it is meant to give
  the same verdict as the reference validator ``skills-ref validate`` where
  the specification is clear (see docs/skills.md for the deliberate
  differences, e.g. ``synergy``).
* :func:`lenient_check` applies Rnix's two loading tiers: warn-but-load
  (name differs from the directory, name longer than 64 characters) and
  skip (missing name, missing description, unparseable YAML).

YAML is read with a loader that keeps every scalar as text (``version: 1.0``
stays ``"1.0"``, ``yes`` stays ``"yes"``), as the reference validator does,
refuses aliases (no billion-laughs) and duplicate keys, and never builds
Python objects from tags.
"""
from __future__ import annotations

import os
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import yaml

SKILL_FILE = "SKILL.md"
MAX_SKILL_MD_BYTES = 1 << 20        # a SKILL.md larger than this is refused
MAX_FRONTMATTER_BYTES = 64 << 10    # frontmatter larger than this is refused
MAX_NAME_LEN = 64                   # agentskills.io: name is 1-64 characters
MAX_DESCRIPTION_LEN = 1024
MAX_COMPATIBILITY_LEN = 500

# Fields the agentskills.io specification defines, plus rnix's `synergy`.
SPEC_FIELDS = ("name", "description", "license", "allowed-tools", "metadata", "compatibility")
RNIX_FIELDS = ("synergy",)
ALLOWED_FIELDS = frozenset(SPEC_FIELDS + RNIX_FIELDS)


class SkillParseError(ValueError):
    """A SKILL.md cannot be parsed; ``str()`` is one readable line."""


# --- YAML ----------------------------------------------------------------------


class _FrontmatterLoader(yaml.BaseLoader):
    """All scalars are strings; aliases and duplicate keys are errors."""

    def compose_node(self, parent, index):  # noqa: D401 - PyYAML hook
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in SKILL.md frontmatter", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, "mapping keys must be plain text", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"found duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def yaml_reason(exc: Exception, line_offset: int = 0) -> str:
    """One line for a YAML error: ``line N: problem`` (N counted in the file)."""
    if isinstance(exc, RecursionError):
        return "nesting too deep"
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["invalid YAML"])[0]
    if mark is not None:
        return f"line {mark.line + 1 + line_offset}: {problem}"
    return str(problem)


def load_yaml(text: str):
    """Load YAML text with the frontmatter loader (raises yaml.YAMLError/RecursionError)."""
    return yaml.load(text, Loader=_FrontmatterLoader)  # noqa: S506 - BaseLoader subclass, no objects


# --- SKILL.md ------------------------------------------------------------------


def split_skill_md(text: str) -> tuple[str, str]:
    """Split into (frontmatter text, body) following Rnix's line rules.

    The first line must be ``---`` (trailing whitespace and CR allowed); the
    frontmatter ends at the next line that is ``---`` the same way. A line
    with leading whitespace is not a delimiter (it can be part of a YAML
    block scalar). The body is everything after that line, stripped.
    """
    lines = text.split("\n")
    if not lines or lines[0].rstrip() != "---":
        raise SkillParseError("SKILL.md must start with ---")
    for i in range(1, len(lines)):
        if lines[i].rstrip() == "---":
            front = "".join(line.rstrip("\r") + "\n" for line in lines[1:i])
            body = "\n".join(lines[i + 1:]).strip()
            return front, body
    raise SkillParseError("SKILL.md missing closing ---")


def parse_frontmatter(front: str) -> dict:
    """YAML frontmatter text -> dict. Raises SkillParseError("yaml parse error: ...")."""
    if len(front.encode("utf-8", "surrogatepass")) > MAX_FRONTMATTER_BYTES:
        raise SkillParseError(f"frontmatter exceeds {MAX_FRONTMATTER_BYTES} bytes")
    try:
        data = load_yaml(front)
    except (yaml.YAMLError, RecursionError) as exc:
        # The frontmatter starts on the second line of SKILL.md.
        raise SkillParseError(f"yaml parse error: {yaml_reason(exc, 1)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SkillParseError("yaml parse error: SKILL.md frontmatter must be a YAML mapping")
    return data


def parse_skill_md(text: str) -> tuple[dict, str]:
    """Parse SKILL.md text into (frontmatter dict, Markdown body).

    Errors (SkillParseError): ``SKILL.md must start with ---``,
    ``SKILL.md missing closing ---``, ``yaml parse error: ...``.
    """
    front, body = split_skill_md(text)
    return parse_frontmatter(front), body


def decode_skill_md(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SkillParseError(f"SKILL.md is not valid UTF-8 (byte {exc.start})") from None


def read_skill_md(path: Path, *, cap: int = MAX_SKILL_MD_BYTES) -> str:
    """Read a SKILL.md (a regular file, at most ``cap`` bytes) as text.

    Raises SkillParseError with a readable reason; never reads more than
    ``cap + 1`` bytes, never blocks on a FIFO or device.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SkillParseError("missing SKILL.md") from None
    except OSError as exc:
        raise SkillParseError(f"cannot read SKILL.md: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise SkillParseError("SKILL.md is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise SkillParseError("SKILL.md is not a regular file")
        if st.st_size > cap:
            raise SkillParseError(f"SKILL.md is {st.st_size} bytes; the cap is {cap}")
        chunks, total = [], 0
        while total <= cap:
            chunk = os.read(fd, min(1 << 16, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > cap:
            raise SkillParseError(f"SKILL.md is more than {cap} bytes")
    except OSError as exc:
        raise SkillParseError(f"cannot read SKILL.md: {exc.strerror}") from None
    finally:
        os.close(fd)
    return decode_skill_md(b"".join(chunks))


# --- strict validation -----------------------------------------------------------


def check_name(name, dir_name: str | None = None) -> list[str]:
    """The spec's rules for ``name`` (and the parent-directory match)."""
    if not isinstance(name, str) or not name.strip():
        return ["Field 'name' must be a non-empty string"]
    name = name_key(name)
    errors = []
    if len(name) > MAX_NAME_LEN:
        errors.append(f"Skill name '{name}' exceeds {MAX_NAME_LEN} character limit ({len(name)} chars)")
    if name != name.lower():
        errors.append(f"Skill name '{name}' must be lowercase")
    if name.startswith("-") or name.endswith("-"):
        errors.append("Skill name cannot start or end with a hyphen")
    if "--" in name:
        errors.append("Skill name cannot contain consecutive hyphens")
    if not all(c.isalnum() or c == "-" for c in name):
        errors.append(f"Skill name '{name}' contains invalid characters. "
                      "Only letters, digits, and hyphens are allowed.")
    if dir_name is not None and name_key(dir_name) != name:
        errors.append(f"Directory name '{dir_name}' must match skill name '{name}'")
    return errors


def _check_text(fm: dict, key: str, limit: int | None, required: bool) -> list[str]:
    if key not in fm:
        return [f"Missing required field in frontmatter: {key}"] if required else []
    value = fm[key]
    if not isinstance(value, str):
        return [f"Field '{key}' must be a string" if not required
                else f"Field '{key}' must be a non-empty string"]
    if not value.strip():
        return [f"Field '{key}' must be a non-empty string"]
    if limit is not None and len(value) > limit:
        label = key.capitalize()
        return [f"{label} exceeds {limit} character limit ({len(value)} chars)"]
    return []


def check_allowed_tools(value) -> str | None:
    """None if ``allowed-tools`` has a valid shape (string or list of strings)."""
    if isinstance(value, str):
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return None
    return "Field 'allowed-tools' must be a space-delimited string or a list of strings"


def check_metadata(value) -> str | None:
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return None
    return "Field 'metadata' must be a mapping of string keys to string values"


def check_synergy(value) -> str | None:
    """rnix extension: a list of ``{with: <skill>, instruction: <text>}``."""
    if not isinstance(value, list):
        return "Field 'synergy' must be a list of {with, instruction} mappings"
    for item in value:
        if (not isinstance(item, dict) or set(item) - {"with", "instruction"}
                or not isinstance(item.get("with"), str) or not item["with"].strip()
                or not isinstance(item.get("instruction", ""), str)):
            return "Field 'synergy' must be a list of {with, instruction} mappings"
    return None


def validate_frontmatter(fm: dict, dir_name: str | None = None) -> list[str]:
    """Strict checks on parsed frontmatter; [] means valid."""
    errors = []
    extra = sorted(set(map(str, fm)) - ALLOWED_FIELDS)
    if extra:
        errors.append(f"Unexpected fields in frontmatter: {', '.join(extra)}. "
                      f"Only {sorted(ALLOWED_FIELDS)} are allowed.")
    if "name" not in fm:
        errors.append("Missing required field in frontmatter: name")
    else:
        errors.extend(check_name(fm["name"], dir_name))
    errors.extend(_check_text(fm, "description", MAX_DESCRIPTION_LEN, required=True))
    if "compatibility" in fm:
        errors.extend(_check_text(fm, "compatibility", MAX_COMPATIBILITY_LEN, required=False))
    if "license" in fm and not isinstance(fm["license"], str):
        errors.append("Field 'license' must be a string")
    for key, check in (("allowed-tools", check_allowed_tools), ("metadata", check_metadata),
                       ("synergy", check_synergy)):
        if key in fm and fm[key] != "" and (msg := check(fm[key])):
            errors.append(msg)
    return errors


def validate_strict(path: Path | str) -> list[str]:
    """Validate a skill directory (or its SKILL.md) strictly; [] means valid."""
    path = Path(path)
    if path.name == SKILL_FILE and not path.is_dir():
        path = path.parent
    try:
        st = path.stat()
    except FileNotFoundError:
        return [f"Path does not exist: {path}"]
    except OSError as exc:
        return [f"Cannot access {path}: {exc.strerror}"]
    if not stat.S_ISDIR(st.st_mode):
        return [f"Not a directory: {path}"]
    skill_md = path / SKILL_FILE
    if not skill_md.exists() and not skill_md.is_symlink():
        return [f"Missing required file: {SKILL_FILE}"]
    try:
        fm, _ = parse_skill_md(read_skill_md(skill_md))
    except SkillParseError as exc:
        return [str(exc)]
    return validate_frontmatter(fm, path.resolve().name if path.name in ("", ".", "..") else path.name)


# --- lenient loading ------------------------------------------------------------


@dataclass(frozen=True)
class LenientWarning:
    """Warn-but-load: the skill still loads (Rnix's LenientWarning)."""

    path: str
    field: str
    reason: str
    detail: str

    def to_json(self) -> dict:
        return {"path": self.path, "field": self.field, "reason": self.reason, "detail": self.detail}


class LenientSkip(Exception):
    """Skip: the skill is not loaded; ``reason`` says why (Rnix's LenientSkipError)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def goquote(s: str) -> str:
    """Quote like Go's %q (Rnix renders paths and names with it)."""
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\a\b\f\n\r\t\v":
            out.append("\\" + "abfnrtv"["\a\b\f\n\r\t\v".index(ch)])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def name_key(name: str) -> str:
    """The one normal form of a skill name, as ``skills-ref`` uses it: stripped, NFKC.

    Validation, the lenient tiers, lookups by name and ``skill create`` all
    compare names in this form, so an NFD name in an NFC directory (or the
    reverse, as macOS writes them) is the same name everywhere.
    """
    return unicodedata.normalize("NFKC", name.strip())


# Optional fields whose wrong shape only costs information: the skill loads,
# the field is dropped (or, for metadata, kept as written), with a warning.
_INFORMATIONAL = (
    ("metadata", check_metadata, "a mapping of string keys to string values"),
    ("synergy", check_synergy, "a list of {with, instruction} mappings"),
)


def lenient_check(fm: dict, dir_name: str, path: str) -> list[LenientWarning]:
    """Rnix's lenient tiers on parsed frontmatter.

    Raises LenientSkip("missing name" / "missing description" / a type
    reason); returns the warn-but-load warnings otherwise. ``allowed-tools``
    of the wrong shape skips the skill (a grant that cannot be read must not
    become "unrestricted"); Rnix-style ``metadata`` (lists, nested maps, a
    scalar), a malformed ``synergy`` and a non-text ``license`` or
    ``compatibility`` only warn.
    """
    name = fm.get("name")
    if name is None or name == "":
        raise LenientSkip("missing name")
    if not isinstance(name, str):
        raise LenientSkip("invalid name: must be text")
    description = fm.get("description")
    if description is not None and not isinstance(description, str):
        raise LenientSkip("invalid description: must be text")
    if not (description or "").strip():
        raise LenientSkip("missing description")
    tools = fm.get("allowed-tools")
    if "allowed-tools" in fm and tools != "" and check_allowed_tools(tools):
        raise LenientSkip("invalid allowed-tools: must be a space-delimited string or a list of strings")
    warnings = []
    for key, check, want in _INFORMATIONAL:
        if key in fm and fm[key] != "" and check(fm[key]):
            warnings.append(LenientWarning(path, key, f"{key} is not {want}",
                                           f"type={_shape(fm[key])}; " + (
                                               "non-text values kept as written" if key == "metadata"
                                               and isinstance(fm[key], dict) else "ignored")))
    for key in ("license", "compatibility"):
        if key in fm and not isinstance(fm[key], str):
            warnings.append(LenientWarning(path, key, f"{key} is not text", f"type={_shape(fm[key])}; ignored"))
    key = name_key(name)
    if key != name_key(dir_name):
        warnings.append(LenientWarning(
            path, "name", "name mismatch parent dir",
            f"manifest.Name={goquote(name)}, parentDir={goquote(dir_name)}"))
    if len(key) > MAX_NAME_LEN:
        warnings.append(LenientWarning(
            path, "name", f"name exceeds {MAX_NAME_LEN} chars",
            f"truncated={goquote(key[:MAX_NAME_LEN - 3] + '...')} (full len={len(key)})"))
    return warnings


def _shape(value) -> str:
    return {dict: "mapping", list: "list", str: "text"}.get(type(value), type(value).__name__)
