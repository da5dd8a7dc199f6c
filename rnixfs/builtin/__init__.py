"""Package data: built-in skills and agents, and templates (see rnixfs.skills.builtins)."""
