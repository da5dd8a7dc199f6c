# ---------------------------------------------------------------------------
# scripted OpenAI-compatible server (owner: LLM drivers; see scripted_server.py)
# Self-contained block: keep it at the top; add other fixtures below it.
# ---------------------------------------------------------------------------
import sys as _sys
from pathlib import Path as _Path

import pytest

_ROOT = str(_Path(__file__).resolve().parent.parent)
if _ROOT not in _sys.path:  # so `tests.scripted_server` imports under plain `pytest`
    _sys.path.insert(0, _ROOT)

from tests.scripted_server import ScriptedServer  # noqa: E402


@pytest.fixture
def scripted_server(request) -> ScriptedServer:
    """A fresh ScriptedServer on 127.0.0.1 (port 0); `.url` is the /v1 base."""
    server = ScriptedServer().start()
    request.addfinalizer(server.stop)
    return server
# ---------------------------------------------------------------------------
# end of scripted-server block
# ---------------------------------------------------------------------------

from tests.mountutil import mnt, mount_factory  # noqa: E402,F401  (real-mount fixtures)
from tests.logcheck import _check_logs  # noqa: E402,F401  (unexpected warnings fail a test)
