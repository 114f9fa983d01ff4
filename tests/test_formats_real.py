"""The flagship format end to end on the CPU pair: `specdeck serve --chat-template-file` with the
Qwen3.5 template (Qwen3.6's: XML tool calls, <think> reasoning) over Qwen2.5-Coder 1.5B/0.5B. A
forced call comes back parsed, its arguments typed by the schema, on all four chat APIs, streamed
and not; with thinking on, reasoning comes apart and no <think> markup reaches the content."""

from __future__ import annotations

import json

import httpx
import pytest
from support.live import Serve, free_port
from support.streams import ndjson, sse
from support.templates import templates_dir

pytestmark = pytest.mark.real

TOOL = {"name": "get_weather", "description": "The weather forecast for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city", "days"]}}
ASK = "What is the weather in Oslo for the next 3 days?"
WANT = {"city": "Oslo", "days": 3}


@pytest.fixture(scope="module")
def server(real_pair):
    port = free_port()
    s = Serve("--target", str(real_pair.target), "--draft", str(real_pair.draft), "--ctx", "4096", "--parallel", "1",
              "--port", str(port), "--chat-template-file", str(templates_dir() / "Qwen3.5-4B.jinja"))
    try:
        assert s.wait_line("serving on", stall=300), s.output[-3000:]
        yield httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600), s
    finally:
        s.stop()


def test_the_format_is_found_from_the_template_and_shown(server):
    client, s = server
    props = client.get("/props").json()
    assert props["chat_format"] == "qwen3-coder, reasoning <think>...</think>"
    assert props["chat_template_caps"] == {"supports_tools": True, "supports_reasoning": True}
    assert "chat format qwen3-coder" in s.output


def test_openai_forced_call_parsed_and_typed(server):
    client, _ = server
    body = {"messages": [{"role": "user", "content": ASK}], "tools": [{"type": "function", "function": TOOL}],
            "tool_choice": "required", "max_tokens": 120, "temperature": 0, "reasoning_effort": "none"}
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    call = whole["message"]["tool_calls"][0]["function"]
    assert whole["finish_reason"] == "tool_calls" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == WANT
    chunks = sse(client, "/v1/chat/completions", body)
    calls = [tc for ch in chunks for tc in ch["choices"][0]["delta"].get("tool_calls", [])] if chunks else []
    assert [json.loads(tc["function"]["arguments"]) for tc in calls] == [WANT]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks) == ""


def test_openai_forced_call_after_thinking(server):
    """Thinking on: the grammar lets the model reason first, then close it and call."""
    client, _ = server
    body = {"messages": [{"role": "user", "content": ASK}], "tools": [{"type": "function", "function": TOOL}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 400, "temperature": 0}
    msg = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == WANT
    assert msg["reasoning_content"] and "<think>" not in msg["reasoning_content"] and not msg["content"]


def test_anthropic_forced_call_parsed_and_typed(server):
    client, _ = server
    body = {"model": "any", "max_tokens": 120, "messages": [{"role": "user", "content": ASK}],
            "tools": [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            "thinking": {"type": "disabled"}, "temperature": 0}
    whole = client.post("/v1/messages", json=body).json()
    assert whole["stop_reason"] == "tool_use"
    assert [b["input"] for b in whole["content"] if b["type"] == "tool_use"] == [WANT]
    events = sse(client, "/v1/messages", body)
    parts = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"
             and e["delta"]["type"] == "input_json_delta"]
    assert [json.loads(p) for p in parts] == [WANT]
    assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"] == ["tool_use"]


def test_anthropic_any_forces_a_call_where_auto_answers_text(server):
    """A question no tool answers: with tool_choice auto the 1.5B writes a call of a function not
    offered (`<function=add>`, its `=add` one token past the opening): it stays text, a 200, and the
    server lives on (it used to abort: llama.cpp's lazy grammar, triggered there, could not take the
    token). tool_choice any: a call all the same, of the tool offered, its arguments of the schema's
    types, by the grammar in the model's own format."""
    client, _ = server
    body = {"model": "any", "max_tokens": 80, "messages": [{"role": "user", "content": "What is 2 + 2? Answer with the number only."}],
            "tools": [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}],
            "thinking": {"type": "disabled"}, "temperature": 0}
    auto = client.post("/v1/messages", json=body)
    assert auto.status_code == 200, auto.text
    assert auto.json()["stop_reason"] == "end_turn" and [b["type"] for b in auto.json()["content"]] == ["text"], auto.text
    assert client.get("/health").status_code == 200
    forced = client.post("/v1/messages", json={**body, "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}).json()
    assert forced["stop_reason"] == "tool_use", forced
    calls = [(b["name"], b["input"]) for b in forced["content"] if b["type"] == "tool_use"]
    assert [name for name, _ in calls] == ["get_weather"], forced
    args = calls[0][1]
    assert set(args) == {"city", "days"} and isinstance(args["city"], str) and isinstance(args["days"], int), forced


def test_responses_forced_call_parsed_and_typed(server):
    client, _ = server
    body = {"input": ASK, "tools": [{"type": "function", **TOOL}], "tool_choice": "required", "max_output_tokens": 120,
            "reasoning": {"effort": "none"}, "temperature": 0, "parallel_tool_calls": False}
    whole = client.post("/v1/responses", json=body).json()
    assert [json.loads(i["arguments"]) for i in whole["output"] if i["type"] == "function_call"] == [WANT]
    events = sse(client, "/v1/responses", body)
    done = [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [json.loads(a) for a in done] == [WANT] and events[-1]["type"] == "response.completed"


def test_ollama_call_parsed_and_typed(server):
    """Ollama has no tool_choice: the lazy grammar, started at the format's opening, makes the call valid."""
    client, _ = server
    name = client.get("/api/tags").json()["models"][0]["name"]
    body = {"model": name, "think": False, "messages": [{"role": "user", "content": ASK}],
            "tools": [{"type": "function", "function": TOOL}], "options": {"temperature": 0, "num_predict": 120}}
    whole = client.post("/api/chat", json={**body, "stream": False}).json()
    assert [c["function"]["arguments"] for c in whole["message"]["tool_calls"]] == [WANT]
    lines = ndjson(client, "/api/chat", body)
    calls = [c["function"]["arguments"] for ln in lines for c in ln.get("message", {}).get("tool_calls", [])]
    assert calls == [WANT] and lines[-1]["done"] is True
    assert "<tool_call>" not in "".join(ln["message"]["content"] for ln in lines)


def test_thinking_on_never_leaks_markup_into_content(server):
    """Thinking on (the template opens <think> in the prompt): whatever the model writes, the answer's
    content carries no reasoning markup on any API, streamed or not."""
    client, _ = server
    q = [{"role": "user", "content": "Why is the sky blue? One sentence."}]
    oa = client.post("/v1/chat/completions", json={"messages": q, "max_tokens": 80, "temperature": 0}).json()
    msg = oa["choices"][0]["message"]
    chunks = sse(client, "/v1/chat/completions", {"messages": q, "max_tokens": 80, "temperature": 0})
    streamed = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks)
    thought = "".join(ch["choices"][0]["delta"].get("reasoning_content") or "" for ch in chunks)
    assert thought or streamed  # (not compared with the whole answer: a cached prefix may shift a greedy tie)
    an = client.post("/v1/messages", json={"model": "any", "max_tokens": 80, "messages": q,
                                           "thinking": {"type": "enabled", "budget_tokens": 1024}}).json()
    rs = client.post("/v1/responses", json={"input": q[0]["content"], "max_output_tokens": 80}).json()
    name = client.get("/api/tags").json()["models"][0]["name"]
    ol = client.post("/api/chat", json={"model": name, "stream": False, "messages": q, "think": True,
                                        "options": {"temperature": 0, "num_predict": 80}}).json()
    texts = [msg["content"], streamed, ol["message"]["content"], rs.get("output_text", "")]
    texts += [b.get("text", "") for b in an["content"] if b["type"] == "text"]
    for t in texts:
        assert "<think>" not in t and "</think>" not in t, texts
    thoughts = [msg.get("reasoning_content", ""), thought, ol["message"].get("thinking", "")]
    thoughts += [b["thinking"] for b in an["content"] if b["type"] == "thinking"]
    thoughts += [c["text"] for i in rs["output"] if i["type"] == "reasoning" for c in i["content"]]
    assert any(thoughts), (texts, thoughts)  # the model, inside the prompt's open <think>, reasoned first
