#!/usr/bin/env python3
"""Cheap probes of the llama-server semantics that the suite's failing (or not reached) tests
check, against one specdeck started through llama-server-shim with the suite's tinyllama2
preset flags. Each probe prints the request, what llama-server answers (from the suite's
assertions and tools/server sources) and what specdeck answered. Generation is kept to a
few tokens so it runs in a few minutes on a CPU.

Usage: suite venv python probe.py [PORT]   (run.sh's venv: /tmp/llsuite-venv)
"""
import json
import os
import subprocess
import sys
import time

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 18090
BASE = f"http://127.0.0.1:{PORT}"


def start(extra=()):
    args = [os.path.join(HERE, "llama-server-shim"), "--port", str(PORT), "--host", "127.0.0.1",
            "--hf-repo", "ggml-org/test-model-stories260K", "--alias", "tinyllama-2",
            "--ctx-size", "512", "--parallel", "2", "--n-predict", "64", "--slots", *extra]
    log = open(f"/tmp/probe-server-{PORT}.log", "w")
    p = subprocess.Popen(args, stdout=log, stderr=log)
    for _ in range(600):
        try:
            if requests.get(BASE + "/health", timeout=1).status_code == 200:
                return p
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SystemExit("server did not start")


def short(x, n=400):
    s = json.dumps(x) if not isinstance(x, str) else x
    return s if len(s) <= n else s[:n] + "..."


def show(name, req, expected, actual):
    print(f"## {name}\nrequest: {short(req, 600)}\nllama-server: {expected}\nspecdeck: {short(actual, 900)}\n", flush=True)


def post(path, body, **kw):
    r = requests.post(BASE + path, json=body, timeout=300, **kw)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def stream(path, body):
    r = requests.post(BASE + path, json=body, stream=True, timeout=300)
    out = []
    for line in r.iter_lines():
        line = line.decode()
        if line.startswith("data: ") and "[DONE]" not in line:
            out.append(json.loads(line[6:]))
    return r.status_code, out


def main():
    p = start()
    try:
        # /models and /v1/models
        for path in ("/models", "/v1/models"):
            r = requests.get(BASE + path).json()
            show(f"GET {path}", None, "data has 1 entry, id = the alias (tinyllama-2), aliases=[...] (test_server_models)",
                 [{k: m.get(k) for k in ("id", "aliases")} for m in r["data"]])
        r = requests.get(BASE + "/props").json()
        show("GET /props", None, "model_path ends in .gguf; model_alias = --alias; default_generation_settings.params.seed = --seed (test_server_props)",
             {"model_path": r.get("model_path"), "model_alias": r.get("model_alias"),
              "seed": r.get("default_generation_settings", {}).get("params", {}).get("seed")})

        body = {"prompt": "I believe the meaning of life is", "n_predict": 3, "stream": True}
        code, ev = stream("/completion", body)
        show("POST /completion stream: token ids per chunk", body,
             "every non-final chunk has tokens=[<id>] (server-context.cpp send_partial_response: res->tokens.assign(1, tkn.tok); test_completion_stream)",
             [{"content": e.get("content"), "tokens": e.get("tokens"), "stop": e.get("stop")} for e in ev])
        final = ev[-1] if ev else {}
        gs = final.get("generation_settings", {})
        show("POST /completion stream: final chunk", body,
             "stop_type 'limit', generation_settings.n_predict = min(req, --n-predict), seed = --seed, adaptive_target/adaptive_decay keys",
             {"stop_type": final.get("stop_type"), "n_predict": gs.get("n_predict"), "seed": gs.get("seed"),
              "has adaptive_target": "adaptive_target" in gs, "has logit_bias": "logit_bias" in gs})

        body = {"prompt": "Once upon a time", "n_predict": 2, "ignore_eos": True, "temperature": 0.0}
        code, r = post("/completion", body)
        show("POST /completion ignore_eos -> generation_settings.logit_bias", body,
             "generation_settings.logit_bias = [{token: <eog id>, bias: null (-inf)}, ...]; [] without ignore_eos (test_ignore_eos)",
             {"status": code, "logit_bias": r.get("generation_settings", {}).get("logit_bias", "<missing>")})

        body = {"prompt": "the quick brown fox jumps over the lazy dog", "n_predict": 2}
        post("/completion", body)
        code, r = post("/completion", body)
        show("POST /completion twice: timings", body,
             "timings has cache_n (prompt tokens reused), prompt_n, predicted_n, *_per_second, *_per_token_ms, all finite numbers (test_metrics_prompt_processed_and_cached, test_metrics_timings_are_finite)",
             r.get("timings"))

        body = {"prompt": "I believe", "n_predict": 1}
        code, r = post("/completion", body)
        show("POST /completion n_predict=1: first-token rate", body,
             "timings.predicted_per_second == 0.0 and predicted_per_token_ms == 0.0 (the first token costs no decode; test_metrics_generation_rate_excludes_first_token)",
             {k: r.get("timings", {}).get(k) for k in ("predicted_n", "predicted_per_second", "predicted_per_token_ms", "acceptance")})

        body = {"prompt": "the quick brown fox jumps over the lazy dog " * 8, "n_predict": 2, "stream": True,
                "timings_per_token": True, "return_progress": True}
        code, ev = stream("/completion", body)
        show("POST /completion stream return_progress + timings_per_token", {**body, "prompt": "<80 tokens>"},
             "chunks with prompt_progress {total, cache, processed, time_ms} (more than one for a prompt over n_batch), each with timings (test_metrics_timings_on_prompt_progress, test_return_progress)",
             {"n_chunks": len(ev), "n_with_prompt_progress": sum("prompt_progress" in e for e in ev),
              "n_with_timings": sum("timings" in e for e in ev), "first_keys": sorted(ev[0].keys()) if ev else None})

        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
        code, ev = stream("/chat/completions", body)
        show("POST /chat/completions stream: first chunk and model", body,
             "first chunk delta {role: assistant, content: null}; every chunk model = the alias ('tinyllama-2'); system_fingerprint starts with 'b' (test_chat_completion_stream)",
             {"first_delta": ev[0]["choices"][0]["delta"] if ev else None, "model": ev[0].get("model") if ev else None,
              "system_fingerprint": ev[0].get("system_fingerprint") if ev else None})

        body = {"messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}] * 100}
        code, r = post("/chat/completions", body)
        show("POST /chat/completions prompt over the context", {"messages": "<200 messages>"},
             "400, error.type exceed_context_size_error, error.n_prompt_tokens > 0, error.n_ctx = slot context (test_context_size_exceeded)",
             {"status": code, "error": r.get("error") if isinstance(r, dict) else r})

        body = {"prompt": "I believe the meaning of life is" * 32, "cache_prompt": False, "n_predict": 2}
        code, r = post("/completion", body)
        show("POST /completion prompt longer than the slot (224 tokens here, slot 256/512)", {"prompt": "'I believe the meaning of life is' * 32"},
             "400 (test_nocache_long_input_prompt: stories260K counts ~290 tokens > 256)", {"status": code, "body": r})

        body = {"prompt": {"prompt_string": "I believe the meaning of life is"}, "n_predict": 2}
        code, r = post("/completion", body)
        show("POST /completion JSON prompt object", body, "200 (test_json_prompt_no_mtmd)", {"status": code, "body": short(r, 200)})
        body = {"prompt": {"prompt_string": "I believe <__media__>", "multimodal_data": "iVBORw0KGgo="}, "n_predict": 2}
        code, r = post("/completion", body)
        show("POST /completion JSON prompt with multimodal_data, no mmproj", body, "non-200 (test_json_prompt_mtm_error_when_not_supported)", {"status": code, "body": short(r, 200)})

        code, tok = post("/tokenize", {"content": "I believe the meaning of life is", "add_special": True})
        toks = tok["tokens"]
        for name, prompt in (("tokens", toks), ("[tokens, tokens]", [toks, toks]), ("[tokens, str]", [toks, "I believe the meaning of life is"]),
                             ("[tokens, {prompt_string}]", [toks, {"prompt_string": "I believe the meaning of life is"}]),
                             ("mixed ids and strings in one prompt", [1, 2, 3, "I believe", 7, 8])):
            body = {"prompt": prompt, "n_predict": 2, "temperature": 0.0}
            code, r = post("/completion", body)
            show(f"POST /completion prompt={name}", body, "200; a list of prompts answers a list of results (test_completion_with_tokens_input)",
                 {"status": code, "type": type(r).__name__, "len": len(r) if isinstance(r, list) else None,
                  "contents": [x.get("content") for x in r] if isinstance(r, list) else (r.get("content") if isinstance(r, dict) else r)})

        body = {"prompt": "I believe the meaning of life is", "n_predict": 2, "response_fields": ["content", "generation_settings/n_predict", "prompt"]}
        code, r = post("/completion", body)
        show("POST /completion response_fields", body,
             "only the 3 fields, 'generation_settings/n_predict' flattened, prompt = the rendered prompt (test_completion_response_fields)",
             {"status": code, "keys": sorted(r.keys()) if isinstance(r, dict) else r})

        body = {"prompt": "I believe the meaning of life is", "n_probs": 3, "temperature": 0.0, "n_predict": 2}
        code, r = post("/completion", body)
        cp = r.get("completion_probabilities") if isinstance(r, dict) else None
        show("POST /completion n_probs", body, "completion_probabilities: [{id, token, logprob, bytes, top_logprobs:[{id, token, logprob, bytes}] x n_probs}] (test_n_probs)",
             {"status": code, "first": cp[0] if cp else cp})
        body = {**body, "post_sampling_probs": True, "temperature": 1.0}
        code, r = post("/completion", body)
        cp = r.get("completion_probabilities") if isinstance(r, dict) else None
        show("POST /completion n_probs post_sampling_probs", body, "entries have prob (0,1] and top_probs (test_n_probs_post_sampling)",
             {"status": code, "first": cp[0] if cp else cp})

        body = {"prompt": "What is the best book", "n_predict": 4, "temperature": 0.0, "logit_bias": [[" the ", -100], [" a ", -100]]}
        code, r = post("/completion", body)
        show("POST /completion logit_bias as [[string, bias]]", body, "200; string entries are tokenized (test_logit_bias)", {"status": code, "body": short(r, 200)})
        body = {**body, "logit_bias": {" the ": -100}}
        code, r = post("/completion", body)
        show("POST /completion logit_bias as {string: bias}", body, "200 (test_logit_bias openai_style)", {"status": code, "body": short(r, 200)})

        body = {"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}], "n": 2}
        code, r = post("/chat/completions", body)
        show("POST /chat/completions n=2", body, "200, 2 choices (test_chat_completions_multiple_choices)",
             {"status": code, "n_choices": len(r.get("choices", [])) if isinstance(r, dict) else r})
        body = {"messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]}
        code, r = post("/chat/completions/input_tokens", body)
        show("POST /chat/completions/input_tokens", body, "200 {input_tokens: N} (test_chat_completions_token_count)", {"status": code, "body": r})
        body = {"max_tokens": 2, "messages": [{"role": "user", "content": "Book"}], "verbose": True}
        code, r = post("/chat/completions", body)
        show("POST /chat/completions verbose=true", body, "body has __verbose with the rendered prompt (test_verbose_debug)",
             {"status": code, "has __verbose": isinstance(r, dict) and "__verbose" in r})
        body = {"max_tokens": 2, "add_generation_prompt": True, "continue_final_message": True,
                "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
        code, r = post("/chat/completions", body)
        show("POST /chat/completions add_generation_prompt + continue_final_message", body, "400 (test_chat_template_continue_final_message_mutual_exclusion)", {"status": code})
        body = {"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}], "grammar": "root ::= this is (not valid GBNF"}
        code, r = post("/chat/completions", body)
        show("POST /chat/completions invalid grammar", body, "400 (test_completion_with_invalid_grammar)", {"status": code})
        for rf in ({"type": "sound"}, {"type": "json_object", "schema": 123}, {"type": "json_object", "schema": {"type": "hiccup"}}):
            body = {"max_tokens": 2, "messages": [{"role": "user", "content": "Write an example"}], "response_format": rf}
            code, r = post("/chat/completions", body)
            show("POST /chat/completions bad response_format", body, "400 (test_completion_with_response_format)", {"status": code})
        for msgs in (None, "string", [123], [{}], [{"role": 123}], [{"role": "system", "content": 123}], [{"role": "system", "content": "test"}, {}],
                     [{"role": "user", "content": "test"}, {"role": "assistant", "content": "test"}, {"role": "assistant", "content": "test"}]):
            code, r = post("/chat/completions", {"messages": msgs, "max_tokens": 1})
            show("POST /chat/completions invalid messages", {"messages": msgs}, "400 or 500 with error (test_invalid_chat_completion_req)", {"status": code})
        body = {"max_tokens": 3, "messages": [{"role": "user", "content": "test"}], "stream": True,
                "stream_options": {"include_usage": True}, "timings_per_token": True}
        code, ev = stream("/chat/completions", body)
        show("POST /chat/completions stream timings_per_token", body,
             "first chunk without timings; the usage chunk (choices: []) has timings with prompt_per_second, predicted_per_second, predicted_n (test_chat_completion_with_timings_per_token)",
             [{"choices": bool(e.get("choices")), "timings": "timings" in e, "usage": "usage" in e} for e in ev])
        body = {"max_tokens": 2, "messages": [{"role": "user", "content": "This is a test" * 10}], "stream": True, "return_progress": True}
        code, ev = stream("/chat/completions", body)
        show("POST /chat/completions stream return_progress", body, "chunks carry prompt_progress {total, cache, processed} (test_return_progress)",
             {"n_with_prompt_progress": sum("prompt_progress" in e for e in ev)})
        body = {"input": "This is a test" * 10, "max_output_tokens": 2, "stream": True, "timings_per_token": True, "return_progress": True}
        code, ev = stream("/responses", body)
        show("POST /responses stream return_progress + timings_per_token", body,
             "response.in_progress events with prompt_progress; output_text.delta events with timings; response.completed with timings (test_responses_stream_with_llama_telemetry)",
             {"status": code, "types": [e.get("type") for e in ev], "with_progress": sum("prompt_progress" in e for e in ev),
              "with_timings": sum("timings" in e for e in ev)})

        code, r = post("/apply-template", {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": False})
        show("POST /apply-template add_generation_prompt=false", {"messages": "[user Hi]", "add_generation_prompt": False},
             "prompt without the assistant header (test_add_generation_prompt)", r)

        r = requests.options(BASE + "/completions", headers={"Origin": "http://localhost", "Access-Control-Request-Method": "POST",
                                                              "Access-Control-Request-Headers": "Authorization"})
        show("OPTIONS /completions (no --cors-origins)", "Origin: http://localhost", "200 with Access-Control-Allow-Origin reflected (test_cors_options)",
             {"status": r.status_code, "acao": r.headers.get("Access-Control-Allow-Origin")})

        r = requests.get(BASE + "/slots").json()
        show("GET /slots", None, "per slot: id, n_ctx (= ctx/parallel unless --kv-unified), is_processing, no 'params' key (test_server_slots)",
             [{k: s.get(k) for k in ("id", "n_ctx", "is_processing")} | {"has params": "params" in s} for s in r])

        code, r = post("/slots/0?action=save", {"filename": "slot0.bin"})
        show("POST /slots/0?action=save", {"filename": "slot0.bin"}, "200 with n_saved (with --slot-save-path) (test_slot_save)", {"status": code, "body": r})
        r = requests.get(BASE + "/metrics")
        show("GET /metrics", None, "501 without --metrics; with it llamacpp:* names and a Process-Start-Time-Unix header (test_metrics)",
             {"status": r.status_code, "Process-Start-Time-Unix": r.headers.get("Process-Start-Time-Unix"),
              "names": sorted({l.split()[0].split("{")[0] for l in r.text.splitlines() if l and not l.startswith("#")})[:40]})
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


if __name__ == "__main__":
    main()
