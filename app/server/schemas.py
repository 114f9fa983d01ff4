"""Request bodies in OpenAI's (and llama.cpp's /infill) shapes. Unknown fields are ignored, as
OpenAI clients expect; wrong types are reported as OpenAI-shaped 400 errors."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_STOP_STRINGS = 16


def _text_is_unicode(value: Any) -> None:
    """Strings must be encodable as UTF-8: JSON's escapes can smuggle in lone surrogates.
    (A loop, not recursion: JSON nested a thousand deep is valid.)"""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("text is not valid Unicode (a lone surrogate escape)") from None
        elif isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)


class StrictBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any) -> Any:
        _text_is_unicode(data)
        return data


class SpeculativeOptions(StrictBody):
    enabled: bool = True
    n_max: int | None = Field(None, ge=0, le=64)
    # false: draft only from this request's own text, not from earlier requests (the suffix index);
    # a benchmark that resends one prompt needs it, or it measures a copy of its own last answer
    cross_request: bool = True


class StreamOptions(StrictBody):
    include_usage: bool = False


class JsonSchemaFormat(StrictBody):
    name: str = "response"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictBody):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # llama.cpp's shorthand with json_object

    def schema_dict(self) -> dict[str, Any] | None:
        return self.json_schema.schema_ if self.json_schema is not None else self.schema_


class Sampling(StrictBody):
    model: str | None = None
    # -1: up to the context (llama.cpp's value); 0: evaluate and cache the prompt, generate nothing
    max_tokens: int | None = Field(None, ge=-1)
    max_completion_tokens: int | None = Field(None, ge=-1)
    n_predict: int | None = Field(None, ge=-1, description="llama.cpp's name for max_tokens")
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repeat_penalty: float = Field(1.0, ge=0.0, le=10.0)
    seed: int | None = Field(None, ge=-1, lt=2**32, description="-1: random (llama.cpp's value)")
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1, description="only n=1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = Field(None, description="chat: true/false; completions: how many alternatives (0-20)")
    top_logprobs: int | None = Field(None, ge=0, le=20)
    speculative: SpeculativeOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    grammar: str | None = Field(None, description="GBNF the output must follow (llama.cpp's extension)")
    ignore_eos: bool = Field(False, description="generate past end-of-generation tokens (llama.cpp's extension)")
    timings_per_token: bool = Field(False, description="each streamed chunk carries the answer's figures so far "
                                    "(llama-server's: tokens, speed, drafted and accepted)")
    return_progress: bool = Field(False, description="a streamed answer reports the prompt's evaluation as it goes "
                                  "(`prompt_progress`, llama.cpp's extension)")

    def budget(self) -> int | None:
        """Tokens to generate as asked: None (up to the context, within the server's cap) or a count (0: none)."""
        for n in (self.max_completion_tokens, self.max_tokens, self.n_predict):
            if n is not None:
                return None if n < 0 else n
        return None

    def n_logprobs(self) -> int | None:
        """How many alternatives per token the answer reports (None: no logprobs)."""
        if self.logprobs is None or self.logprobs is False:
            return None
        if self.logprobs is True:
            return self.top_logprobs or 0
        if not 0 <= self.logprobs <= 20:
            raise ValueError("logprobs must be between 0 and 20")
        return self.logprobs

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class FunctionDef(StrictBody):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(StrictBody):
    type: Literal["function"] = "function"
    function: FunctionDef


class ToolCallFunction(StrictBody):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(StrictBody):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class NamedToolChoiceFunction(StrictBody):
    name: str


class NamedToolChoice(StrictBody):
    type: Literal["function"] = "function"
    function: NamedToolChoiceFunction


class ChatMessage(StrictBody):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an earlier answer's reasoning, sent back (llama-server's, DeepSeek's field)

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.get("text", "") for p in self.content if isinstance(p, dict) and p.get("type") == "text")
        return self.content or ""


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None  # "none": thinking off
    chat_template_kwargs: dict[str, Any] | None = None  # more template variables (enable_thinking), as llama-server


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] = ""
    suffix: str | None = None
    echo: bool = False


class InfillExtra(StrictBody):
    filename: str = ""
    text: str = ""


class InfillRequest(StrictBody):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillExtra] = []
    prompt: str = ""
    n_predict: int | None = Field(None, ge=-1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**32)
    stop: list[str] = []
    stream: bool = False
    speculative: SpeculativeOptions | None = None
