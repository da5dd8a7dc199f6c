"""Worker processes that run agent loops off the daemon's FUSE loop
(docs/architecture.md, "Workers and the kernel protocol")."""
