"""Bad input around chat formats: a template file that does not compile stops the start in one line
naming the line at fault; a template whose calls are not parsed is named in one line at start
(`check` and `serve`); `chat_template_file` is read from the config file; a template that raises on
a request's messages answers that request 400 with the template's own message, and the server stays
healthy; a model answer in a broken call format comes back as text (tiny random models answer
nonsense: it must still be a 200)."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import run_cli
from support.live import LiveServer, Serve, free_port
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

