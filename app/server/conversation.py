"""One chat request, whatever API it came through. Each API translates its body once into a `Chat`
(messages whose parts are text and images, the tools, the tool choice, the reasoning switch, the
template's extra variables, sampling); `chat_prompt` (answer.py) renders only that. The tool rules
(which tools are offered, which call is forced) and the images' decoding are written here once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from app.llama.media import Picture
from app.server.errors import ApiError
from app.server.images import ImageIn, ImageLimits, decode, read
from app.server.schemas import Sampling
from app.server.settings import ServeSettings

Part = str | ImageIn


@dataclass
class Message:
    """One message: its role, its parts in order (text, images), and what a template reads beside
    them (a tool result's call id, an assistant's calls and reasoning, a speaker's name)."""

    role: str
    parts: list[Part] = field(default_factory=list)
    name: str | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict] | None = None  # {"id", "type": "function", "function": {"name", "arguments": dict}}

    @property
    def text(self) -> str:
        return "".join(p for p in self.parts if isinstance(p, str))

    @property
    def images(self) -> list[ImageIn]:
        return [p for p in self.parts if isinstance(p, ImageIn)]


@dataclass(frozen=True)
class ToolChoice:
    """auto (the model decides), none (no tools offered), required (some call), named (that call)."""

    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str | None = None


@dataclass
class Chat:
    messages: list[Message]
    sampling: Sampling
    tools: list[dict] = field(default_factory=list)  # function definitions: name, description, parameters
    tool_choice: ToolChoice = ToolChoice()
    parallel: bool = True
    thinking: bool | None = None
    template_kwargs: dict | None = None

    @property
    def images(self) -> list[ImageIn]:
        return [img for m in self.messages for img in m.images]


def image_limits(settings: ServeSettings) -> ImageLimits:
    return ImageLimits(settings.max_image_bytes, settings.max_image_pixels, settings.allow_image_urls)


def offered_tools(chat: Chat, supports_tools: bool) -> list[dict]:
    """The function definitions the model is offered: none with tool_choice none; a 400 where the
    template has no tool support."""
    if not chat.tools or chat.tool_choice.mode == "none":
        return []
    if not supports_tools:
        raise ApiError(400, "this model's chat template has no tool support: send the request without `tools`", param="tools")
    return chat.tools


def forced_tools(chat: Chat, tools: list[dict]) -> list[dict] | None:
    """required: the answer is a call of one of the tools; named: of that one (a 400 if it is not one)."""
    choice = chat.tool_choice
    if not tools or choice.mode in ("auto", "none"):
        return None
    if choice.mode == "required":
        return tools
    chosen = [t for t in tools if t["name"] == choice.name]
    if not chosen:
        raise ApiError(400, f"tool_choice names {choice.name!r}, which is not among the tools", param="tool_choice")
    return chosen


async def pictures(images: list[ImageIn], limits: ImageLimits, has_vision: bool) -> list[Picture]:
    """A request's images decoded, in order (URLs fetched where allowed); a model without a
    projector refuses the first, naming it."""
    if images and not has_vision:
        raise ApiError(400, f"{images[0].where}: this model has no vision projector: serve it with --mmproj",
                       param=images[0].where, code="image_not_supported")
    return [decode(await read(img, limits), img.where, limits) for img in images]


def template_messages(chat: Chat, marker: str) -> list[dict]:
    """The messages as a chat template reads them: text content, each image as the projector's marker
    where it stood (the projector puts the image's tokens there), calls' arguments as objects."""
    out = []
    for m in chat.messages:
        d: dict = {"role": m.role, "content": "".join(p if isinstance(p, str) else marker for p in m.parts)}
        if m.name:
            d["name"] = m.name
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        if m.reasoning:
            d["reasoning_content"] = m.reasoning
        if m.tool_calls:
            d["tool_calls"] = m.tool_calls
        out.append(d)
    return out
