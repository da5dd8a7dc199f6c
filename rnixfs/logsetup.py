"""The log format of the daemon and its workers, set up one way.

Both append to the daemon's ``daemon.log``; a worker's lines carry
``[worker PID]`` after the logger name. Hostile names reach messages as
surrogate escapes: records are written with backslashreplace, so a record
is never lost to "--- Logging error ---".
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path


def setup_logging(path: Path | str | None, level: str = "INFO", *, tag: str = "") -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(path, errors="backslashreplace")
    else:
        if hasattr(sys.stderr, "reconfigure"):
            sys.stderr.reconfigure(errors="backslashreplace")
        handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s{tag}: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    logging.getLogger("pyfuse3").addFilter(_caller_gone_is_info)


def _caller_gone_is_info(record: logging.LogRecord) -> bool:
    """pyfuse3 logs ERROR when the kernel no longer wants a reply (the caller
    was interrupted, e.g. Ctrl-C on a blocked read): normal, so INFO."""
    if record.levelno >= logging.ERROR and "fuse_reply_" in str(record.msg) \
            and "No such file or directory" in record.getMessage():
        record.levelno, record.levelname = logging.INFO, "INFO"
    return True
