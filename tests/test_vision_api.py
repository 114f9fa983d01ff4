"""Pictures through every API, on the tiny pair with a projector stand-in (write_mmproj) beside the
target: each API's image shape reaches the engine, a resent picture is served from the cache, and
every bad image is a clear 4xx naming its part, with the server healthy after it."""

from __future__ import annotations

import base64
import io

import anthropic
import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from app.gguf.synthetic import write_mmproj
from app.llama.context import Model
from app.server.settings import ServeSettings
from support.live import LiveServer, free_port
from support.tinymodels import write_tiny_model

TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
PER_IMAGE = 16  # the stand-in's tokens an image: (32 / 8)^2


def encoded(seed: int, fmt: str = "PNG", size=(40, 30)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


@pytest.fixture(scope="module")
def seeing(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision")
    target = write_tiny_model(d / "target.gguf", seed=0, chat_template=TEMPLATE)
    draft = write_tiny_model(d / "draft.gguf", seed=1, n_layers=1, chat_template=TEMPLATE)
    model = Model(target)
    mmproj = write_mmproj(d / "mmproj.gguf", model.n_embd_inp)
    model.close()
    s = LiveServer(target, draft, ServeSettings(port=free_port(), max_image_bytes=200_000, max_image_pixels=300 * 300),
                   ctx=512, mmproj=mmproj)
    yield s
    s.close()


def oai_content(*images: bytes, text: str = "what is this") -> list[dict]:
    return [{"type": "text", "text": text}] + [{"type": "image_url", "image_url": {"url": data_uri(i)}} for i in images]


def chat(url: str, content, **more) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=60,
                      json={"messages": [{"role": "user", "content": content}], "max_tokens": 3, "temperature": 0, **more})


def test_an_openai_image_is_read_and_a_resent_one_comes_from_the_cache(seeing):
    a, b = encoded(1), encoded(2)
    first = chat(seeing.url, oai_content(a)).json()
    assert first["usage"]["prompt_tokens"] > PER_IMAGE
    again = chat(seeing.url, oai_content(a)).json()
    # everything but the last token is reused, the image's positions included (it is not encoded again)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == first["usage"]["prompt_tokens"] - 1
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    other = chat(seeing.url, oai_content(b)).json()
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] < first["usage"]["prompt_tokens"] - PER_IMAGE


def test_each_api_s_image_shape_reaches_the_engine(seeing):
    """One image more is PER_IMAGE prompt tokens more, on every API (Ollama counts the tokens it
    evaluated: each API gets pictures of its own, and the one-image request comes first, so both
    reuse only the template's opening)."""
    url = seeing.url

    def openai_chat(imgs):
        return chat(url, oai_content(*imgs)).json()["usage"]["prompt_tokens"]

    def anthropic_messages(imgs):
        c = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
        blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(i)}} for i in imgs]
        return c.messages.create(model="x", max_tokens=3, messages=[{"role": "user", "content": blocks + [
            {"type": "text", "text": "what is this"}]}]).usage.input_tokens

    def anthropic_tool_result(imgs):
        c = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
        shot = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(i)}} for i in imgs]
        msgs = [{"role": "user", "content": "take a screenshot"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": shot}]}]
        return c.messages.count_tokens(model="x", messages=msgs).input_tokens

    def responses(imgs):
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        parts = [{"type": "input_text", "text": "what is this"}] + [{"type": "input_image", "image_url": data_uri(i)}
                                                                    for i in imgs]
        return c.responses.create(model="x", input=[{"role": "user", "content": parts}], max_output_tokens=3).usage.input_tokens

    def ollama_chat(imgs):
        r = httpx.post(f"{url}/api/chat", timeout=60, json={"model": "tiny", "stream": False, "messages": [
            {"role": "user", "content": "what is this", "images": [b64(i) for i in imgs]}], "options": {"num_predict": 3}})
        return r.json()["prompt_eval_count"]

    def ollama_generate(imgs):
        r = httpx.post(f"{url}/api/generate", timeout=60, json={"model": "tiny", "stream": False, "prompt": "what is this",
                                                                "images": [b64(i) for i in imgs], "options": {"num_predict": 3}})
        return r.json()["prompt_eval_count"]

    def llama_server(imgs):
        r = httpx.post(f"{url}/completion", timeout=60, json={"n_predict": 3, "prompt": {
            "prompt_string": "look " + "<__media__>" * len(imgs), "multimodal_data": [b64(i) for i in imgs]}})
        return r.json()["tokens_evaluated"]

    apis = (openai_chat, anthropic_messages, anthropic_tool_result, responses, ollama_chat, ollama_generate, llama_server)
    for i, api in enumerate(apis):
        one, two = encoded(100 + i), encoded(200 + i, "JPEG")
        n1, n2 = api([two]), api([one, two])
        assert n2 - n1 == PER_IMAGE, api.__name__


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_every_format_is_read(seeing, fmt):
    r = chat(seeing.url, oai_content(encoded(5, fmt)))
    assert r.status_code == 200, r.text


def test_bad_images_are_a_clear_4xx_naming_the_part_and_the_server_stays_healthy(seeing):
    url = seeing.url
    buf = io.BytesIO()
    Image.new("RGB", (400, 300), (20, 120, 220)).save(buf, "PNG")  # 120,000 pixels over the 90,000 allowed, few bytes
    big = buf.getvalue()
    cases = [
        (oai_content(b"not an image at all"), 400, "messages.0.content.1: not an image"),
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}], 400, "not valid base64"),
        ([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}], 400, "--allow-image-urls"),
        ([{"type": "image_url", "image_url": {"url": "ftp://example.com/a.png"}}], 400, "data: URI or http(s)"),
        (oai_content(big), 413, "messages.0.content.1: the image is 400x300 pixels"),
        (oai_content(b"x" * 210_000), 413, "--max-image-bytes"),
        (oai_content(encoded(7, "BMP")), 415, "BMP images are not taken"),
        (oai_content(*[encoded(i) for i in range(40)]), 400, "for its 40 image(s)"),
        ([{"type": "input_audio", "input_audio": {}}], 400, "'input_audio' is not supported"),
    ]
    for content, status, says in cases:
        r = chat(url, content)
        assert r.status_code == status and says in r.json()["error"]["message"], (says, r.status_code, r.text)
        assert httpx.get(f"{url}/health").status_code == 200
    c = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="messages.0.content.0: an image's source must be base64 or url"):
        c.messages.create(model="x", max_tokens=3, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
    r = httpx.post(f"{url}/completion", json={"prompt": {"prompt_string": "no marker", "multimodal_data": [b64(encoded(1))]}})
    assert r.status_code == 400 and "1 image(s)" in r.json()["error"]["message"]
    assert chat(url, oai_content(encoded(1))).status_code == 200  # and it still answers


def test_image_urls_are_fetched_only_when_allowed_within_the_limits(seeing, tmp_path):
    import functools
    import http.server
    import threading

    (tmp_path / "shot.png").write_bytes(encoded(8))
    (tmp_path / "huge.png").write_bytes(b"\x89PNG" + b"0" * 300_000)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{files.server_address[1]}"
    part = lambda name: [{"type": "image_url", "image_url": {"url": f"{base}/{name}"}}]  # noqa: E731
    try:
        assert "--allow-image-urls" in chat(seeing.url, part("shot.png")).json()["error"]["message"]
        seeing.settings.allow_image_urls = True
        by_url = chat(seeing.url, part("shot.png")).json()
        inline = chat(seeing.url, [{"type": "image_url", "image_url": {"url": data_uri(encoded(8))}}]).json()
        assert by_url["usage"]["prompt_tokens"] == inline["usage"]["prompt_tokens"]
        assert inline["usage"]["prompt_tokens_details"]["cached_tokens"] == inline["usage"]["prompt_tokens"] - 1  # same pixels
        gone = chat(seeing.url, part("missing.png"))
        assert gone.status_code == 400 and "HTTP 404" in gone.json()["error"]["message"]
        huge = chat(seeing.url, part("huge.png"))
        assert huge.status_code == 413 and "--max-image-bytes" in huge.json()["error"]["message"]
    finally:
        seeing.settings.allow_image_urls = False
        files.shutdown()


def test_check_and_verify_take_the_projector_and_serve_refuses_one_made_for_another_model(tmp_path):
    import json

    from conftest import run_cli

    target = write_tiny_model(tmp_path / "t.gguf", seed=0, chat_template=TEMPLATE)
    draft = write_tiny_model(tmp_path / "d.gguf", seed=1, n_layers=1, chat_template=TEMPLATE)
    model = Model(target)
    good = write_mmproj(tmp_path / "good.gguf", model.n_embd_inp)
    bad = write_mmproj(tmp_path / "bad.gguf", model.n_embd_inp * 2)
    model.close()
    ok = run_cli("check", "--target", str(target), "--mmproj", str(good), "--no-probe")
    assert ok.returncode == 0 and "vision projector fits" in ok.stdout and "16 tokens an image" in ok.stdout, ok.stdout
    no = run_cli("check", "--target", str(target), "--mmproj", str(bad), "--no-probe")
    assert no.returncode == 2 and "a projector made for another model" in no.stdout
    (tmp_path / "shot.png").write_bytes(encoded(9))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "what is on the screen", "images": ["shot.png", "shot.png"], "kind": "image"}) + "\n")
    v = run_cli("verify", "--target", str(target), "--draft", str(draft), "--mmproj", str(good), "--prompts", str(prompts),
                "--max-tokens", "24", "--ctx", "512", "--json")
    assert v.returncode == 0, v.stderr
    r = json.loads(v.stdout)["prompts"][0]
    assert r["identical"] and r["invariant_violations"] == 0 and r["prompt_tokens"] > 2 * PER_IMAGE
    s = run_cli("serve", "--target", str(target), "--draft", str(draft), "--mmproj", str(bad), "--port", str(free_port()),
                "--ctx", "512")
    assert s.returncode != 0 and "a projector made for another model" in s.stderr and "Traceback" not in s.stderr, s.stderr
    from support.live import Serve

    port = free_port()
    served = Serve("--target", str(target), "--draft", str(draft), "--mmproj", str(good), "--ctx", "512", "--parallel", "1",
                   "--threads", "1", "--port", str(port))
    try:
        assert served.wait_line("serving on"), served.output[-3000:]
        assert "images through good.gguf" in served.output
        r = chat(f"http://127.0.0.1:{port}", oai_content(encoded(13)))
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > PER_IMAGE, r.text
        assert httpx.get(f"http://127.0.0.1:{port}/props").json()["modalities"]["vision"] is True
    finally:
        assert served.stop() == 0


def test_fuzzed_image_parts_get_an_answer_or_a_4xx_and_nothing_breaks(seeing):
    """Damaged images (cut, bytes flipped, random bytes, odd data: URIs, wrong types) on three APIs:
    each is answered or refused with a 4xx in the API's shape, never a 5xx, and the server stays up."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    png = encoded(11)
    damaged = st.one_of(
        st.binary(max_size=200),
        st.builds(lambda n: png[:n], st.integers(0, len(png))),
        st.builds(lambda i, b: png[:i] + bytes([b]) + png[i + 1:], st.integers(0, len(png) - 1), st.integers(0, 255)),
    )
    value = st.one_of(damaged.map(data_uri), damaged.map(b64), st.sampled_from(
        ["data:", "data:image/png,abc", "data:;base64,", "", "http://", "file:///etc/passwd", "x" * 300]),
        st.integers(), st.none(), st.lists(st.integers(), max_size=3))
    api = st.sampled_from(["openai", "anthropic", "ollama"])

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(value=value, api=api)
    def one(value, api):
        if api == "openai":
            r = httpx.post(f"{seeing.url}/v1/chat/completions", timeout=60, json={"max_tokens": 1, "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": value}}]}]})
        elif api == "anthropic":
            r = httpx.post(f"{seeing.url}/v1/messages", timeout=60, json={"model": "x", "max_tokens": 1, "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": value}}]}]})
        else:
            r = httpx.post(f"{seeing.url}/api/chat", timeout=60, json={"model": "tiny", "stream": False, "messages": [
                {"role": "user", "content": "a", "images": [value]}], "options": {"num_predict": 1}})
        assert r.status_code == 200 or 400 <= r.status_code < 500, (api, r.status_code, r.text)
        if r.status_code >= 400:
            body = r.json()
            assert "error" in body and ("Traceback" not in r.text)

    one()
    assert chat(seeing.url, oai_content(encoded(12))).status_code == 200


def test_pull_fetches_and_verifies_a_presets_projector_from_the_hub(tmp_path):
    """A preset naming a projector: `pull` fetches it from the hub with the model and checks its
    SHA-256 (the same fetcher as every model file); `--no-mmproj` leaves it out."""
    import hashlib

    from conftest import run_cli
    from support.fakehub import FakeHub

    target = write_tiny_model(tmp_path / "t.gguf", seed=0, chat_template=TEMPLATE)
    model = Model(target)
    mmproj = write_mmproj(tmp_path / "mm.gguf", model.n_embd_inp)
    model.close()
    sha = hashlib.sha256(mmproj.read_bytes()).hexdigest()
    catalog = tmp_path / "models.toml"
    catalog.write_text(f"""default_gpu_preset = "seeing"
default_cpu_preset = "seeing"
[models.t]
repo = "acme/t-GGUF"
file = "t.gguf"
[models.v]
repo = "acme/t-GGUF"
file = "mmproj-F16.gguf"
sha256 = "{sha}"
[presets.seeing]
description = "a tiny model that sees"
target = "t"
mmproj = "v"
context = 512
hardware = "cpu"
""")
    hub = FakeHub()
    url = hub.start()
    try:
        hub.add("acme/t-GGUF", "t.gguf", target.read_bytes())
        hub.add("acme/t-GGUF", "mmproj-F16.gguf", mmproj.read_bytes())
        env = {"HF_ENDPOINT": url}
        p = run_cli("--models", str(catalog), "pull", "seeing", env=env)
        assert p.returncode == 0 and "ok mmproj v" in p.stdout and sha in p.stdout, p.stdout + p.stderr
        text = run_cli("--models", str(catalog), "pull", "seeing", "--no-mmproj", env=env)
        assert text.returncode == 0 and "mmproj" not in text.stdout
        c = run_cli("--models", str(catalog), "check", "seeing", "--no-probe", env=env)
        assert c.returncode == 0 and "vision projector fits" in c.stdout, c.stdout + c.stderr
    finally:
        hub.stop()
