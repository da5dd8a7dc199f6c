"""The contract between the kernel and every LLM driver.

Defined in rnixfs/kernel/driver.py (the loop depends on it, and the kernel
never imports devices); re-exported here for the drivers.
"""
from __future__ import annotations

from ...kernel.driver import (  # noqa: F401  (re-exported)
    MAX_USAGE_TOKENS, ChatChunk, LLMError, LLMReplyTooLarge, LLMTimeout, ModelDriver, TextAccumulator,
    Usage,
)

Provider = ModelDriver  # the drivers' name for it
