"""The reasoning loop of one process (text answers; tools come later).

Each step: pick up steering input, Write the conversation to the model
device, Read its streamed reply; every one is a traced syscall. Budgets are
checked between steps with real token counts from the server's usage.
"""
from __future__ import annotations

import json
import logging
from contextlib import aclosing

import trio

from ..devices.llm.base import LLMError, LLMTimeout
from .errors import Code, SyscallError
from .trace import quote
from .process import (
    EXIT_MAX_COST, EXIT_MAX_STEPS, EXIT_MAX_TOKENS, EXIT_OK, EXIT_TERMINATED,
    EXIT_TIMEOUT, Process,
)

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant running as a process in rnixfs. "
    "Answer the user's request directly and concisely."
)


class ProcessExit(Exception):
    """Ends the loop with an exit code (and maybe an error)."""

    def __init__(self, code: int, error: SyscallError | None = None):
        super().__init__(code)
        self.code = code
        self.error = error


def budget_error(proc: Process, what: str, cause: str, code: int) -> ProcessExit:
    err = SyscallError(Code.INVALID, f"{what} exceeded: {cause}", syscall="Step", pid=proc.pid)
    return ProcessExit(code, err)


async def run(kernel, proc: Process) -> int:
    """Run ``proc`` to completion; returns the exit code (raises ProcessExit)."""
    provider = kernel.providers.get(proc.provider)
    device = f"/dev/llm/{proc.provider}"
    tracer = kernel.tracer
    async with tracer.syscall(proc, "Open", f'"{device}", O_RDWR', device=device) as call:
        fd = proc.alloc_fd(device)
        call.result = f"FD({fd})"
    proc.messages = [
        {"role": "system", "content": kernel.system_prompt(proc)},
        {"role": "user", "content": proc.intent},
    ]
    try:
        while True:
            await _step_boundary(kernel, proc)
            answer = await _step(kernel, proc, provider, fd, device)
            if proc.term_requested:
                proc.result = answer
                raise ProcessExit(EXIT_TERMINATED)
            if proc.pending_input:
                continue  # steered mid-step: the model must see the new input
            proc.result = answer
            return EXIT_OK
    finally:
        with trio.CancelScope(shield=True):
            async with tracer.syscall(proc, "Close", f"FD({fd})", device=device):
                proc.fds.pop(fd, None)


async def _step_boundary(kernel, proc: Process) -> None:
    while proc.paused and not proc.term_requested:
        proc.resume_event = trio.Event()
        kernel.tracer.emit(proc, "Pause", "", "0")
        await proc.resume_event.wait()
        kernel.tracer.emit(proc, "Resume", "", "0")
    if proc.term_requested:
        raise ProcessExit(EXIT_TERMINATED)
    b = proc.budget
    if b.max_steps is not None and proc.steps >= b.max_steps:
        raise budget_error(proc, "max_steps", f"{proc.steps} steps done, limit {b.max_steps}", EXIT_MAX_STEPS)
    used = proc.tokens_in + proc.tokens_out
    if b.max_tokens is not None and used >= b.max_tokens:
        raise budget_error(proc, "max_tokens", f"{used} tokens used, limit {b.max_tokens}", EXIT_MAX_TOKENS)
    if b.max_cost is not None and proc.cost >= b.max_cost:
        raise budget_error(proc, "max_cost", f"${proc.cost:.4f} spent, limit ${b.max_cost}", EXIT_MAX_COST)
    while proc.pending_input:
        text = proc.pending_input.pop(0)
        proc.messages.append({"role": "user", "content": text})
        kernel.tracer.emit(proc, "Steer", quote(text), "0")


async def _step(kernel, proc: Process, provider, fd: int, device: str) -> str:
    proc.steps += 1
    tracer = kernel.tracer
    request = json.dumps(proc.messages, ensure_ascii=False).encode()
    async with tracer.syscall(proc, "Write", f"FD({fd}), {len(proc.messages)} messages", device=device) as call:
        call.result = str(len(request))
    remaining = None
    if proc.budget.max_tokens is not None:
        remaining = max(1, proc.budget.max_tokens - proc.tokens_in - proc.tokens_out)
    timeout = proc.budget.step_timeout or float("inf")
    parts: list[str] = []
    usage = None
    async with tracer.syscall(proc, "Read", f"FD({fd})", device=device) as call:
        try:
            with trio.fail_after(timeout):
                stream = provider.stream_chat(proc.messages, model=proc.model, max_tokens=remaining)
                async with aclosing(stream):  # a cancelled step closes its HTTP stream now
                    async for chunk in stream:
                        if chunk.text:
                            parts.append(chunk.text)
                        if chunk.usage is not None:
                            usage = chunk.usage
        except trio.TooSlowError:
            raise SyscallError(Code.TIMEOUT, f"step_timeout of {timeout:g}s exceeded") from None
        except LLMTimeout as exc:
            raise SyscallError(Code.TIMEOUT, exc.cause) from None
        except LLMError as exc:
            raise SyscallError(Code.DRIVER, exc.cause) from None
        answer = "".join(parts)
        call.result = f"{len(answer.encode())} bytes"
    if usage is not None:
        proc.tokens_in += usage.prompt_tokens
        proc.tokens_out += usage.completion_tokens
        proc.cost += kernel.price(proc, usage)
    proc.messages.append({"role": "assistant", "content": answer})
    kernel.checkpoint(proc)
    b = proc.budget
    used = proc.tokens_in + proc.tokens_out
    if b.max_tokens is not None and used > b.max_tokens:
        proc.result = answer
        raise budget_error(proc, "max_tokens", f"{used} tokens used, limit {b.max_tokens}", EXIT_MAX_TOKENS)
    if b.max_cost is not None and proc.cost > b.max_cost:
        proc.result = answer
        raise budget_error(proc, "max_cost", f"${proc.cost:.4f} spent, limit ${b.max_cost}", EXIT_MAX_COST)
    return answer


def timeout_exit(err: SyscallError) -> int:
    return EXIT_TIMEOUT if err.code == Code.TIMEOUT else 1
