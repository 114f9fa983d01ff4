"""The agent APIs on the real Qwen2.5-Coder pair, where the model follows instructions: a tool round
trip through the `anthropic` SDK (streamed, event by event) and through the `openai` SDK's
Responses API, `text.format` json_schema answers validated with `jsonschema`, logprobs with
speculation on and off, and llama.vim's cache-warming `/infill` with `n_predict: 0`."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest
from support.live import LiveServer, free_port

from app.server.settings import ServeSettings

pytestmark = pytest.mark.real

WEATHER = {"name": "get_weather", "description": "Current weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK = "What is the weather in Paris right now? Use the tool."


@pytest.fixture(scope="module")
def qwen(real_pair):
    s = LiveServer(real_pair.target, real_pair.draft, ServeSettings(port=free_port()), parallel=1, ctx=4096)
    yield s
    s.close()


def _claude(url):
    return anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=300)


def _oai(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)


def test_anthropic_tool_round_trip_streamed_event_by_event(qwen):
    c = _claude(qwen.url)
    first = c.messages.create(model="claude-sonnet-4-5", max_tokens=120, tools=[WEATHER], extra_body={"temperature": 0},
                              messages=[{"role": "user", "content": ASK}])
    assert first.stop_reason == "tool_use", first.content
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    with c.messages.stream(model="claude-sonnet-4-5", max_tokens=120, tools=[WEATHER], extra_body={"temperature": 0},
                           messages=[{"role": "user", "content": ASK}]) as s:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None) or getattr(getattr(e, "content_block", None), "type", None))
                 for e in s]
        final = s.get_final_message()
    raw = [k for k in kinds if k[0] in ("message_start", "content_block_start", "content_block_delta", "content_block_stop",
                                        "message_delta", "message_stop")]
    assert raw[0][0] == "message_start" and raw[-2][0] == "message_delta" and raw[-1][0] == "message_stop"
    assert ("content_block_start", "tool_use") in raw and ("content_block_delta", "input_json_delta") in raw
    assert final.stop_reason == "tool_use" and next(b for b in final.content if b.type == "tool_use").input == {"city": "Paris"}
    # tool_choice "none" on the answer turn, as in test_agents: with "auto" this model's pick between a second
    # call and an answer is a near-tie, and its "answers" there echoed the call as JSON
    answer = c.messages.create(model="claude-sonnet-4-5", max_tokens=80, tools=[WEATHER], tool_choice={"type": "none"},
                               extra_body={"temperature": 0}, messages=[
                                   {"role": "user", "content": ASK},
                                   {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                                 "content": "Sunny, 24 degrees Celsius"}]}])
    text = "".join(b.text for b in answer.content if b.type == "text")
    assert answer.stop_reason == "end_turn" and "24" in text, text
    forced = c.messages.create(model="x", max_tokens=80, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                               messages=[{"role": "user", "content": "Tell me about Rome."}], extra_body={"temperature": 0})
    assert forced.stop_reason == "tool_use" and forced.content[-1].input["city"]


def test_responses_function_call_round_trip_and_json_schema(qwen):
    c = _oai(qwen.url)
    tool = {"type": "function", "name": "get_weather", "description": WEATHER["description"],
            "parameters": WEATHER["input_schema"]}
    r = c.responses.create(model="gpt-5-codex", input=ASK, tools=[tool, {"type": "web_search"}], temperature=0,
                           max_output_tokens=120)
    call = next(i for i in r.output if i.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"} and call.call_id
    done = c.responses.create(model="gpt-5-codex", tools=[tool], tool_choice="none", temperature=0, max_output_tokens=80, input=[
        {"role": "user", "content": ASK}, {"type": "function_call", "call_id": call.call_id, "name": call.name,
                                           "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees Celsius"}])
    assert done.status == "completed" and "24" in done.output_text, done.output_text
    streamed = list(c.responses.create(model="x", input=ASK, tools=[tool], temperature=0, max_output_tokens=120, stream=True))
    kinds = [e.type for e in streamed]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert kinds[-1] == "response.completed" and streamed[-1].response.usage.output_tokens > 0
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    j = c.responses.create(model="x", input="Invent a person. Answer in JSON.", temperature=0, max_output_tokens=120,
                           text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(j.output_text), schema)


def test_logprobs_equal_with_speculation_on_and_off(qwen):
    c = _oai(qwen.url)
    runs = []
    for spec in (True, False):
        r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Write a Python function that adds two numbers."}],
                                      max_tokens=48, temperature=0, logprobs=True, top_logprobs=5,
                                      extra_body={"speculative": {"enabled": spec}})
        runs.append((r.choices[0].logprobs.content, r.timings if hasattr(r, "timings") else None))
    on, off = runs[0][0], runs[1][0]
    n = next((i for i, (a, b) in enumerate(zip(on, off)) if a.token != b.token), min(len(on), len(off)))
    assert n >= 16  # identical up to a near-tie, if one occurs (`specdeck verify`)
    worst = max(abs(a.logprob - b.logprob) for a, b in zip(on[:n], off[:n]))
    assert worst < 1.0, worst  # within the batch numerics tolerance of `specdeck verify`
    assert sum(e.logprob for e in on[:n]) / n > -1.0  # a coder model is confident on this


def test_infill_n_predict_zero_warms_the_cache(qwen):
    c = httpx.Client(base_url=qwen.url, timeout=300)
    body = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n",
            "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n" * 20}]}
    warm = c.post("/infill", json={**body, "n_predict": 0}).json()
    assert warm["tokens_predicted"] == 0 and warm["content"] == "" and warm["tokens_evaluated"] > 200
    done = c.post("/infill", json={**body, "n_predict": 12}).json()
    assert done["timings"]["prompt_cached"] >= warm["tokens_evaluated"] - 1 and "a + b" in done["content"]


def test_the_pair_without_a_projector_answers_an_image_with_the_clear_400_and_text_as_before(qwen):
    """The Qwen pair has no vision projector: an image is refused on each API, naming the part, and
    the same conversation as text is answered."""
    import httpx

    png = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
    for path, body, where in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}]}]}, "messages.0.content.1"),
        ("/v1/messages", {"model": "x", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]}]},
         "messages.0.content.0"),
        ("/api/chat", {"model": "tiny", "stream": False, "messages": [{"role": "user", "content": "?", "images": [png]}]},
         "messages.0.images.0"),
    ):
        r = httpx.post(qwen.url + path, json={**body, "max_tokens": 8} if path.startswith("/v1/chat") else body, timeout=120)
        assert r.status_code == 400 and f"{where}: this model has no vision projector: serve it with --mmproj" in r.text, r.text
    r = httpx.post(qwen.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
