"""The APIs coding agents speak, on the tiny models: Anthropic Messages through the real `anthropic`
SDK, OpenAI Responses through the real `openai` SDK, llama-server's own routes and request
semantics, logprobs, model names, CORS, Ollama's /api/ps, and each API's error envelope. (Tool
calls and JSON answers that need a model that follows instructions run on the Qwen pair, in
test_agent_apis_real.py.)"""

from __future__ import annotations

import json
import threading

import anthropic
import httpx
import openai
import pytest
from support.live import LiveServer, free_port
from support.tinymodels import write_tiny_model

from app.server.settings import ServeSettings

TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
            "{% for c in m.tool_calls or [] %}[call {{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}\n"
            "{% endfor %}{% if tools %}[tools {{ tools | length }}]{% endif %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
KEY = "sk-agent-test-key"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("agent-pair")
    return (write_tiny_model(d / "target.gguf", seed=0, chat_template=TEMPLATE),
            write_tiny_model(d / "draft.gguf", seed=1, n_layers=1, chat_template=TEMPLATE))


@pytest.fixture(scope="module")
def api(pair):
    s = LiveServer(*pair, ServeSettings(port=free_port(), api_key=KEY, cors_origins=["localhost", "https://app.example"],
                                        model_aliases=["coder"], max_body_bytes=1 << 16), parallel=2)
    yield s
    s.close()


def _claude(url: str, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=60)


def _oai(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


H = {"authorization": f"Bearer {KEY}"}

# -- Anthropic Messages ------------------------------------------------------------------------


def test_messages_create_system_stop_and_usage(api):
    c = _claude(api.url)
    ask = dict(model="claude-sonnet-4-5", max_tokens=12, extra_body={"temperature": 0}, system="Be brief.",
               messages=[{"role": "user", "content": "a b c the def"}])
    m = c.messages.create(**ask)
    assert m.type == "message" and m.role == "assistant" and m.model == "tiny"
    assert m.content[0].type == "text" and m.stop_reason in ("max_tokens", "end_turn")
    n_in = c.messages.count_tokens(model="claude-sonnet-4-5", system="Be brief.", messages=ask["messages"]).input_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == n_in
    again = c.messages.create(**ask)  # the same prompt again: read from the prompt cache
    assert again.content[0].text == m.content[0].text and again.usage.cache_read_input_tokens > 0
    stop = m.content[0].text.split()[1] if len(m.content[0].text.split()) > 1 else None
    if stop:
        cut = c.messages.create(**ask, stop_sequences=[stop])
        assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop and stop not in cut.content[0].text
    blocks = c.messages.create(**{**ask, "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                                  "metadata": {"user_id": "u1"}, "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert blocks.content[0].text == m.content[0].text  # cache_control, metadata and thinking change nothing here


def test_messages_stream_event_sequence(api):
    raw = httpx.post(api.url + "/v1/messages", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}, json={
        "model": "x", "max_tokens": 10, "temperature": 0, "stream": True,
        "messages": [{"role": "user", "content": "a b c the def"}]}, timeout=60)
    kinds = [line[7:] for line in raw.text.splitlines() if line.startswith("event: ")]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert set(kinds[3:-3]) == {"content_block_delta"} and kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    with _claude(api.url).messages.stream(model="x", max_tokens=10, extra_body={"temperature": 0},
                                          messages=[{"role": "user", "content": "a b c the def"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    whole = _claude(api.url).messages.create(model="x", max_tokens=10, extra_body={"temperature": 0},
                                             messages=[{"role": "user", "content": "a b c the def"}])
    assert text == final.content[0].text == whole.content[0].text
    assert final.usage.output_tokens == whole.usage.output_tokens == 10 and final.stop_reason == "max_tokens"


def test_messages_tool_history_renders_through_the_template(api):
    c = _claude(api.url)
    tools = [{"name": "read_file", "description": "Read a file", "input_schema": {"type": "object", "properties": {
        "path": {"type": "string"}}, "required": ["path"]}}, {"type": "web_search_20250305", "name": "web_search"}]
    history = [{"role": "user", "content": "open a.py"},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
                                                 {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                             "content": [{"type": "text", "text": "print(1)"}]}]}]
    with_tools = c.messages.count_tokens(model="x", messages=history, tools=tools).input_tokens
    without = c.messages.count_tokens(model="x", messages=history).input_tokens
    assert with_tools > without  # the tools are rendered (the server tool is skipped, not a failure)
    r = c.messages.create(model="x", max_tokens=4, messages=history, tools=tools)
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == with_tools
    with pytest.raises(anthropic.BadRequestError, match="not among the tools"):
        c.messages.create(model="x", max_tokens=4, messages=history, tools=tools, tool_choice={"type": "tool", "name": "nope"})


def test_messages_errors_in_anthropic_envelope(api):
    c = _claude(api.url)
    with pytest.raises(anthropic.AuthenticationError):
        _claude(api.url, "wrong").messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": "a"}])
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError, match="no vision projector: serve it with --mmproj"):
        c.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": [image]}])
    with pytest.raises(anthropic.APIStatusError) as big:
        c.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": "a " * 50_000}])
    assert big.value.status_code == 413  # the body is read before the refusal: the SDK sees the status, not a broken pipe
    cases = [({"model": "x", "messages": [{"role": "user", "content": "a"}]}, 400, "max_tokens"),  # required by Anthropic
             ({"model": "x", "max_tokens": 4, "messages": []}, 400, "messages"),
             ({"model": "x", "max_tokens": 4, "messages": [{"role": "wizard", "content": "a"}]}, 400, "role"),
             ({"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}, 400, "hologram"),
             ({"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "a " * 3000}]}, 400, "context")]
    for body, status, says in cases:
        r = httpx.post(api.url + "/v1/messages", headers={"x-api-key": KEY}, json=body, timeout=60)
        assert r.status_code == status, r.text
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
        assert says in r.json()["error"]["message"], r.json()
    r = httpx.post(api.url + "/v1/messages", headers={"x-api-key": KEY}, content=b"{not json", timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(api.url + "/health").json()["status"] == "ok"


def test_messages_overloaded_is_529_with_retry_after(pair):
    s = LiveServer(*pair, ServeSettings(port=free_port(), max_queue=0), parallel=1)
    try:
        long = threading.Thread(target=lambda: httpx.post(s.url + "/v1/messages", json={
            "model": "x", "max_tokens": 400, "messages": [{"role": "user", "content": "a b"}]}, timeout=120))
        long.start()
        for _ in range(200):
            if s.service.scheduler.busy_slots():
                break
            threading.Event().wait(0.01)
        r = httpx.post(s.url + "/v1/messages", json={"model": "x", "max_tokens": 4,
                                                       "messages": [{"role": "user", "content": "a"}]}, timeout=60)
        assert r.status_code == 529 and r.headers["retry-after"] and r.json()["error"]["type"] == "overloaded_error"
        long.join(120)
    finally:
        s.close()


# -- OpenAI Responses --------------------------------------------------------------------------


def test_responses_create_stream_and_items(api):
    c = _oai(api.url)
    r = c.responses.create(model="gpt-5-codex", input="a b c the def", max_output_tokens=10, temperature=0,
                           instructions="Be brief.", store=False)
    assert r.object == "response" and r.model == "tiny" and r.status == "incomplete"
    assert r.output[0].type == "message" and r.output_text == r.output[0].content[0].text and r.usage.output_tokens == 10
    events = list(c.responses.create(model="x", input="a b c the def", max_output_tokens=10, temperature=0,
                                     instructions="Be brief.", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.usage.output_tokens == 10
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run it"}]},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"cmd": ["ls"]}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "a.py"}]
    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"cmd": {"type": "array"}}}},
             {"type": "web_search"}, {"type": "local_shell"}]
    r = c.responses.create(model="x", input=items, tools=tools, max_output_tokens=3)
    assert r.usage.input_tokens > 0 and r.output
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        c.responses.create(model="x", input="a", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match="input.0.content.0: this model has no vision projector"):
        c.responses.create(model="x", input=[{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}])


# -- llama-server's routes and semantics -------------------------------------------------------


def test_llamacpp_completion_tokenize_props_slots(api):
    c = httpx.Client(base_url=api.url, headers=H, timeout=60)
    tok = c.post("/tokenize", json={"content": "a b c", "add_special": True, "with_pieces": True}).json()["tokens"]
    assert tok[0]["id"] == 1 and all("piece" in t for t in tok)
    ids = c.post("/tokenize", json={"content": "a b c the", "add_special": True}).json()["tokens"]
    assert c.post("/detokenize", json={"tokens": ids}).json()["content"].strip() == "a b c the"
    by_ids = c.post("/completion", json={"prompt": ids, "n_predict": 6, "temperature": 0}).json()
    r = c.post("/completion", json={"prompt": "a b c the", "n_predict": 6, "temperature": 0, "return_tokens": True, "n_probs": 2}).json()
    assert by_ids["content"] == r["content"]  # a text prompt gets BOS, as llama-server adds it
    assert r["tokens_predicted"] == 6 and len(r["tokens"]) == 6 and r["stop_type"] == "limit" and r["stop"] is True
    assert [p["id"] for p in r["completion_probabilities"]] == r["tokens"]
    assert all(len(p["top_logprobs"]) == 2 and p["logprob"] <= 0 for p in r["completion_probabilities"])
    chunks = [json.loads(line[6:]) for line in c.post("/completion", json={"prompt": "a b c the", "n_predict": 6,
                                                                           "temperature": 0, "stream": True}).text.splitlines()
              if line.startswith("data: ")]
    assert chunks[-1]["stop"] is True and "".join(ch["content"] for ch in chunks) == r["content"]
    assert [t for ch in chunks[:-1] for t in ch["tokens"]] == r["tokens"]  # ids in every chunk, as llama-server
    n = c.post("/v1/chat/completions/input_tokens", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert n["input_tokens"] == len(c.post("/tokenize", json={"content": "<|user|>hi<|assistant|>", "add_special": True}).json()["tokens"])
    assert c.post("/completions", json={"prompt": "a b c the", "n_predict": 6, "temperature": 0}).json()["content"] == r["content"]
    props = c.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 1024 and props["total_slots"] == 2
    assert props["chat_template"] == TEMPLATE and props["model_alias"] == "tiny"
    slots = c.get("/slots")
    assert slots.status_code == 501 and "--slots" in slots.json()["error"]["message"]
    assert c.post("/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}).json()["prompt"] == \
        "<|user|>hi<|assistant|>"  # (the template's new line is trimmed by Jinja's trim_blocks, as in HF)
    assert c.post("/apply-template", json={"messages": [{"role": "user", "content": "hi"}],
                                           "add_generation_prompt": False}).json()["prompt"] == "<|user|>hi"
    for path in ("/chat/completions", "/models"):  # llama-server also serves these without /v1
        r = c.post(path, json={"messages": [{"role": "user", "content": "a"}], "max_tokens": 2}) if "chat" in path else c.get(path)
        assert r.status_code == 200, (path, r.text)


def test_infill_budgets_as_editor_plugins_send_them(api):
    c = httpx.Client(base_url=api.url, headers=H, timeout=60)
    body = {"input_prefix": "def f(a, b):\n    return ", "input_suffix": "\n", "input_extra": [{"filename": "x.py", "text": "x = 1\n"}]}
    warm = c.post("/infill", json={**body, "n_predict": 0})
    # the tiny model has no FIM tokens: a clear 400 (the Qwen pair's infill is in test_agent_apis_real.py)
    assert warm.status_code == 400 and "fill-in-the-middle" in warm.json()["error"]["message"]
    bad = c.post("/infill", json={**body, "input_extra": [{"name": "x.py"}]})
    assert bad.status_code == 400 and "input_extra" in bad.json()["error"]["message"]
    bad = c.post("/infill", json={**body, "input_extra": "x"})
    assert bad.status_code == 400 and "input_extra" in bad.json()["error"]["message"]
    warm = c.post("/completion", json={"prompt": "a b c the def a b", "n_predict": 0}).json()
    assert warm["tokens_predicted"] == 0 and warm["content"] == ""
    after = c.post("/completion", json={"prompt": "a b c the def a b", "n_predict": 2}).json()
    assert after["timings"]["prompt_cached"] > 0  # n_predict 0 left the prompt in the cache
    timed = c.post("/completion", json={"prompt": "a b c", "n_predict": 300, "t_max_predict_ms": 1, "temperature": 1,
                                        "seed": 3}).json()
    assert timed["stop_type"] in ("limit", "eos") and (timed["tokens_predicted"] < 300 or "\n" not in timed["content"])


def test_openai_request_semantics(api):
    c = httpx.Client(base_url=api.url, headers=H, timeout=60)
    r = c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": -1, "seed": -1, "echo": True}).json()
    assert r["choices"][0]["text"].startswith("a b c") and r["usage"]["completion_tokens"] > 0
    assert r["system_fingerprint"].startswith("fp_") and "cached_tokens" in r["usage"]["prompt_tokens_details"]
    n = c.post("/v1/completions", json={"prompt": "a b c", "n_predict": 3, "ignore_eos": True}).json()
    assert n["usage"]["completion_tokens"] == 3  # the alias is the limit (the tiny model may sample its end token early)
    msgs = [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c the"}]
    pre = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 3, "temperature": 0}).json()
    plain = c.post("/v1/completions", json={"prompt": "<|user|>a b<|assistant|>c the", "max_tokens": 3, "temperature": 0}).json()
    assert pre["choices"][0]["message"]["content"] == plain["choices"][0]["text"]  # the last assistant message is continued
    for body, says in (({"messages": msgs + [{"role": "assistant", "content": "x"}]}, "in a row"),
                       ({"messages": msgs, "continue_final_message": True, "add_generation_prompt": True}, "cannot both"),
                       ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
                        "messages.0.content.0: this model has no vision projector: serve it with --mmproj")):
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    r = c.post("/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "a", "images": ["aGk="]}]})
    assert r.status_code == 400 and "messages.0.images.0: this model has no vision projector" in r.json()["error"], r.text
    assert c.post("/v1/completions", json={"prompt": "a", "model": "coder", "max_tokens": 1}).json()["model"] == "tiny"
    models = c.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny", "coder"] and models["models"][0]["slug"] == "tiny"


# one request per API that names a model: (path, body)
NAMED = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 1}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 1}),
    ("/v1/responses", {"input": "a", "max_output_tokens": 1}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 1}),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "a"}]}),
    ("/api/chat", {"messages": [{"role": "user", "content": "a"}], "stream": False, "options": {"num_predict": 1}}),
    ("/api/generate", {"prompt": "a", "stream": False, "options": {"num_predict": 1}}),
    ("/api/show", {}),
    ("/completion", {"prompt": "a", "n_predict": 1}),
    ("/tokenize", {"content": "a"}),
]


@pytest.fixture(scope="module")
def strict(pair):
    s = LiveServer(*pair, ServeSettings(port=free_port(), strict_model=True, model_aliases=["coder"]), parallel=1)
    yield s
    s.close()


@pytest.mark.parametrize("path,body", NAMED, ids=[p for p, _ in NAMED])
def test_one_model_serves_any_name_on_every_api(api, path, body):
    for name in ("gpt-4o", "llama3:8b", "claude-sonnet-4-5", "specdeck", "coder", "tiny:latest"):
        r = httpx.post(api.url + path, headers=H, json={**body, "model": name}, timeout=60)
        assert r.status_code == 200, (name, r.text)


def test_ollama_names_the_real_model_whatever_it_was_asked(api):
    tags = httpx.get(api.url + "/api/tags", headers=H).json()["models"]
    assert [t["name"] for t in tags] == ["tiny"]
    show = httpx.post(api.url + "/api/show", headers=H, json={"model": "qwen2.5-coder:7b"}).json()
    assert show["model_info"]["general.name"] == "tiny"
    r = httpx.post(api.url + "/api/chat", headers=H, json={"model": "llama3", "messages": [{"role": "user", "content": "a"}],
                                                          "stream": False, "options": {"num_predict": 1}})
    assert r.json()["model"] == "tiny", r.text


@pytest.mark.parametrize("path,body", NAMED, ids=[p for p, _ in NAMED])
def test_strict_model_refuses_other_names_in_each_apis_envelope(strict, path, body):
    for name in ("tiny", "tiny:latest", "coder", "specdeck"):
        r = httpx.post(strict.url + path, json={**body, "model": name}, timeout=60)
        assert r.status_code == 200, (name, r.text)
    r = httpx.post(strict.url + path, json={**body, "model": "gpt-9"}, timeout=60)
    assert r.status_code == 404, r.text
    err = r.json()
    if path.startswith("/api/"):  # Ollama's envelope: one string
        assert set(err) == {"error"} and "'gpt-9'" in err["error"] and "served: tiny" in err["error"]
    elif path.startswith("/v1/messages"):  # Anthropic's
        assert err["type"] == "error" and err["error"]["type"] == "not_found_error" and "served: tiny" in err["error"]["message"]
    else:  # OpenAI's (llama-server's routes too)
        assert err["error"]["code"] == "model_not_found" and err["error"]["models"] == ["tiny"], err


def test_logprobs_with_speculation_on_and_off(api):
    c = _oai(api.url)
    outs = []
    for spec in (True, False):
        r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "a b c the def"}], max_tokens=16,
                                      temperature=0, logprobs=True, top_logprobs=3, extra_body={"speculative": {"enabled": spec}})
        outs.append(r.choices[0].logprobs.content)
        assert len(outs[-1]) == r.usage.completion_tokens
        for e in outs[-1]:
            assert len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 and e.logprob <= 0
    assert [e.token for e in outs[0]] == [e.token for e in outs[1]]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(*outs)) < 1.0  # `specdeck verify`'s batch numerics tolerance
    legacy = c.completions.create(model="x", prompt="a b c the def", max_tokens=5, temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    # (the legacy shape keys alternatives by text: two byte tokens that both print as U+FFFD share a key)
    assert len(lp.tokens) == 5 and 1 <= len(lp.top_logprobs[0]) <= 2 and lp.text_offset[0] == len("a b c the def")
    chunks = list(c.chat.completions.create(model="x", messages=[{"role": "user", "content": "a b c the def"}], max_tokens=16,
                                            temperature=0, logprobs=True, stream=True))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in outs[0]]
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="x", messages=[{"role": "user", "content": "a"}], logprobs=True, top_logprobs=21)


def test_cors_ps_and_errors_per_api(api):
    pre = httpx.options(api.url + "/v1/messages", headers={"origin": "http://localhost:5173", "access-control-request-method": "POST",
                                                           "access-control-request-headers": "x-api-key,content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert "POST" in pre.headers["access-control-allow-methods"] and "x-api-key" in pre.headers["access-control-allow-headers"]
    other = httpx.options(api.url + "/v1/messages", headers={"origin": "https://evil.example", "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in other.headers
    ok = httpx.get(api.url + "/health", headers={"origin": "https://app.example"})
    assert ok.headers["access-control-allow-origin"] == "https://app.example"
    ps = httpx.get(api.url + "/api/ps", headers=H).json()["models"][0]
    assert ps["name"] == "tiny" and ps["size"] > 0 and ps["context_length"] == 1024 and "size_vram" in ps
    unauth = {p: httpx.post(api.url + p, json={}).json() for p in ("/v1/messages", "/api/chat", "/v1/chat/completions")}
    assert unauth["/v1/messages"]["error"]["type"] == "authentication_error" and unauth["/v1/messages"]["type"] == "error"
    assert isinstance(unauth["/api/chat"]["error"], str)
    assert unauth["/v1/chat/completions"]["error"]["code"] == "invalid_api_key"
    big = _oai(api.url)
    with pytest.raises(openai.APIStatusError) as e:
        big.completions.create(model="x", prompt="a " * 50_000, max_tokens=1)
    assert e.value.status_code == 413


# -- embeddings --------------------------------------------------------------------------------


def test_embeddings_without_a_model_name_the_flag(api):
    r = httpx.post(api.url + "/v1/embeddings", headers=H, json={"input": "a b"})
    assert r.status_code == 501 and "--embedding-model" in r.json()["error"]["message"]
    r = httpx.post(api.url + "/api/embed", headers=H, json={"model": "x", "input": "a b"})
    assert r.status_code == 501 and "--embedding-model" in r.json()["error"]


def test_embeddings_openai_and_ollama_from_the_embedding_model(pair, tmp_path):
    import base64

    import numpy as np
    emb_path = write_tiny_model(tmp_path / "embed.gguf", seed=7, n_layers=1)
    s = LiveServer(*pair, ServeSettings(port=free_port()), parallel=1, embedding=emb_path)
    try:
        terms = {t["name"]: t["bytes"] for t in s.plan.to_json()["terms"]}
        assert terms["embedding weights"] > 0 and terms["embedding KV cache"] > 0  # counted in the budget
        c = _oai(s.url)
        r = c.embeddings.create(model="text-embedding-3-small", input=["a b c", "the def", "a b c"])
        vecs = [np.array(d.embedding) for d in r.data]
        assert [d.index for d in r.data] == [0, 1, 2] and r.usage.prompt_tokens > 0
        assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in vecs)
        assert np.allclose(vecs[0], vecs[2]) and not np.allclose(vecs[0], vecs[1])
        ids = httpx.post(s.url + "/tokenize", json={"content": "a b c", "add_special": True}).json()["tokens"]
        by_ids = httpx.post(s.url + "/v1/embeddings", json={"input": ids}).json()["data"][0]["embedding"]
        assert np.allclose(by_ids, vecs[0], atol=1e-6)
        b64 = httpx.post(s.url + "/v1/embeddings", json={"input": "a b c", "encoding_format": "base64"}).json()
        assert np.allclose(np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), "<f4"), vecs[0], atol=1e-6)
        short = httpx.post(s.url + "/v1/embeddings", json={"input": "a b c", "dimensions": 8}).json()["data"][0]["embedding"]
        assert len(short) == 8 and abs(np.linalg.norm(short) - 1) < 1e-5
        ol = httpx.post(s.url + "/api/embed", json={"model": "embed", "input": ["a b c", "the def"]}).json()
        assert np.allclose(ol["embeddings"][0], vecs[0], atol=1e-6) and len(ol["embeddings"]) == 2
        for bad in ({"input": []}, {"input": [[999999]]}, {"input": "a " * 9000}, {"input": 5}):
            r = httpx.post(s.url + "/v1/embeddings", json=bad, timeout=60)
            assert r.status_code == 400, (bad, r.text)
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code == 200
    finally:
        s.close()


# -- bad input on every new route, in each API's own error shape -------------------------------

LONG = "a " * 3000  # over the tiny server's 1,024-token context
NEW_ROUTES = {  # route: (a valid body, how to make it too long, how to give it an unknown role)
    "/v1/messages": ({"model": "x", "max_tokens": 2, "messages": [{"role": "user", "content": "a"}]},
                     {"messages": [{"role": "user", "content": LONG}]}, {"messages": [{"role": "wizard", "content": "a"}]}),
    "/v1/messages/count_tokens": ({"model": "x", "messages": [{"role": "user", "content": "a"}]}, None,
                                  {"messages": [{"role": "tool", "content": "a"}]}),
    "/v1/responses": ({"model": "x", "input": "a", "max_output_tokens": 2}, {"input": LONG},
                      {"input": [{"type": "message", "role": "wizard", "content": "a"}]}),
    "/completion": ({"prompt": "a", "n_predict": 2}, {"prompt": LONG}, None),
    "/infill": ({"input_prefix": "a", "n_predict": 2}, None, None),
    "/tokenize": ({"content": "a"}, None, None),
    "/detokenize": ({"tokens": [5]}, None, None),
    "/apply-template": ({"messages": [{"role": "user", "content": "a"}]}, None,
                        {"messages": [{"role": "wizard", "content": "a"}]}),
    "/v1/embeddings": ({"input": "a"}, None, None),
    "/api/embed": ({"model": "x", "input": "a"}, None, None),
}


def _shape_ok(path: str, body) -> bool:
    if path.startswith("/v1/messages"):
        return body.get("type") == "error" and {"type", "message"} <= set(body["error"])
    if path.startswith("/api/"):
        return isinstance(body.get("error"), str)
    return {"message", "type"} <= set(body.get("error", {}))


@pytest.mark.parametrize("path", list(NEW_ROUTES))
def test_bad_input_on_new_routes_is_a_clear_4xx_in_the_routes_shape(api, path):
    good, too_long, bad_role = NEW_ROUTES[path]
    cases = [("malformed JSON", {"content": b'{"a": '}),
             ("a list body", {"json": [1, 2]}),
             ("wrong types", {"json": {k: {"x": 1} for k in good}}),
             ("huge body", {"content": b'{"x": "' + b"a" * (1 << 17) + b'"}'})]
    if too_long:
        cases.append(("longer than the context", {"json": {**good, **too_long}}))
    if bad_role:
        cases.append(("unknown role", {"json": {**good, **bad_role}}))
    for name, kwargs in cases:
        r = httpx.post(api.url + path, headers={**H, "content-type": "application/json"}, timeout=60, **kwargs)
        assert 400 <= r.status_code < 500 and r.status_code != 404, (name, r.status_code, r.text[:300])
        assert _shape_ok(path, r.json()), (name, r.text[:300])
    assert httpx.get(api.url + "/health").json()["status"] == "ok"
    assert httpx.post(api.url + "/v1/completions", headers=H, json={"prompt": "a", "max_tokens": 2}, timeout=60).status_code == 200


def test_ollama_logprobs_chat_and_generate(api):
    c = httpx.Client(base_url=api.url, headers=H, timeout=60)
    ask = {"model": "tiny", "options": {"temperature": 0, "num_predict": 6}, "logprobs": True, "top_logprobs": 2}
    gen = c.post("/api/generate", json={**ask, "prompt": "a b c the", "stream": False, "raw": True}).json()
    assert len(gen["logprobs"]) == gen["eval_count"] == 6
    assert all(len(x["top_logprobs"]) == 2 and x["logprob"] <= 0 and x["bytes"] for x in gen["logprobs"])
    lines = [json.loads(x) for x in c.post("/api/generate", json={**ask, "prompt": "a b c the", "raw": True}).text.splitlines()]
    assert [x["token"] for line in lines for x in line.get("logprobs", [])] == [x["token"] for x in gen["logprobs"]]
    chat = c.post("/api/chat", json={**ask, "messages": [{"role": "user", "content": "a b"}], "stream": False}).json()
    assert len(chat["logprobs"]) == chat["eval_count"]
    plain = c.post("/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "a b"}], "stream": False}).json()
    assert "logprobs" not in plain


def test_return_progress_reports_the_prompt_chunk_by_chunk_as_llama_server_does(api):
    """llama-server's `return_progress` on /completion, chat completions and Responses: a first report
    before any token is evaluated (processed == cache), one per chunk after it, the last with every
    token processed; each with timings that never go back."""
    ubatch = api.service.scheduler.engine.target.params.n_ubatch
    n = 8
    while len(httpx.post(api.url + "/tokenize", headers=H, json={"content": " ".join(["w7"] * n)}).json()["tokens"]) < 1.4 * ubatch:
        n += 8
    words = " ".join(["w7"] * n)  # two chunks and a part

    def progress(path: str, body: dict) -> list[dict]:
        out = []
        with httpx.stream("POST", api.url + path, json={**body, "stream": True, "return_progress": True},
                          headers=H, timeout=120) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: {") and "prompt_progress" in line:
                    out.append(json.loads(line[6:]))
        return out

    for path, body in (("/completion", {"prompt": words, "n_predict": 2}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " + words}], "max_tokens": 2}),
                       ("/v1/responses", {"input": "y " + words, "max_output_tokens": 2})):
        got = progress(path, body)
        reports = [c["prompt_progress"] for c in got]
        assert len(reports) >= 3, (path, reports)  # the first, then one per chunk (2+ chunks)
        assert reports[0]["processed"] == reports[0]["cache"] and reports[-1]["processed"] == reports[-1]["total"]
        assert all(a["processed"] < b["processed"] and a["total"] == b["total"] for a, b in zip(reports, reports[1:]))
        ms = [c["timings"]["prompt_ms"] for c in got]
        assert ms == sorted(ms) and ms[-1] > 0 and all(v >= 0 for c in got for v in c["timings"].values())
        if path == "/v1/responses":
            assert all(c["type"] == "response.in_progress" for c in got)
    plain = httpx.post(api.url + "/completion", json={"prompt": words, "n_predict": 2, "stream": True},
                       headers=H, timeout=120).text
    assert "prompt_progress" not in plain  # only where asked
