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
import time
from contextlib import aclosing

import trio

from . import tools
from .driver import LLMError, LLMReplyTooLarge, LLMTimeout, TextAccumulator
from .errors import Code, SyscallError
from .process import (
    EXIT_CONTEXT, EXIT_ERROR, EXIT_MAX_COST, EXIT_MAX_STEPS, EXIT_MAX_TIME, EXIT_MAX_TOKENS, EXIT_OK,
    EXIT_REPLY_TOO_BIG,
    EXIT_TERMINATED, EXIT_TIMEOUT, Process,
)
from .ports import StepContext
from .process import Account
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
PLAN_REQUEST = (
    "Before you act, write a short numbered plan for this task (at most 10 steps). "
    "Do not call any tool and do not give the final answer yet."
)
PLAN_GO = "Now carry out your plan."
PLAN_TRACE_CHARS = 4000  # the trace line quotes the plan up to this many characters
# Drivers that take a reasoning effort: the OpenAI request field, claude's --effort.
EFFORT_DRIVERS = ("openai", "claude-cli")
_CODES = {"max_tokens": EXIT_MAX_TOKENS, "max_cost": EXIT_MAX_COST}


class ProcessExit(Exception):
    """Ends the loop with an exit code (and maybe an error)."""

    def __init__(self, code: int, error: SyscallError | None = None):
        super().__init__(code)
        self.code = code
        self.error = error


def outcome(exc: Exception, pid: int) -> tuple[int, SyscallError | None]:
    """The exit code and error of a loop that ended by raising ``exc``; a
    bug is logged and ends the process, never the daemon or the worker."""
    if isinstance(exc, ProcessExit):
        return exc.code, exc.error
    if isinstance(exc, SyscallError):
        return (EXIT_TIMEOUT if exc.code == Code.TIMEOUT else EXIT_ERROR), exc
    log.error("pid %d crashed", pid, exc_info=exc)
    return EXIT_ERROR, SyscallError(Code.INTERNAL, repr(exc)[:300], pid=pid)


def budget_error(proc: Process, what: str, cause: str, code: int) -> ProcessExit:
    err = SyscallError(Code.INVALID, f"{what} exceeded: {cause}", syscall="Step", pid=proc.pid)
    return ProcessExit(code, err)


def over_budget(proc: Process, account: Account, *, strict: bool) -> ProcessExit | None:
    """max_tokens / max_cost of the process or of any ancestor (children draw on them)."""
    over = account.over(strict=strict)
    if over is None:
        return None
    name, owner = over
    if name == "max_tokens":
        spent, limit = f"{owner.tokens} tokens used", owner.max_tokens
    else:
        spent, limit = f"${owner.cost:.6f} spent", f"${owner.max_cost}"
    if owner.pid != proc.pid:
        whose = f" by PID {owner.pid} and its descendants"
    else:
        whose = " by this process and its descendants" if owner.descendants else ""
    return budget_error(proc, name, f"{spent}{whose}, limit {limit}", _CODES[name])


def tool_mode(driver) -> str:
    return getattr(getattr(driver, "cfg", None), "tool_mode", "native")


def driver_type(driver) -> str:
    return getattr(getattr(driver, "cfg", None), "type", "")


def system_message(ctx: StepContext, proc: Process, driver) -> dict:
    """The system prompt for the driver's tool mode (rebuilt after a fallback)."""
    prompt = ctx.system_prompt(proc)
    if tool_mode(driver) == "schema":
        prompt += schema_prompt(proc.allowed_tools)
    return {"role": "system", "content": prompt}


def schema_prompt(allowed: list[str]) -> str:
    names = tools.offered(allowed)
    described = "; ".join(f"{n}({', '.join(tools.SPECS[n][1])}): {tools.SPECS[n][0]}" for n in names)
    return SCHEMA_INSTRUCTIONS.format(tools=described)


class Model:
    """The process's model device: provider, model and the fallbacks left."""

    def __init__(self, ctx: StepContext, proc: Process):
        self.ctx = ctx
        self.proc = proc
        self.provider = proc.active_provider
        self.driver = ctx.driver(self.provider)
        self.fd = 0

    @property
    def device(self) -> str:
        return f"/dev/llm/{self.provider}"

    async def open(self) -> None:
        async with self.ctx.tracer.syscall(self.proc, "Open", f'"{self.device}", O_RDWR',
                                              device=self.device) as call:
            self.fd = self.proc.alloc_fd(self.device)
            call.result = f"FD({self.fd})"

    async def close(self) -> None:
        async with self.ctx.tracer.syscall(self.proc, "Close", f"FD({self.fd})", device=self.device):
            self.proc.fds.pop(self.fd, None)

    async def fall_back(self, err: SyscallError) -> bool:
        """Switch to the fallback model, then the fallback provider.

        Another model of the same provider helps on an outage (timeout, 429,
        5xx, broken connection), not on a refused request (other 4xx); another
        provider helps on both. ``proc.provider``/``proc.model`` stay what the
        spawn chose; ``active_*`` is what answers now."""
        proc = self.proc
        status = getattr(err, "status", None)
        outage = err.code == Code.TIMEOUT or status is None or status == 429 or status >= 500
        if outage and proc.spare_model and proc.spare_model != proc.active_model:
            old, proc.active_model, proc.spare_model = proc.active_model, proc.spare_model, None
            proc.fell_back = True
            self.ctx.tracer.emit(proc, "Fallback", f"model={quote(old or '')} -> {quote(proc.active_model)}",
                                    f"0 ({err.code.value}: {err.cause[:80]})", dur_ms=0)
            return True
        if proc.spare_provider and proc.spare_provider != self.provider:
            try:
                driver = self.ctx.driver(proc.spare_provider)
            except KeyError:
                return False
            old, old_mode = self.provider, tool_mode(self.driver)
            await self.close()
            self.provider, self.driver = proc.spare_provider, driver
            proc.active_provider, proc.spare_provider = self.provider, None
            proc.active_model = getattr(driver, "default_model", None)
            proc.fell_back = True
            self.ctx.tracer.emit(proc, "Fallback", f"provider={old} -> {self.provider}",
                                    f"0 ({err.code.value}: {err.cause[:80]})", dur_ms=0)
            if tool_mode(driver) != old_mode and proc.messages:
                # the tool instructions of the old mode would mislead the new model
                proc.messages[0] = system_message(self.ctx, proc, driver)
                self.ctx.tracer.emit(proc, "Prompt", f"tool_mode={tool_mode(driver)}",
                                        f"{len(proc.messages[0]['content'].encode())} bytes", dur_ms=0)
            warn_effort(self.ctx, proc, self)
            await self.open()
            return True
        return False


def warn_effort(ctx: StepContext, proc: Process, model: Model) -> None:
    """reasoning_effort that the provider cannot take is said, not dropped silently."""
    if proc.reasoning_effort and driver_type(model.driver) not in EFFORT_DRIVERS:
        ctx.tracer.emit(proc, "Warning", quote(
            f"reasoning_effort={proc.reasoning_effort} is not sent: provider {model.provider} "
            f"(type {driver_type(model.driver) or 'unknown'}) takes none", 200), "0", dur_ms=0)


async def run(ctx: StepContext, proc: Process) -> int:
    """Run ``proc`` to completion; returns the exit code (raises ProcessExit)."""
    model = Model(ctx, proc)
    await model.open()
    proc.messages = [system_message(ctx, proc, model.driver), {"role": "user", "content": proc.intent}]
    proc.pinned = 2
    warn_effort(ctx, proc, model)
    try:
        if proc.planning:
            await _planning_step(ctx, proc, model)
        while True:
            await _step_boundary(ctx, proc)
            answer, calls = await _step_with_fallback(ctx, proc, model)
            if calls:
                await _run_tools(ctx, proc, model, calls)
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


async def _planning_step(ctx: StepContext, proc: Process, model: Model) -> None:
    """agent.yaml ``planning: true``: the first step asks for a plan, without
    tools; the plan goes to proc/<pid>/plan and the trace, and stays pinned
    at the head of the conversation."""
    await _step_boundary(ctx, proc)
    proc.messages.append({"role": "user", "content": PLAN_REQUEST})
    text, _ = await _step_with_fallback(ctx, proc, model, planning=True)
    proc.plan = text
    ctx.tracer.emit(proc, "Plan", quote(text, PLAN_TRACE_CHARS), f"{len(text.encode())} bytes", dur_ms=0)
    proc.messages.append({"role": "user", "content": PLAN_GO})
    proc.pinned = len(proc.messages)
    ctx.checkpoint(proc)


async def _run_tools(ctx: StepContext, proc: Process, model: Model, calls: list[dict]) -> None:
    """Run at most ``max_tool_calls`` calls of one step; the others get an error."""
    cap = ctx.limits.max_tool_calls
    for call in calls[:cap]:
        await _run_tool(ctx, proc, model, call)
    if len(calls) > cap:
        err = SyscallError(Code.AGAIN, f"{len(calls) - cap} of {len(calls)} tool calls not run; "
                           f"max_tool_calls is {cap} per step", syscall="Tool", pid=proc.pid)
        ctx.tracer.emit(proc, "Tool", f"{len(calls)} calls", f"-1 {err}", dur_ms=0, error=err)
        for call in calls[cap:]:
            _add_tool_result(proc, call, f"error: not run: {err.cause}")
        ctx.checkpoint(proc)


def _deadline(account: Account) -> float | None:
    return min((a.deadline for a in account.chain() if a.deadline is not None), default=None)


async def _step_boundary(ctx: StepContext, proc: Process) -> None:
    while proc.paused and not proc.term_requested:
        proc.resume_event = trio.Event()
        ctx.tracer.emit(proc, "Pause", "", "0")
        await proc.resume_event.wait()
        ctx.tracer.emit(proc, "Resume", "", "0")
    if proc.term_requested:
        raise ProcessExit(EXIT_TERMINATED)
    b = proc.budget
    if b.max_steps is not None and proc.steps >= b.max_steps:
        raise budget_error(proc, "max_steps", f"{proc.steps} steps done, limit {b.max_steps}", EXIT_MAX_STEPS)
    account = await ctx.account(proc)
    if (exc := over_budget(proc, account, strict=False)) is not None:
        raise exc
    deadline = _deadline(account)
    if deadline is not None and time.monotonic() >= deadline:
        raise budget_error(proc, "max_time", "no wall-clock time left", EXIT_MAX_TIME)
    while proc.pending_input:
        text = proc.pending_input.pop(0)
        proc.messages.append({"role": "user", "content": text})
        ctx.tracer.emit(proc, "Steer", quote(text), "0")
    if b.ctx_size is not None:
        trim_slots(ctx, proc, b.ctx_size)
    if b.context_budget is not None:
        compact(ctx, proc, b.context_budget)


def trim_slots(ctx: StepContext, proc: Process, slots: int) -> None:
    """agent.yaml ``ctx_size``: keep at most ``slots`` messages.

    The pinned head (system prompt, task, plan) and everything from the
    newest assistant message on are kept; between them whole exchanges are
    dropped, those with tool results first, oldest first, and one note
    (itself a slot) says how many went. A call is never separated from its
    results, so the conversation stays valid for every API."""
    msgs = proc.messages
    if len(msgs) <= slots:
        return
    head = proc.pinned
    has_note = proc.slots_dropped > 0
    start = head + (1 if has_note else 0)
    newest = max((i for i in range(start, len(msgs)) if msgs[i].get("role") == "assistant"), default=start)
    groups: list[tuple[int, int]] = []
    i = start
    while i < newest:
        j = i + 1
        if msgs[i].get("role") == "assistant":
            while j < newest and (msgs[j].get("role") == "tool" or j in proc.tool_results):
                j += 1
        groups.append((i, j))
        i = j
    need = len(msgs) - slots + (0 if has_note else 1)
    drop: set[int] = set()
    for a, b in sorted(groups, key=lambda g: (g[1] - g[0] == 1, g[0])):  # tool exchanges first
        if len(drop) >= need:
            break
        drop.update(range(a, b))
    if not drop:
        return
    proc.slots_dropped += len(drop)
    note = {"role": "user", "content": f"[compacted: {proc.slots_dropped} earlier messages were dropped "
                                       f"to keep ctx_size={slots}; the oldest tool results went first]"}
    kept: list[dict] = []
    where: dict[int, int] = {}
    for idx, msg in enumerate(msgs):
        if idx == head:
            kept.append(note)
            if has_note:
                continue  # the old note: replaced
        if idx in drop:
            continue
        where[idx] = len(kept)
        kept.append(msg)
    proc.tool_results = {where[i] for i in proc.tool_results if i in where}
    msgs[:] = kept
    ctx.tracer.emit(proc, "Compact", f"ctx_size={slots}, {len(drop)} messages dropped",
                       f"{len(msgs)} messages", dur_ms=0)


def context_size(messages: list[dict]) -> int:
    """Approximate tokens: a quarter of the JSON bytes (no tokenizer needed)."""
    return len(json.dumps(messages, ensure_ascii=False).encode()) // 4


def compact(ctx: StepContext, proc: Process, budget: int) -> None:
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
            ctx.tracer.emit(proc, "Compact", f"{len(content.encode())} bytes", f"{size} tokens", dur_ms=0)
    if size > budget:
        raise budget_error(proc, "context_budget", f"about {size} tokens after compaction, "
                           f"limit {budget}", EXIT_CONTEXT)


async def _step_with_fallback(ctx: StepContext, proc: Process, model: Model, *, planning: bool = False):
    while True:
        try:
            return await _step(ctx, proc, model, planning=planning)
        except SyscallError as err:
            if err.code == Code.TOO_BIG:  # the reply cap: its own exit code
                raise ProcessExit(EXIT_REPLY_TOO_BIG, err) from None
            if err.code not in (Code.DRIVER, Code.TIMEOUT) or not await model.fall_back(err):
                raise
            proc.steps -= 1  # the step is retried on the fallback, not counted twice


async def _step(ctx: StepContext, proc: Process, model: Model, *, planning: bool = False):
    proc.steps += 1
    tracer = ctx.tracer
    schema = tool_mode(model.driver) == "schema"
    extra: dict = {}
    mcp_tools = [] if planning or ctx.tools is None else await ctx.tools.mcp_specs(proc)
    if planning:
        pass  # a plan is prose: no tools offered, no JSON schema imposed
    elif schema:
        answer = tools.answer_schema(proc.allowed_tools)
        answer["properties"]["tool"]["enum"][-1:-1] = [t["function"]["name"] for t in mcp_tools]
        extra["response_format"] = {"type": "json_schema", "json_schema": {"name": "step", "schema": answer}}
    else:
        extra["tools"] = tools.schemas(proc.allowed_tools) + mcp_tools
    if proc.reasoning_effort and driver_type(model.driver) in EFFORT_DRIVERS:
        extra["reasoning_effort"] = proc.reasoning_effort
    request = json.dumps(proc.messages, ensure_ascii=False).encode()
    async with tracer.syscall(proc, "Write", f"FD({model.fd}), {len(proc.messages)} messages",
                              device=model.device) as call:
        call.result = str(len(request))
    remaining = proc.account.remaining_tokens()  # as ctx.account() last saw it, at the boundary
    if remaining is not None:
        remaining = max(1, remaining)
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
                stream = model.driver.stream_chat(proc.messages, model=proc.active_model,
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
        spent = ctx.price(proc, usage)
        proc.cost += spent
        account = await ctx.charge(proc, usage.prompt_tokens + usage.completion_tokens, spent)
    else:
        account = proc.account  # nothing charged: the chain as the step boundary saw it
    if planning:
        if schema:  # a weak model may still answer in the step JSON
            answer, asked = _parse_schema_reply(text)
            text = answer if answer and not asked else text
        calls = []  # no tools in a planning step: calls asked anyway are not run
        proc.messages.append({"role": "assistant", "content": text})
    elif schema:
        text, calls = _parse_schema_reply(text)
        proc.messages.append({"role": "assistant", "content": json.dumps(
            {"tool": calls[0]["function"]["name"], "arguments": calls[0]["arguments"]}, ensure_ascii=False)
            if calls else text})
    elif calls:
        proc.messages.append({"role": "assistant", "content": text or None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": c["function"]} for c in calls]})
    else:
        proc.messages.append({"role": "assistant", "content": text})
    ctx.checkpoint(proc)
    if (exc := over_budget(proc, account, strict=True)) is not None:
        proc.result = text
        raise exc
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


async def _run_tool(ctx: StepContext, proc: Process, model: Model, call: dict) -> None:
    name = call["function"]["name"]
    raw = call["function"]["arguments"] or "{}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError:
        args = None
    if args is None or not isinstance(args, dict):
        err = SyscallError(Code.INVALID, f"arguments of {name[:40]} are not a JSON object",
                           syscall="Tool", pid=proc.pid)
        ctx.tracer.emit(proc, "Tool", quote(name), f"-1 {err}", dur_ms=0, error=err)
        result = f"error: {err.cause}"
    elif ctx.tools is None:
        result = "error: this kernel has no tools"
    else:
        result = await ctx.tools.call(proc, name, args)
    _add_tool_result(proc, call, result)
    ctx.checkpoint(proc)


def _add_tool_result(proc: Process, call: dict, result: str) -> None:
    name = call["function"]["name"]
    if call.get("id") == "schema-call":
        proc.tool_results.add(len(proc.messages))  # schema mode: a user message, compactable
        proc.messages.append({"role": "user", "content": f"Result of {name}:\n{result}"})
    else:
        proc.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
