"""The reasoning loop of one process.

BuildPrompt → Write (the conversation to the model device) → Read (its
streamed reply) → Parse → a final text, or tool calls executed through the
devices → append to the context → repeat. Every step is traced syscalls;
budgets are checked between steps with real token counts from the server.

Two ways to ask for tools: "native" OpenAI function calling, and "schema"
for weak models (the embedded one): the reply is JSON constrained by
``response_format`` to ``{"tool": <name or "answer">, "arguments": {...}}``.
"""
from __future__ import annotations

import json
import logging
from contextlib import aclosing

import trio

from ..devices.llm.base import LLMError, LLMReplyTooLarge, LLMTimeout, TextAccumulator
from . import tools as T
from .errors import Code, SyscallError
from .process import (
    EXIT_CONTEXT, EXIT_MAX_COST, EXIT_MAX_STEPS, EXIT_MAX_TOKENS, EXIT_OK, EXIT_REPLY_TOO_BIG,
    EXIT_TERMINATED, Process,
)
from .trace import quote

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant running as a process in rnixfs. "
    "Answer the user's request directly and concisely."
)
SCHEMA_INSTRUCTIONS = (
    "\n\nReply with one JSON object and nothing else: "
    '{{"tool": NAME, "arguments": {{...}}}}. Tools: {tools}. '
    'To give your final answer use {{"tool": "answer", "arguments": {{"text": "..."}}}}.'
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


def tool_mode(driver) -> str:
    return getattr(getattr(driver, "cfg", None), "tool_mode", "native")


def schema_prompt(allowed: list[str]) -> str:
    names = T.offered(allowed)
    described = "; ".join(f"{n}({', '.join(T.SPECS[n][1])}): {T.SPECS[n][0]}" for n in names)
    return SCHEMA_INSTRUCTIONS.format(tools=described)


class Model:
    """The process's model device: provider, model and the fallbacks left."""

    def __init__(self, kernel, proc: Process):
        self.kernel = kernel
        self.proc = proc
        self.provider = proc.provider
        self.driver = kernel.providers.get(proc.provider)
        self.fd = 0

    @property
    def device(self) -> str:
        return f"/dev/llm/{self.provider}"

    async def open(self) -> None:
        async with self.kernel.tracer.syscall(self.proc, "Open", f'"{self.device}", O_RDWR',
                                              device=self.device) as call:
            self.fd = self.proc.alloc_fd(self.device)
            call.result = f"FD({self.fd})"

    async def close(self) -> None:
        async with self.kernel.tracer.syscall(self.proc, "Close", f"FD({self.fd})", device=self.device):
            self.proc.fds.pop(self.fd, None)

    async def fall_back(self, err: SyscallError) -> bool:
        """Switch to the fallback model, then the fallback provider.

        Another model of the same provider helps on an outage (timeout, 429,
        5xx, broken connection), not on a refused request (other 4xx); another
        provider helps on both."""
        proc = self.proc
        status = getattr(err, "status", None)
        outage = err.code == Code.TIMEOUT or status is None or status == 429 or status >= 500
        if outage and proc.fallback_model and proc.fallback_model != proc.model:
            old, proc.model, proc.fallback_model = proc.model, proc.fallback_model, None
            self.kernel.tracer.emit(proc, "Fallback", f"model={quote(old or '')} -> {quote(proc.model)}",
                                    f"0 ({err.code.value}: {err.cause[:80]})", dur_ms=0)
            return True
        if proc.fallback_provider and proc.fallback_provider != self.provider:
            try:
                driver = self.kernel.providers.get(proc.fallback_provider)
            except KeyError:
                return False
            old = self.provider
            await self.close()
            self.provider, self.driver = proc.fallback_provider, driver
            proc.provider, proc.fallback_provider = self.provider, None
            proc.model = getattr(driver, "default_model", None)
            self.kernel.tracer.emit(proc, "Fallback", f"provider={old} -> {self.provider}",
                                    f"0 ({err.code.value}: {err.cause[:80]})", dur_ms=0)
            await self.open()
            return True
        return False


async def run(kernel, proc: Process) -> int:
    """Run ``proc`` to completion; returns the exit code (raises ProcessExit)."""
    model = Model(kernel, proc)
    await model.open()
    prompt = kernel.system_prompt(proc)
    if tool_mode(model.driver) == "schema":
        prompt += schema_prompt(proc.allowed_tools)
    proc.messages = [{"role": "system", "content": prompt}, {"role": "user", "content": proc.intent}]
    try:
        while True:
            await _step_boundary(kernel, proc)
            answer, calls = await _step_with_fallback(kernel, proc, model)
            if calls:
                for call in calls:
                    await _run_tool(kernel, proc, model, call)
                if proc.term_requested:
                    raise ProcessExit(EXIT_TERMINATED)
                continue
            if proc.term_requested:
                proc.result = answer
                raise ProcessExit(EXIT_TERMINATED)
            if proc.pending_input:
                continue  # steered mid-step: the model must see the new input
            proc.result = answer
            return EXIT_OK
    finally:
        with trio.CancelScope(shield=True):
            await model.close()


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
    if b.context_budget is not None:
        compact(kernel, proc, b.context_budget)


def context_size(messages: list[dict]) -> int:
    """Approximate tokens: a quarter of the JSON bytes (no tokenizer needed)."""
    return len(json.dumps(messages, ensure_ascii=False).encode()) // 4


def compact(kernel, proc: Process, budget: int) -> None:
    """Shrink the oldest tool results first; the system prompt is never cut."""
    size = context_size(proc.messages)
    if size <= budget:
        return
    for i, msg in enumerate(proc.messages[:-1]):
        if size <= budget:
            break
        if msg.get("role") == "tool" or i in proc.tool_results:
            content = msg.get("content") or ""
            if content.startswith("[compacted") or len(content) < 200:
                continue  # already small: a note would not save anything
            note = f"[compacted: {len(content.encode())} bytes of an earlier tool result]"
            msg["content"] = note
            size = context_size(proc.messages)
            kernel.tracer.emit(proc, "Compact", f"{len(content.encode())} bytes", f"{size} tokens", dur_ms=0)
    if size > budget:
        raise budget_error(proc, "context_budget", f"about {size} tokens after compaction, "
                           f"limit {budget}", EXIT_CONTEXT)


async def _step_with_fallback(kernel, proc: Process, model: Model):
    while True:
        try:
            return await _step(kernel, proc, model)
        except SyscallError as err:
            if err.code == Code.TOO_BIG:  # the reply cap: its own exit code
                raise ProcessExit(EXIT_REPLY_TOO_BIG, err) from None
            if err.code not in (Code.DRIVER, Code.TIMEOUT) or not await model.fall_back(err):
                raise
            proc.steps -= 1  # the step is retried on the fallback, not counted twice


async def _step(kernel, proc: Process, model: Model):
    proc.steps += 1
    tracer = kernel.tracer
    schema = tool_mode(model.driver) == "schema"
    extra: dict = {}
    if schema:
        extra["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "step", "schema": T.answer_schema(proc.allowed_tools)}}
    else:
        extra["tools"] = T.schemas(proc.allowed_tools)
    request = json.dumps(proc.messages, ensure_ascii=False).encode()
    async with tracer.syscall(proc, "Write", f"FD({model.fd}), {len(proc.messages)} messages",
                              device=model.device) as call:
        call.result = str(len(request))
    remaining = None
    if proc.budget.max_tokens is not None:
        remaining = max(1, proc.budget.max_tokens - proc.tokens_in - proc.tokens_out)
    timeout = proc.budget.step_timeout or float("inf")
    parts = TextAccumulator()  # compact however small the deltas
    deltas: dict[int, dict] = {}
    usage = None
    async with tracer.syscall(proc, "Read", f"FD({model.fd})", device=model.device) as call:
        try:
            # step_timeout is a heartbeat: every chunk that arrives renews it
            with trio.fail_after(timeout) as heartbeat:
                # drivers that run their own tools (claude-cli) are bounded by the grants
                bound = {"grants": proc.allowed_tools} if getattr(model.driver, "takes_grants", False) else {}
                stream = model.driver.stream_chat(proc.messages, model=proc.model,
                                                  max_tokens=remaining, extra=extra, **bound)
                async with aclosing(stream):  # a cancelled step closes its HTTP stream now
                    async for chunk in stream:
                        heartbeat.deadline = trio.current_time() + timeout
                        if chunk.text:
                            parts.append(chunk.text)
                        for d in chunk.tool_calls:
                            _merge(deltas, d)
                        if chunk.usage is not None:
                            usage = chunk.usage
        except trio.TooSlowError:
            raise SyscallError(Code.TIMEOUT, f"no reply for step_timeout of {timeout:g}s") from None
        except LLMTimeout as exc:
            raise SyscallError(Code.TIMEOUT, exc.cause) from None
        except LLMReplyTooLarge as exc:
            raise SyscallError(Code.TOO_BIG, exc.cause) from None
        except LLMError as exc:
            err = SyscallError(Code.DRIVER, exc.cause)
            err.status = exc.status  # lets the fallback tell a bad request from an outage
            raise err from None
        text = parts.text()
        parts.clear()
        calls = [_joined(deltas[i]) for i in sorted(deltas)]
        call.result = f"{len(text.encode())} bytes" + (f", {len(calls)} tool calls" if calls else "")
    if usage is not None:
        proc.tokens_in += usage.prompt_tokens
        proc.tokens_out += usage.completion_tokens
        proc.cost += kernel.price(proc, usage)
    if schema:
        text, calls = _parse_schema_reply(text)
        proc.messages.append({"role": "assistant", "content": json.dumps(
            {"tool": calls[0]["function"]["name"], "arguments": calls[0]["arguments"]}, ensure_ascii=False)
            if calls else text})
    elif calls:
        proc.messages.append({"role": "assistant", "content": text or None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": c["function"]} for c in calls]})
    else:
        proc.messages.append({"role": "assistant", "content": text})
    kernel.checkpoint(proc)
    b = proc.budget
    used = proc.tokens_in + proc.tokens_out
    if b.max_tokens is not None and used > b.max_tokens:
        proc.result = text
        raise budget_error(proc, "max_tokens", f"{used} tokens used, limit {b.max_tokens}", EXIT_MAX_TOKENS)
    if b.max_cost is not None and proc.cost > b.max_cost:
        proc.result = text
        raise budget_error(proc, "max_cost", f"${proc.cost:.4f} spent, limit ${b.max_cost}", EXIT_MAX_COST)
    return text, calls


def _merge(deltas: dict[int, dict], d: dict) -> None:
    """Assemble OpenAI tool-call deltas by index (pieces joined once, at the
    end: appending to a string in a dict copies it, quadratic in the reply)."""
    i = d.get("index", 0)
    call = deltas.setdefault(i, {"id": "", "name": TextAccumulator(), "arguments": TextAccumulator()})
    if d.get("id"):
        call["id"] = d["id"]
    fn = d.get("function") or {}
    if fn.get("name"):
        call["name"].append(fn["name"])
    if fn.get("arguments"):
        call["arguments"].append(fn["arguments"])


def _joined(call: dict) -> dict:
    return {"id": call["id"], "function": {"name": call["name"].text(),
                                           "arguments": call["arguments"].text()}}


def _parse_schema_reply(text: str) -> tuple[str, list[dict]]:
    """A schema-mode reply → (final text, []) or ("", [one call])."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text, []
    if not isinstance(obj, dict) or not isinstance(obj.get("tool"), str):
        return text, []
    args = obj.get("arguments") if isinstance(obj.get("arguments"), dict) else {}
    if obj["tool"] == "answer":
        answer = args.get("text")
        return (answer if isinstance(answer, str) else json.dumps(args, ensure_ascii=False)), []
    return "", [{"id": "schema-call", "arguments": args,
                 "function": {"name": obj["tool"], "arguments": json.dumps(args, ensure_ascii=False)}}]


async def _run_tool(kernel, proc: Process, model: Model, call: dict) -> None:
    name = call["function"]["name"]
    raw = call["function"]["arguments"] or "{}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError:
        args = None
    if args is None or not isinstance(args, dict):
        err = SyscallError(Code.INVALID, f"arguments of {name[:40]} are not a JSON object",
                           syscall="Tool", pid=proc.pid)
        kernel.tracer.emit(proc, "Tool", quote(name), f"-1 {err}", dur_ms=0, error=err)
        result = f"error: {err.cause}"
    elif kernel.tools is None:
        result = "error: this kernel has no tools"
    else:
        result = await kernel.tools.call(proc, name, args)
    if call.get("id") == "schema-call":
        proc.tool_results.add(len(proc.messages))  # schema mode: a user message, compactable
        proc.messages.append({"role": "user", "content": f"Result of {name}:\n{result}"})
    else:
        proc.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    kernel.checkpoint(proc)
