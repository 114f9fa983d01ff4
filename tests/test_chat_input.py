"""Chat formats at the server's edges, on the tiny models: a template file that does not compile
stops the start in one line naming the line at fault; a template whose calls are not parsed is named
in one line at start (`check` and `serve`); `chat_template_file` is read from the config file; a
template that raises on a request's messages answers that request 400 with the template's own
message, and the server stays healthy; a model answer in a broken call format comes back as text (a
200); reasoning streams apart on every API, an answer cut inside it is all reasoning, and
`--reasoning-format none` keeps the raw text; reasoning sent back reaches the template. What the
tiny random models answer is made exact, where it matters, by a grammar (`grammar` on OpenAI chat)."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import run_cli
from support.live import LiveServer, Serve, free_port
from support.streams import ndjson, sse
from support.templates import templates_dir

from app.chat.spec import NOT_PARSED
from app.server.settings import ServeSettings

RAISES = ("{% for m in messages %}{% if m.role == 'user' and 'forbidden' in m.content %}"
          "{{ raise_exception('this template refuses the word forbidden') }}{% endif %}"
          "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_template_file_that_does_not_compile_is_one_line_at_start(tiny, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }\n", encoding="utf-8")
    r = run_cli("serve", "--target", str(tiny.target), "--ctx", "256", "--port", str(free_port()),
                "--chat-template-file", str(bad))
    assert r.returncode == 1, r.stderr
    assert f"chat template {bad}: line 1:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    missing = run_cli("check", "--target", str(tiny.target), "--chat-template-file", str(tmp_path / "none.jinja"))
    assert missing.returncode == 1 and "no such file" in missing.stderr and "Traceback" not in missing.stderr


def test_check_shows_the_format_of_the_template_given(tiny, tmp_path):
    qwen = tmp_path / "hermes.jinja"
    qwen.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments}"
        " | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}",
        encoding="utf-8")
    r = run_cli("check", "--target", str(tiny.target), "--chat-template-file", str(qwen), "--json")
    assert r.returncode == 0, r.stderr
    assert '"name": "hermes"' in r.stdout, r.stdout


@pytest.fixture(scope="module")
def raising(tiny):
    s = LiveServer(tiny.target, tiny.draft, ServeSettings(port=free_port()), parallel=1, chat_template=RAISES)
    yield s
    s.close()


def test_a_template_that_raises_is_a_400_and_the_server_stays_healthy(raising):
    c = httpx.Client(base_url=raising.url, timeout=60)
    bad = [{"role": "user", "content": "a forbidden word"}]
    for path, body in (("/v1/chat/completions", {"messages": bad, "max_tokens": 4}),
                       ("/v1/messages", {"model": "x", "max_tokens": 4, "messages": bad}),
                       ("/v1/responses", {"input": bad[0]["content"], "max_output_tokens": 4}),
                       ("/api/chat", {"model": "tiny", "stream": False, "messages": bad})):
        r = c.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
        assert "this template refuses the word forbidden" in r.text, (path, r.text)
    assert c.get("/health").status_code == 200
    ok = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length")
    props = c.get("/props").json()
    assert props["chat_format"] == "generic"  # a template that renders no tools: llama.cpp's generic JSON calls


@pytest.fixture(scope="module")
def flagship(tiny):
    """The tiny pair with the Qwen3.5 template (Qwen3.6's format), reasoning kept raw."""
    template = (templates_dir() / "Qwen3.5-4B.jinja").read_text(encoding="utf-8")
    s = LiveServer(tiny.target, tiny.draft, ServeSettings(port=free_port(), reasoning_format="none"), parallel=1,
                   chat_template=template)
    yield s
    s.close()


def test_reasoning_format_none_keeps_the_format_without_reasoning(flagship):
    props = httpx.get(flagship.url + "/props").json()
    assert props["chat_format"] == "qwen3-coder" and props["chat_template_caps"]["supports_reasoning"] is False


def test_reasoning_sent_back_reaches_the_template(flagship):
    """Reasoning an agent returns (OpenAI's reasoning_content, Anthropic's thinking blocks) is rendered
    by the template for the turn after the last question (Qwen3.5 keeps it there): the prompt grows."""
    c = httpx.Client(base_url=flagship.url, timeout=60)
    call = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    tool = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}

    def openai(reasoning: str | None) -> int:
        assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
        if reasoning:
            assistant["reasoning_content"] = reasoning
        body = {"messages": [{"role": "user", "content": "list"}, assistant,
                             {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}], "tools": [tool]}
        return c.post("/v1/chat/completions/input_tokens", json=body).json()["input_tokens"]

    def anthropic(reasoning: str | None) -> int:
        blocks = ([{"type": "thinking", "thinking": reasoning, "signature": "x"}] if reasoning else []) + [
            {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]
        body = {"model": "x", "tools": [{"name": "ls", "input_schema": {"type": "object", "properties": {}}}],
                "messages": [{"role": "user", "content": "list"}, {"role": "assistant", "content": blocks},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]}]}
        return c.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]

    thought = "the user wants the files listed so I call ls"
    assert openai(thought) > openai(None)
    assert anthropic(thought) > anthropic(None)


# -- the template's format, named at start; chat_template_file from the config file ----------------

GLM = "GLM-4.6.jinja"  # <tool_call>name<arg_key>...: a template whose calls are not parsed (test_chat_templates)


def test_a_template_whose_calls_are_not_parsed_is_named_in_one_line_at_start(tiny, tmp_path):
    """`check` and `serve` (its template here from the config file) both state the one line."""
    glm = templates_dir() / GLM
    r = run_cli("check", "--target", str(tiny.target), "--chat-template-file", str(glm))
    assert r.returncode == 0, r.stderr
    assert f"chat format: {NOT_PARSED}" in r.stdout.splitlines(), r.stdout
    config = tmp_path / "serve.toml"
    config.write_text(f"chat_template_file = {json.dumps(str(glm))}\n", encoding="utf-8")
    port = free_port()
    s = Serve("--target", str(tiny.target), "--ctx", "512", "--parallel", "1", "--threads", "1", "--port", str(port),
              "--config", str(config))
    try:
        assert s.wait_line("serving on"), s.output[-3000:]
        assert httpx.get(f"http://127.0.0.1:{port}/props").json()["chat_format"] == "content-only, reasoning <think>...</think>"
    finally:
        s.stop()
    lines = s.output.splitlines()
    assert "specdeck: chat format content-only, reasoning <think>...</think>" in lines, s.output
    assert lines.count(f"specdeck: {NOT_PARSED}") == 1, s.output


def test_check_bench_and_verify_read_chat_template_file_from_the_config_file(tiny, tmp_path, isolated_env):
    config = isolated_env / "config" / "specdeck" / "config.toml"  # the default config file ($XDG_CONFIG_HOME)
    config.parent.mkdir(parents=True)
    hermes = tmp_path / "hermes.jinja"
    hermes.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments}"
        " | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}",
        encoding="utf-8")
    config.write_text(f"chat_template_file = {json.dumps(str(hermes))}\n", encoding="utf-8")
    r = run_cli("check", "--target", str(tiny.target), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["target"]["chat_format"]["name"] == "hermes", r.stdout
    bad = tmp_path / "bad.jinja"  # a template that does not compile: refused before any model is loaded
    bad.write_text("{% for m in messages %}{{ m.content }\n", encoding="utf-8")
    config.write_text(f"chat_template_file = {json.dumps(str(bad))}\n", encoding="utf-8")
    pair = ("--target", str(tiny.target), "--draft", str(tiny.draft), "--ctx", "2048", "--max-tokens", "1")
    for args in (("bench", *pair, "--repeats", "1", "--no-anchors"), ("verify", *pair)):
        r = run_cli(*args)
        assert r.returncode == 1 and f"chat template {bad}: line 1:" in r.stderr, (args[0], r.stdout[-2000:], r.stderr)


# -- reasoning on every API, on the tiny pair ---------------------------------------------------

Q = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def thinker(tiny):
    """The tiny pair with the Qwen3.5 template, reasoning apart (the default), thinking off unless a
    request turns it on (--reasoning-budget 0). Turned on, the prompt opens <think>: a random model
    never closes it, so its every answer is reasoning cut at max_tokens."""
    template = (templates_dir() / "Qwen3.5-4B.jinja").read_text(encoding="utf-8")
    s = LiveServer(tiny.target, tiny.draft, ServeSettings(port=free_port(), reasoning_budget=0), parallel=1, ctx=2048,
                   chat_template=template)
    yield httpx.Client(base_url=s.url, timeout=60)
    s.close()


def test_anthropic_adaptive_thinking_turns_the_templates_thinking_on(thinker):
    def count(thinking: dict | None) -> int:
        body = {"model": "x", "messages": Q, **({"thinking": thinking} if thinking else {})}
        return thinker.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]

    on, off = count({"type": "enabled", "budget_tokens": 1024}), count(None)
    assert on != off and count({"type": "adaptive"}) == on and count({"type": "disabled"}) == off
    body = {"model": "x", "max_tokens": 8, "temperature": 0, "messages": Q}
    adaptive = thinker.post("/v1/messages", json={**body, "thinking": {"type": "adaptive"}}).json()
    assert [b["type"] for b in adaptive["content"]] == ["thinking"] and adaptive["content"][0]["thinking"], adaptive
    plain = thinker.post("/v1/messages", json=body).json()
    assert [b["type"] for b in plain["content"]] == ["text"], plain


def test_reasoning_streams_apart_and_an_answer_cut_inside_it_is_all_reasoning(thinker):
    """Thinking on, max_tokens reached inside the reasoning: every API returns it all as reasoning,
    streamed (OpenAI's reasoning_content deltas, Anthropic's thinking block and thinking_delta events,
    the Responses reasoning item and its reasoning_text events, Ollama's message.thinking chunks) and
    whole, the same greedy text, with empty content and the length finish reason."""
    body = {"messages": Q, "max_tokens": 8, "temperature": 0, "reasoning_effort": "high"}
    whole = thinker.post("/v1/chat/completions", json=body).json()["choices"][0]
    thought = whole["message"].get("reasoning_content")
    assert thought and whole["message"]["content"] == "" and whole["finish_reason"] == "length", whole
    chunks = sse(thinker, "/v1/chat/completions", body)
    deltas = [ch["choices"][0]["delta"] for ch in chunks]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == thought
    assert "".join(d.get("content") or "" for d in deltas) == ""
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    body = {"model": "x", "max_tokens": 8, "temperature": 0, "messages": Q, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    whole = thinker.post("/v1/messages", json=body).json()
    assert whole["content"] == [{"type": "thinking", "thinking": thought, "signature": ""}], whole
    assert whole["stop_reason"] == "max_tokens"
    events = sse(thinker, "/v1/messages", body)
    assert [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"] == ["thinking"]
    block = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert {d["type"] for d in block} == {"thinking_delta", "signature_delta"}, block
    assert "".join(d["thinking"] for d in block if d["type"] == "thinking_delta") == thought
    assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta" and e["delta"]["stop_reason"]] == ["max_tokens"]

    body = {"input": "hello", "max_output_tokens": 8, "temperature": 0, "reasoning": {"effort": "high"}}
    whole = thinker.post("/v1/responses", json=body).json()
    assert [(i["type"], i["content"]) for i in whole["output"]] == [("reasoning", [{"type": "reasoning_text", "text": thought}])]
    assert whole["status"] == "incomplete" and whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert whole["output_text"] == ""
    events = sse(thinker, "/v1/responses", body)
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"] == ["reasoning"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == thought
    assert [e["text"] for e in events if e["type"] == "response.reasoning_text.done"] == [thought]
    assert not [e for e in events if e["type"].startswith("response.output_text")]
    assert events[-1]["type"] == "response.incomplete"
    last = events[-1]["response"]
    assert [i["content"][0]["text"] for i in last["output"] if i["type"] == "reasoning"] == [thought]
    assert last["output_text"] == "" and last["incomplete_details"] == {"reason": "max_output_tokens"}

    name = thinker.get("/api/tags").json()["models"][0]["name"]
    body = {"model": name, "messages": Q, "think": True, "options": {"temperature": 0, "num_predict": 8}}
    whole = thinker.post("/api/chat", json={**body, "stream": False}).json()
    assert whole["message"]["thinking"] == thought and whole["message"]["content"] == ""
    assert whole["done_reason"] == "length"
    lines = ndjson(thinker, "/api/chat", body)
    assert "".join(ln["message"].get("thinking", "") for ln in lines) == thought
    assert any(ln["message"].get("thinking") for ln in lines[:-1])  # streamed as it came, not only at the end
    assert "".join(ln["message"]["content"] for ln in lines) == ""
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "length"


RAW = "<think>\nplan\n</think>\n\nanswer"


def _exactly(text: str) -> str:
    """A grammar that makes the model write exactly this text (GBNF's string literals are JSON's)."""
    return f"root ::= {json.dumps(text)}"


def test_reasoning_format_none_returns_the_raw_think_text_in_content(flagship, thinker):
    body = {"messages": Q, "max_tokens": 40, "temperature": 0, "reasoning_effort": "none", "grammar": _exactly(RAW)}
    flagship_c = httpx.Client(base_url=flagship.url, timeout=60)
    raw = flagship_c.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert raw["message"]["content"] == RAW and "reasoning_content" not in raw["message"], raw
    deltas = [ch["choices"][0]["delta"] for ch in sse(flagship_c, "/v1/chat/completions", body)]
    assert "".join(d.get("content") or "" for d in deltas) == RAW
    assert not any(d.get("reasoning_content") for d in deltas)
    apart = thinker.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]  # the default: apart
    assert (apart["reasoning_content"], apart["content"]) == ("plan", "answer"), apart
    # thinking on (the prompt opens <think>): Anthropic too returns what the model wrote as text, no thinking block
    on = flagship_c.post("/v1/messages", json={"model": "x", "max_tokens": 8, "temperature": 0, "messages": Q,
                                               "thinking": {"type": "enabled", "budget_tokens": 1024}}).json()
    assert [b["type"] for b in on["content"]] == ["text"] and on["content"][0]["text"], on


WEATHER = {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}
MALFORMED = [
    "<tool_call>\n<function=nosuch>\n</function>\n</tool_call>",  # a function not offered
    "<tool_call>\n<function=get_weather>\nOslo\n</function>\n</tool_call>",  # text where parameters go
    "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo",  # cut short
]


@pytest.mark.parametrize("text", MALFORMED, ids=["unknown-function", "no-parameters", "cut-short"])
def test_a_malformed_call_from_the_model_comes_back_as_text(thinker, text):
    """The model's answer is made a broken call by the grammar: a 200 with the text as content, no
    tool call, whole and streamed, and the server stays healthy."""
    body = {"messages": Q, "tools": [{"type": "function", "function": WEATHER}], "max_tokens": 200, "temperature": 0,
            "grammar": _exactly(text)}
    r = thinker.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == text and not choice["message"].get("tool_calls"), choice
    assert choice["finish_reason"] == "stop"
    chunks = sse(thinker, "/v1/chat/completions", body)
    deltas = [ch["choices"][0]["delta"] for ch in chunks if "error" not in ch]
    assert len(deltas) == len(chunks) and "".join(d.get("content") or "" for d in deltas) == text
    assert not any(d.get("tool_calls") for d in deltas) and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert thinker.get("/health").status_code == 200


def test_reasoning_items_and_ollama_thinking_sent_back_reach_the_template(flagship):
    """As test_reasoning_sent_back_reaches_the_template for OpenAI and Anthropic: a Responses
    reasoning item before a function call, and Ollama's message.thinking, reach the template as the
    assistant message's reasoning_content."""
    c = httpx.Client(base_url=flagship.url, timeout=60)
    thought = "the user wants the files listed so I call ls"

    def openai(reasoning: str | None) -> int:
        assistant = {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}
        if reasoning:
            assistant["reasoning_content"] = reasoning
        body = {"messages": [{"role": "user", "content": "list"}, assistant,
                             {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}]}
        return c.post("/v1/chat/completions/input_tokens", json=body).json()["input_tokens"]

    def responses(reasoning: str | None) -> int:
        items = [{"type": "message", "role": "user", "content": "list"}]
        if reasoning:
            items.append({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": reasoning}]})
        items += [{"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}]
        r = c.post("/v1/responses", json={"input": items, "max_output_tokens": 1})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["input_tokens"]

    assert openai(None) < openai(thought)
    assert responses(None) == openai(None) and responses(thought) == openai(thought)

    # Ollama tells how many prompt tokens it evaluated (the prompt cache's part left out): the same
    # conversation with the thinking sent back, after the one without, evaluates more only if the
    # thinking is in the prompt (without it, the prompt is the one just evaluated, all of it cached)
    long_thought = " ".join([thought] * 8)

    def ollama(thinking: str | None) -> int:
        assistant = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "ls", "arguments": {}}}]}
        if thinking:
            assistant["thinking"] = thinking
        body = {"model": "tiny", "stream": False, "options": {"num_predict": 1}, "messages": [
            {"role": "user", "content": "ollama, list"}, assistant, {"role": "tool", "tool_name": "ls", "content": "a.txt"}]}
        r = c.post("/api/chat", json=body)
        assert r.status_code == 200, r.text
        return r.json()["prompt_eval_count"]

    without = ollama(None)
    assert ollama(long_thought) > without
