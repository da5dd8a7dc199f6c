"""Skill packages: install, update, check, search and remove skills from
where they really live (RFC v0.2.0 registries, GitHub, https archives, git,
local paths) - verified, atomic, recorded. See docs/packages.md.

Modules (import what you need; this package imports nothing eagerly so that
``skills.resolve`` can use ``registry_file`` without a cycle):

    sources        parse_ref / source_from_origin -> Source; Source.fetch -> [Fetched]
    index          the RFC discovery index (v0.2.0, v0.1 read-only)
    verify         sha256 file and skill digests, the RFC's validation order
    archive        safe extraction (.tar.gz, .tar, .zip) with caps
    install        scope table, atomic install/update/remove, check, search
    registry_file  <skill>/.registry.yaml; scripts_allowed(skill_dir) -> bool
    registries     named registries (registries.yaml, mode 0600)
    audit          <state dir>/audit.jsonl
    errors         PackageError and its exit codes
"""
