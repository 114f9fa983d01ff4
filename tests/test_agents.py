"""Structured output, tool calls and Ollama's API: on the real Qwen pair (served in-process) and on
the tiny models. JSON answers are checked with `jsonschema`, Ollama's shapes field by field
against its API documentation (docs/api.md)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from support.live import LiveServer, free_port
from test_server import client

from app.server.settings import ServeSettings

SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"]}},
        "required": ["name", "age", "address"]},
    "array": {"type": "object", "properties": {"primes": {"type": "array", "items": {"type": "integer"}, "minItems": 3,
                                                          "maxItems": 5}},
              "required": ["primes"]},
    "enum": {"type": "object", "properties": {"language": {"type": "string", "enum": ["python", "rust", "go"]},
                                              "typed": {"type": "boolean"}},
             "required": ["language", "typed"]},
}
ASK = {"nested": "Invent a person who lives in Paris.", "array": "List a few prime numbers.",
       "enum": "Which language is Django written in?"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def qwen(real_pair):
    s = LiveServer(real_pair.target, real_pair.draft, ServeSettings(port=free_port()), parallel=1, ctx=4096)
    yield s
    s.close()


@pytest.fixture(scope="module")
def tiny_api(tiny):
    s = LiveServer(tiny.target, tiny.draft, ServeSettings(port=free_port()), parallel=1)
    yield s
    s.close()


# -- structured output --------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_answers_validate_with_and_without_speculation(qwen, name):
    outs = []
    for spec in (True, False):
        r = client(qwen.url).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": ASK[name] + " Answer in JSON."}], max_tokens=120,
            temperature=0, response_format={"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}},
            extra_body={"speculative": {"enabled": spec}})
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        obj = json.loads(r.choices[0].message.content)
        jsonschema.validate(obj, SCHEMAS[name])
        outs.append(obj)
    assert outs[0] == outs[1]  # greedy and lossless: the same answer with speculation on and off


def test_json_object_and_completions_route(qwen):
    r = httpx.post(qwen.url + "/v1/completions", json={
        "prompt": "The cat Tom is 3 years old. As a JSON object with the keys name and age:", "max_tokens": 120, "temperature": 0,
        "response_format": {"type": "json_object"}}, timeout=120).json()
    text = r["choices"][0]["text"]
    assert isinstance(json.loads(text), dict), (r["choices"][0]["finish_reason"], text)
    bad = httpx.post(qwen.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",
                                                                            "json_schema": {"name": "x"}}})
    assert bad.status_code == 400 and "schema" in bad.json()["error"]["message"]
    bad = httpx.post(qwen.url + "/v1/completions", json={"prompt": "x", "grammar": "root ::= ("})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "grammar"


# -- tools ------------------------------------------------------------------------------------------

def test_tool_call_round_trip_with_the_openai_client(qwen):
    c = client(qwen.url)
    messages = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]
    r = c.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER], temperature=0, max_tokens=100)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments)["city"].lower() == "paris"
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21, "sky": "sunny"})}]
    # tool_choice "none" on the answer turn: with "auto" this 1.5B model's greedy pick between calling the
    # tool again and answering is a near-tie that flips with the CPU's arithmetic (flash attention on or off)
    r2 = c.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER], tool_choice="none", temperature=0,
                                   max_tokens=80)
    assert r2.choices[0].finish_reason == "stop" and not r2.choices[0].message.tool_calls
    assert "21" in r2.choices[0].message.content


def test_tool_calls_streamed_and_forced(qwen):
    c = client(qwen.url)
    messages = [{"role": "user", "content": "Tell me a fun fact about Paris."}]
    stream = c.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER], temperature=0, max_tokens=60,
                                       tool_choice="required", stream=True)
    chunks = list(stream)
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and calls[0].function.name == "get_weather"
    assert "city" in json.loads(calls[0].function.arguments)
    plain = c.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER], temperature=0, max_tokens=40,
                                      tool_choice="none")
    assert plain.choices[0].finish_reason in ("stop", "length") and not plain.choices[0].message.tool_calls
    bad = httpx.post(qwen.url + "/v1/chat/completions", json={"messages": messages, "tools": [WEATHER],
                                                              "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_choice"


def test_tools_refused_for_a_template_without_tool_support(tiny_api):
    r = httpx.post(tiny_api.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                "tools": [WEATHER]})
    assert r.status_code == 400 and "tool" in r.json()["error"]["message"] and r.json()["error"]["param"] == "tools"


# -- Ollama's API -------------------------------------------------------------------------------------

def _ndjson(resp) -> list[dict]:
    return [json.loads(line) for line in resp.text.splitlines() if line.strip()]


def test_ollama_metadata_routes(tiny_api):
    u = tiny_api.url
    assert httpx.get(u + "/api/version").json()["version"].count(".") == 2
    tags = httpx.get(u + "/api/tags").json()["models"]
    m = tags[0]
    assert m["name"] == "tiny" and m["model"] == "tiny" and m["size"] > 0 and m["modified_at"].endswith("Z")
    assert m["details"]["format"] == "gguf" and m["details"]["family"] == "llama" and "parameter_size" in m["details"]
    show = httpx.post(u + "/api/show", json={"model": "tiny"}).json()
    assert show["details"]["family"] == "llama" and show["model_info"]["general.architecture"] == "llama"
    assert "completion" in show["capabilities"] and "tools" not in show["capabilities"]
    other = httpx.post(u + "/api/show", json={"model": "llama3:8b"})  # one model served: any name reaches it
    assert other.status_code == 200 and other.json()["model_info"]["general.name"] == "tiny"


def test_ollama_generate_streamed_and_not(tiny_api):
    u = tiny_api.url
    body = {"model": "tiny", "prompt": "a b c", "raw": True, "options": {"temperature": 0, "num_predict": 6}}
    r = httpx.post(u + "/api/generate", json={**body, "stream": False}).json()
    assert r["done"] is True and r["done_reason"] == "length" and r["model"] == "tiny" and r["created_at"].endswith("Z")
    assert r["eval_count"] == 6 and r["prompt_eval_count"] > 0 and r["total_duration"] >= r["eval_duration"] > 0
    assert isinstance(r["context"], list) and len(r["context"]) == r["prompt_eval_count"] + 6
    s = httpx.post(u + "/api/generate", json=body)
    assert s.headers["content-type"].startswith("application/x-ndjson")
    lines = _ndjson(s)
    assert all(not x["done"] for x in lines[:-1]) and lines[-1]["done"] and lines[-1]["eval_count"] == 6
    assert "".join(x["response"] for x in lines) == r["response"]  # greedy: the same text either way
    load = httpx.post(u + "/api/generate", json={"model": "tiny"}).json()
    assert load["done"] and load["done_reason"] == "load"
    bad = httpx.post(u + "/api/generate", json={"model": "tiny", "prompt": "x", "options": {"temperature": "hot"}})
    assert bad.status_code == 400 and "temperature" in bad.json()["error"]
    other = httpx.post(u + "/api/generate", json={"model": "other", "prompt": "x", "stream": False,
                                                  "options": {"num_predict": 1}})
    assert other.status_code == 200 and other.json()["model"] == "tiny"  # the one rule: answered, naming the real model


def test_ollama_chat_streamed_and_not_with_format(qwen):
    u = qwen.url
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello in French, one word."}],
            "options": {"temperature": 0, "num_predict": 20}}
    r = httpx.post(u + "/api/chat", json={**body, "stream": False}, timeout=120).json()
    assert r["done"] and r["message"]["role"] == "assistant" and r["message"]["content"]
    assert r["done_reason"] in ("stop", "length") and r["eval_count"] > 0 and r["prompt_eval_count"] > 0
    lines = _ndjson(httpx.post(u + "/api/chat", json=body, timeout=120))
    assert "".join(x["message"]["content"] for x in lines) == r["message"]["content"] and lines[-1]["done"]
    fmt = httpx.post(u + "/api/chat", timeout=120, json={**body, "stream": False, "format": SCHEMAS["enum"],
                                                          "options": {"temperature": 0, "num_predict": 60},
                                                          "messages": [{"role": "user", "content": ASK["enum"]}]}).json()
    jsonschema.validate(json.loads(fmt["message"]["content"]), SCHEMAS["enum"])
    tools = httpx.post(u + "/api/chat", timeout=120, json={
        "model": "tiny", "stream": False, "tools": [WEATHER], "options": {"temperature": 0, "num_predict": 80},
        "messages": [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]}).json()
    call = tools["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and call["arguments"]["city"].lower() == "paris"


def test_hermes_calls_parsed_and_held_while_they_may_be_one():
    from app.chat.format import Call
    from app.chat.grammar import call_grammar
    from app.chat.hermes import Hermes
    from app.chat.spec import ChatSpec
    from app.chat.stream import ChatStream, TextDelta

    tools = {"get_weather": WEATHER["function"]}
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    for text in (f"<tool_call>\n{call}\n</tool_call>", f"```json\n{call}\n```", call, f"[{call}, {call}]"):
        found = Hermes().scan(text, tools, final=True)
        assert found.content.strip() == "" and found.calls[0] == Call("get_weather", {"city": "Oslo"})
    for text in ('{"name": "rm_rf", "arguments": {}}', "```python\nx = 1\n```", "<tool_call>not json</tool_call>"):
        assert Hermes().scan(text, tools, final=True).content == text
    spec = ChatSpec(Hermes())
    stream = ChatStream(spec, [WEATHER["function"]])
    assert stream.push("```") == [] and stream.push("python\n") == [TextDelta("```python")] and stream.push("x") == [TextDelta("\nx")]
    stream = ChatStream(spec, [WEATHER["function"]])
    assert stream.push("<tool_") == [] and stream.push("call>\n{") == []
    assert "root ::=" in call_grammar(spec, [WEATHER["function"]], forced=True).gbnf


def test_ignore_eos_generates_past_the_end(qwen):
    body = {"messages": [{"role": "user", "content": "Say hi, one word."}], "max_tokens": 24, "temperature": 0}
    short = httpx.post(qwen.url + "/v1/chat/completions", json=body, timeout=120).json()
    assert short["choices"][0]["finish_reason"] == "stop" and short["usage"]["completion_tokens"] < 24
    full = httpx.post(qwen.url + "/v1/chat/completions", json={**body, "ignore_eos": True}, timeout=120).json()
    assert full["choices"][0]["finish_reason"] == "length" and full["usage"]["completion_tokens"] == 24
