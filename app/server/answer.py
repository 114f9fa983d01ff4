"""One path from the engine's events to an API's answer. A chat request's prompt is rendered once
(`chat_prompt`: the template, tools written in by formats that need it, the tool-call grammar in the
model's own format); its answer is followed once (`Answer`): stop strings, whole UTF-8 characters,
reasoning and tool calls split by the chat format, cancellation, failures. The API modules only
format the typed deltas and the final record this yields."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import Request

from app.chat.format import Call
from app.chat.grammar import call_grammar
from app.chat.stream import CallArguments, CallEnd, CallStart, ChatStream, Delta, Parsed, ReasoningDelta, TextDelta
from app.engine.records import RequestRecord, StepRecord
from app.errors import SpecdeckError
from app.llama.media import Picture
from app.server.conversation import Chat, forced_tools, image_limits, offered_tools, pictures, template_messages
from app.server.core import FINISH, Service, failed_error, stopping_error
from app.server.errors import ApiError
from app.server.scheduler import Done, Failed, Job, Progress
from app.server.settings import ServeSettings
from app.server.textstream import TextStream


@dataclass
class Final:
    """The end of an answer. `finish`: stop, length, tool_calls, or abort (the server stopped)."""

    record: RequestRecord
    parsed: Parsed
    finish: str
    stopped_by: str | None = None


@dataclass
class Failure:
    """The job failed (its status and message, as the scheduler said)."""

    status: int
    message: str

    def error(self) -> ApiError:
        return failed_error(Failed(self.message, self.status))


@dataclass
class ChatPrompt:
    """A chat request made ready: its token ids, the tools offered, whether the prompt opened the
    reasoning block, and the grammar (with its triggers when lazy) its output must follow."""

    ids: list[int]
    tools: list[dict]
    started: bool = False
    grammar: str | None = None
    triggers: tuple[str, ...] = ()
    pictures: dict[int, Picture] = field(default_factory=dict)  # the prompt's images by key (media ids in `ids`)

    def stream(self, service: Service) -> ChatStream:
        return ChatStream(service.chat, self.tools, self.started)


def render_prompt(service: Service, messages: list[dict], tools: list[dict], thinking: bool | None = None,
                  extra: dict | None = None, pictures: Sequence[Picture] = ()) -> tuple[list[int], bool]:
    """Messages through the model's chat template (tools written in where the format needs it). An
    assistant message last is continued (prefill): the rest is rendered with the generation prompt
    and its text follows unclosed. `pictures`: the images whose markers the messages carry, in order
    (the projector tokenizes the text around them). Returns the ids and whether the prompt opened
    the reasoning."""
    tok, spec = service.tokenizer, service.chat
    prefill = messages[-1]["role"] == "assistant" if messages else False
    if prefill and messages[-1].get("tool_calls"):
        raise ApiError(400, "a final assistant message with tool calls cannot be continued", param="messages")
    head = messages[:-1] if prefill else messages
    thinking = service.thinking_default if thinking is None else thinking
    native = spec.tools is None or spec.tools.native
    if tools and not native:
        head = spec.tools.render_tools(head, tools)
    offered = [{"type": "function", "function": t} for t in tools] if native else []
    try:
        text = _render(tok, head, offered, thinking, extra)
    except SpecdeckError as e:
        raise ApiError(400, e.message) from None
    except Exception as e:  # noqa: BLE001 - a template that cannot render these messages
        raise ApiError(400, f"cannot render these messages with the model's chat template: {e}") from None
    started = spec.reasoning is not None and spec.reasoning.opened_by(text)
    ids = _tokens(service, text, pictures)
    if prefill and messages[-1].get("content"):
        ids += tok.encode(messages[-1]["content"], add_special=False, parse_special=False)
        started = False  # the continued text decides; it is parsed as the model's own
    return ids, started


def _tokens(service: Service, text: str, pictures: Sequence[Picture]) -> list[int]:
    """The rendered prompt's ids; with pictures, through the projector (their media ids where the
    markers stand)."""
    tok = service.tokenizer
    if not pictures:
        return tok.prompt_tokens(text)
    try:
        return service.vision.tokenize(text, list(pictures), add_special=tok.wants_bos(text))
    except SpecdeckError as e:
        raise ApiError(400, e.message, code="invalid_image") from None


def _render(tok, messages: list[dict], tools: list[dict], thinking: bool | None, extra: dict | None) -> str:
    """The template's rendering; a template that takes system messages only at the start (Qwen3.5's)
    gets the later ones (Codex's developer messages, Claude Code's reminders) joined to the first."""
    try:
        return tok.render_chat(messages, tools, thinking, extra=extra)
    except Exception:
        merged = leading_system(messages)
        if merged == messages:
            raise
        return tok.render_chat(merged, tools, thinking, extra=extra)


def leading_system(messages: list[dict]) -> list[dict]:
    """The messages with every system message's text joined, in order, into one system message first."""
    system = [m for m in messages if m.get("role") == "system"]
    if not system or (len(system) == 1 and messages[0].get("role") == "system"):
        return messages
    text = "\n\n".join(str(m.get("content") or "") for m in system)
    return [{"role": "system", "content": text}] + [m for m in messages if m.get("role") != "system"]


async def chat_prompt(service: Service, settings: ServeSettings, chat: Chat) -> ChatPrompt:
    """Render one chat request (any API's): its images decoded, the tools it offers; with tools, the
    grammar of a call in the model's own format: forced (tool_choice required or named) or lazy (free
    text until the format's opening)."""
    tools = offered_tools(chat, service.supports_tools)
    forced = forced_tools(chat, tools)
    pics = await pictures(chat.images, image_limits(settings), service.vision is not None)
    marker = service.vision.marker if service.vision is not None else ""
    ids, started = render_prompt(service, template_messages(chat, marker), tools, chat.thinking,
                                 chat.template_kwargs, pics)
    prompt = ChatPrompt(ids, tools, started, pictures={p.key: p for p in pics})
    return _with_call_grammar(service, prompt, forced, chat.parallel)


def _with_call_grammar(service: Service, prompt: ChatPrompt, forced: list[dict] | None, parallel: bool) -> ChatPrompt:
    tools, started = prompt.tools, prompt.started
    spec = service.chat
    if not tools or spec.tools is None or not spec.tools.opening:
        if forced:
            raise ApiError(400, "tool calls in this model's chat format are not parsed, so a call cannot be "
                                "required: send tool_choice auto", param="tool_choice")
        return prompt
    try:
        g = call_grammar(spec, forced or tools, forced=bool(forced), parallel=parallel, started=started)
        service.check_grammar(g.gbnf, g.triggers)
    except SpecdeckError as e:
        if forced:
            raise ApiError(400, e.message, param="tool_choice") from None
        return prompt  # no lazy grammar for these tools: calls are still parsed, just not constrained
    prompt.grammar, prompt.triggers = g.gbnf, g.triggers
    return prompt


SSE_KEEP_ALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it, their idle timers restart


@dataclass
class Idle:
    """Nothing new for --keep-alive seconds (the prompt is still being read): a stream sends a
    keep-alive, so no client's idle watchdog takes the wait for a dead server."""


async def events(request: Request, job: Job, keep_alive: float | None = None) -> AsyncIterator:
    """The job's events (and `Idle` after `keep_alive` quiet seconds); if the client goes away, the
    job is cancelled (its slot freed at once)."""
    quiet_since = checked = time.monotonic()
    ended = False
    try:
        while True:
            try:
                event = await asyncio.wait_for(job.events.get(), timeout=1.0)
            except asyncio.TimeoutError:
                event = None
            if time.monotonic() - checked >= 1.0:  # asked once a second, however busy the stream
                checked = time.monotonic()
                if await request.is_disconnected():
                    return
            if event is None:
                if keep_alive is not None and time.monotonic() - quiet_since >= keep_alive:
                    quiet_since = time.monotonic()
                    yield Idle()
                continue
            quiet_since = time.monotonic()
            ended = isinstance(event, (Done, Failed))
            yield event
            if ended:
                return
    finally:
        if not ended:  # the client went away (or the consumer stopped early): free the slot, say when
            job.cancel()
            if job.usage is not None and not job.usage.gone:  # the access-log line says where
                job.usage.gone = job.whereabouts()


class Answer:
    """A job's answer as typed deltas (`stream`) or whole (`whole`). `chat`: the chat format's parser
    (None: raw text, as completions). `every_step`: a text delta per engine step, even an empty one
    (llama-server's /completion sends each step's tokens)."""

    def __init__(self, service: Service, job: Job, stops: list[str], chat: ChatStream | None = None,
                 every_step: bool = False, live: bool = False) -> None:
        self.job = job
        self.text = TextStream(service.piece, stops + list(chat.spec.stops) if chat is not None else stops)
        self.chat = chat
        self.every_step = every_step
        self.step_tokens: list[int] = []  # the last step's tokens
        # the steps streamed so far, kept only where the client asked for live figures (timings_per_token)
        self.so_far = RequestRecord(prompt_tokens=0) if live else None
        self.t_first: float | None = None  # when the first step came
        self._logprobs: list = []  # log-probabilities of tokens whose text has not gone out
        self._raw: list[str] = []

    def take_logprobs(self) -> list:
        out, self._logprobs = self._logprobs, []
        return out

    def _feed(self, piece: str) -> list[Delta]:
        if self.chat is not None:
            deltas = self.chat.push(piece)
            if self.chat.repeating:  # the same call again: a loop, not an answer; it ends here
                self.job.cancel()
            return deltas
        self._raw.append(piece)
        return [TextDelta(piece)] if piece or self.every_step else []

    def _finish(self, rec: RequestRecord) -> tuple[list[Delta], Final]:
        self.step_tokens = []  # what is flushed now came with earlier steps' tokens
        deltas = self._feed(self.text.flush())
        if self.chat is not None:
            more, parsed = self.chat.finish()
            deltas += more
        else:
            parsed = Parsed(content="".join(self._raw))
            deltas = [d for d in deltas if d.text]
        if rec.finish_reason == "shutdown":
            finish = "abort"
        elif parsed.calls:
            finish = "tool_calls"
        elif self.text.stopped:
            finish = "stop"
        else:
            finish = FINISH.get(rec.finish_reason or "stop", "stop")
        return deltas, Final(rec, parsed, finish, self.text.stopped_by)

    async def stream(self, request: Request, keep_alive: float | None = None
                     ) -> AsyncIterator[Delta | Final | Failure | Idle | Progress]:
        """Deltas as the answer grows, then a Final (or a Failure); `Idle` after `keep_alive` quiet
        seconds (a stream's cue for a keep-alive), and the prompt's `Progress` where the job asked for
        it. Ends without a Final when the client went away (the job is cancelled)."""
        async for event in events(request, self.job, keep_alive):
            if isinstance(event, (Idle, Progress)):
                yield event
            elif isinstance(event, StepRecord):
                self._logprobs += event.logprobs or []
                self.step_tokens = event.tokens
                if self.so_far is not None:
                    self.so_far.add(event)
                    self.t_first = self.t_first or time.monotonic()
                piece = self.text.push(event.tokens)
                if self.text.stopped:
                    self.job.cancel()
                for d in self._feed(piece):
                    yield d
            elif isinstance(event, Failed):
                yield Failure(event.status, event.message)
                return
            elif isinstance(event, Done):
                rec = event.record
                if self.job.quiet:  # no steps were sent: the whole answer at once
                    self._logprobs += rec.logprobs
                    for d in self._feed(self.text.push(rec.completion)):
                        yield d
                deltas, final = self._finish(rec)
                for d in deltas:
                    yield d
                yield final
                return

    def live_timings(self) -> dict:
        """llama-server's `timings_per_token`: the answer's figures so far (generation speed after
        the first token, drafted and accepted tokens, tokens per target decode)."""
        r, ms = self.so_far, (time.monotonic() - self.t_first) * 1e3 if self.t_first else 0.0
        n = len(r.completion)
        return {"predicted_n": n, "predicted_ms": ms, "predicted_per_second": (n - len(r.completion[:1])) / ms * 1e3 if ms > 0 else None,
                "draft_n": r.drafted, "draft_n_accepted": r.accepted, "tokens_per_step": r.tokens_per_decode}

    async def whole(self, request: Request) -> Final:
        """The whole answer; a failure is raised as its API error, a stop as 503, a client gone as 499."""
        async for item in self.stream(request):
            if isinstance(item, Failure):
                raise item.error()
            if isinstance(item, Final):
                if item.finish == "abort":  # cut short by a stop: the part generated is no answer
                    raise stopping_error()
                return item
        raise ApiError(499, "client closed the request")


class DeltaSink(Protocol):
    """An API's stream writer: the events for each kind of delta."""

    def reasoning(self, text: str) -> list[bytes]: ...

    def text(self, text: str) -> list[bytes]: ...

    def call(self, call: Call) -> list[bytes]: ...


def delta_events(item, sink: DeltaSink) -> list[bytes] | None:
    """A reasoning, text or finished-call delta as the sink's events; None for anything else (the
    start and argument deltas of a call, which sinks that send a call whole do not need, give [])."""
    if isinstance(item, ReasoningDelta):
        return sink.reasoning(item.text)
    if isinstance(item, TextDelta):
        return sink.text(item.text)
    if isinstance(item, CallEnd):
        return sink.call(item.call)
    if isinstance(item, (CallStart, CallArguments)):
        return []
    return None


def thinking_of(effort: str | None, kwargs: dict | None) -> bool | None:
    """llama-server's request controls of a template's thinking switch: `chat_template_kwargs`'
    enable_thinking first, then `reasoning_effort` (`none` off, any other level on)."""
    if isinstance(kwargs, dict) and isinstance(kwargs.get("enable_thinking"), bool):
        return kwargs["enable_thinking"]
    if effort is None:
        return None
    return effort != "none"
