"""The HTTP edge of the server (sf_trt/serve/guard.py, server.py, tokenize.py and the routes):
what is refused before a body is read, limits and timeouts on slow or large clients, the
drain's 503, the envelope of every error, and the smaller routes. Each test is one bug the
issue names; real uvicorn on 127.0.0.1, every wait bounded."""

from __future__ import annotations

import asyncio
import codecs
import json
import socket
import threading
import time

import httpx
import openai
import pytest

from sf_trt.engine_loop import LoopConfig
from sf_trt.tokenizer import ByteTokenizer

from servers import FAKE, TOK, SlowFake, live_server, wait_for

# -- helpers ---------------------------------------------------------------------------------------


def envelope(resp) -> dict:
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == resp.status_code
    return body["error"]


def raw_exchange(url: str, head: bytes, body: bytes = b"", timeout_s: float = 5.0) -> tuple[bytes, float]:
    """Send ``head`` (and the start of a body) on a raw socket; what comes back until the
    server closes, and how long that took. The body a Content-Length promises is never sent
    in full: an answer proves the server did not wait for it."""
    host, port = url.removeprefix("http://").split(":")
    t0 = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(head + body)
        chunks = []
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks), time.monotonic() - t0


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def json_of(raw: bytes) -> dict:
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


def head(path: str, length: int, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", "Content-Type: application/json", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# -- refused before the body is read ----------------------------------------------------------------


def test_a_body_that_is_not_json_is_a_415_that_does_not_echo_it(fake_server):
    body = b"prompt=" + b"x" * 200_000
    resp = httpx.post(f"{fake_server.url}/v1/completions", content=body, timeout=10,
                      headers={"Content-Type": "application/x-www-form-urlencoded"})  # curl -d's default
    err = envelope(resp)
    assert resp.status_code == 415 and err["type"] == "UnsupportedMediaTypeError"
    assert "application/x-www-form-urlencoded" in err["message"] and len(resp.content) < 500
    # no Content-Type at all is read as JSON, and so is JSON with a charset or a +json type;
    # a JSON body that does not parse is a short 400
    for kind in (None, "application/json; charset=utf-8", "application/vnd.api+json"):
        ok = httpx.post(f"{fake_server.url}/v1/completions", content=b'{"prompt": "ab", "max_tokens": 2}', timeout=10,
                        headers={"Content-Type": kind} if kind else {})
        assert ok.status_code == 200, (kind, ok.text)
    bad = httpx.post(f"{fake_server.url}/v1/completions", content=b'{"prompt": "' + b"x" * 100_000, timeout=10,
                     headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and "not valid JSON" in envelope(bad)["message"] and len(bad.content) < 500


def test_a_body_over_max_body_bytes_is_a_413_before_it_is_read():
    with live_server(max_body_bytes=1000) as live:
        raw, took = raw_exchange(live.url, head("/v1/completions", 20_000_000), b'{"prompt": "')
        assert status_of(raw) == 413 and took < 3
        assert "20000000 bytes, more than --max-body-bytes 1000" in json_of(raw)["error"]["message"]
        # without a Content-Length (chunked), counted as it comes
        def chunks():
            yield b'{"prompt": "'
            for _ in range(10):
                yield b"a" * 200

        resp = httpx.post(f"{live.url}/v1/completions", content=chunks(), timeout=10, headers={"Content-Type": "application/json"})
        assert resp.status_code == 413 and "more than 1000 bytes" in envelope(resp)["message"]
        assert httpx.post(f"{live.url}/v1/completions", json={"prompt": "ab", "max_tokens": 2}, timeout=10).status_code == 200


def test_the_api_key_is_checked_before_the_body_and_guards_everything_but_the_probes():
    with live_server(api_key="s3cret") as live:
        raw, took = raw_exchange(live.url, head("/v1/completions", 50_000_000), b'{"promp')
        assert status_of(raw) == 401 and took < 3 and json_of(raw)["error"]["type"] == "AuthenticationError"
        # a body that would not validate is still a 401 without the key, not a field-level 400
        resp = httpx.post(f"{live.url}/v1/chat/completions", json={"messages": "nope", "bogus": 1}, timeout=10)
        assert resp.status_code == 401 and envelope(resp)["type"] == "AuthenticationError"
        key = {"Authorization": "Bearer s3cret"}
        for path in ("/docs", "/openapi.json", "/v1/models", "/v1/models/fake"):
            assert httpx.get(f"{live.url}{path}", timeout=10).status_code == 401, path
            assert httpx.get(f"{live.url}{path}", headers=key, timeout=10).status_code == 200, path
        assert httpx.post(f"{live.url}/tokenize", json={"prompt": "ab"}, timeout=10).status_code == 401
        for path in ("/health", "/metrics", "/version"):
            assert httpx.get(f"{live.url}{path}", timeout=10).status_code == 200, path
        assert httpx.head(f"{live.url}/health", timeout=10).status_code == 200


# -- off the event loop -----------------------------------------------------------------------------


class SlowTokenizer(ByteTokenizer):
    """Encodes like the byte tokenizer, but a long text takes two seconds (holding its thread,
    as a real tokenizer does), and says when it has started."""

    def __init__(self) -> None:
        super().__init__(257, 256)
        self.started = threading.Event()

    def encode(self, text: str) -> list[int]:
        if len(text) > 500:
            self.started.set()
            time.sleep(2.0)
        return super().encode(text)


def test_health_answers_at_once_while_a_long_prompt_is_tokenized():
    tok = SlowTokenizer()
    with live_server(tokenizer=tok) as live:
        result = {}
        thread = threading.Thread(target=lambda: result.update(r=httpx.post(
            f"{live.url}/v1/completions", json={"prompt": "ab " * 300, "max_tokens": 2}, timeout=30)))
        thread.start()
        assert tok.started.wait(10)
        t0 = time.monotonic()
        assert httpx.get(f"{live.url}/health", timeout=10).status_code == 200
        assert time.monotonic() - t0 < 1.0  # not the 2 s the tokenizer holds its thread
        thread.join(30)
        assert result["r"].status_code == 200


@pytest.mark.slow
def test_the_real_tokenizer_on_a_long_prompt_leaves_the_server_answering(real_tokenizer):
    """The real tokenizer works in a worker thread without holding the GIL: 1.5 MiB of text
    takes seconds to tokenize, and /health keeps answering, each within a second, meanwhile."""
    text = ("the quick brown fox, 123 jumps; " * 60_000)[: 3 << 19]
    with live_server(tokenizer=real_tokenizer) as live:
        result = {}
        thread = threading.Thread(target=lambda: result.update(r=httpx.post(f"{live.url}/tokenize", json={"prompt": text}, timeout=120)))
        thread.start()
        worst, pings = 0.0, 0
        while thread.is_alive():
            t0 = time.monotonic()
            assert httpx.get(f"{live.url}/health", timeout=10).status_code == 200
            worst, pings = max(worst, time.monotonic() - t0), pings + 1
            time.sleep(0.05)
        thread.join()
        assert result["r"].status_code == 200 and result["r"].json()["count"] == len(real_tokenizer.encode(text))
        assert pings >= 5 and worst < 1.0, (pings, worst)  # holding the GIL, the server (and this test) manage 2


def test_a_prompt_over_max_prompt_bytes_or_the_context_is_refused_without_tokenizing_it():
    tok = SlowTokenizer()
    with live_server(tokenizer=tok, max_prompt_bytes=600) as live:
        resp = httpx.post(f"{live.url}/v1/completions", json={"prompt": "é" * 400, "max_tokens": 2}, timeout=10)
        err = envelope(resp)
        assert (resp.status_code, err["type"]) == (400, "PROMPT_TOO_LONG") and "800 bytes of text, more than --max-prompt-bytes 600" in err["message"]
        resp = httpx.post(f"{live.url}/v1/chat/completions", timeout=10,
                          json={"messages": [{"role": "user", "content": "a" * 400}, {"role": "user", "content": "b" * 300}]})
        assert resp.status_code == 400 and "700 bytes of text" in envelope(resp)["message"]
    with live_server(tokenizer=tok, max_context=512) as live:  # the context: bytes prove the text too long
        resp = httpx.post(f"{live.url}/v1/completions", json={"prompt": "a" * 600}, timeout=10)
        assert resp.status_code == 400 and "needs at least 600 tokens" in envelope(resp)["message"]
    assert not tok.started.is_set()  # never tokenized


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 2}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udc00"}]}'),
    ("/tokenize", b'{"prompt": "\\ud800"}'),
])
def test_a_lone_surrogate_is_a_400(fake_server, path, body):
    resp = httpx.post(f"{fake_server.url}{path}", content=body, headers={"Content-Type": "application/json"}, timeout=10)
    err = envelope(resp)
    assert resp.status_code == 400 and "lone UTF-16 surrogate" in err["message"], err
    # a surrogate pair is a character like any other
    ok = httpx.post(f"{fake_server.url}/v1/completions", content=b'{"prompt": "\\ud83d\\ude00", "max_tokens": 2}',
                    headers={"Content-Type": "application/json"}, timeout=10)
    assert ok.status_code == 200


# -- the queue and batches ------------------------------------------------------------------------


@pytest.mark.parametrize("max_queued", [0, 1])
def test_concurrent_requests_that_fit_the_lanes_all_run_whatever_the_queue_limit(max_queued):
    cfg = FAKE.__class__(**{**FAKE.__dict__, "max_lanes": 4})
    with live_server(SlowFake(cfg), config=LoopConfig(max_queued=max_queued)) as live:
        async def main():
            async with httpx.AsyncClient(base_url=live.url, timeout=60) as c:
                body = {"prompt": "abcd", "max_tokens": 30, "ignore_eos": True}
                return await asyncio.gather(*(c.post("/v1/completions", json={**body, "seed": i}) for i in range(4)))

        assert [r.status_code for r in asyncio.run(main())] == [200] * 4


def test_a_batch_that_can_never_fit_is_a_400_not_a_429():
    with live_server(config=LoopConfig(max_queued=2)) as live:  # 8 lanes + 2 waiting
        resp = httpx.post(f"{live.url}/v1/completions", json={"prompt": ["ab"] * 11, "max_tokens": 2}, timeout=10)
        err = envelope(resp)
        assert resp.status_code == 400 and err["param"] == "prompt"
        assert "asks for 11 completions (prompts x n); this server holds at most 10 at once (8 lanes" in err["message"]
        resp = httpx.post(f"{live.url}/v1/completions", json={"prompt": ["ab"] * 2, "n": 6, "max_tokens": 2}, timeout=10)
        assert resp.status_code == 400 and envelope(resp)["param"] == "n"
        resp = httpx.post(f"{live.url}/v1/completions", json={"prompt": ["ab"] * 10, "max_tokens": 2}, timeout=30)
        assert resp.status_code == 200 and len(resp.json()["choices"]) == 10


# -- defaults and fields --------------------------------------------------------------------------


def test_completions_default_to_16_tokens_and_chat_to_what_the_context_leaves(fake_server):
    r = httpx.post(f"{fake_server.url}/v1/completions", json={"prompt": "abc", "ignore_eos": True}, timeout=30).json()
    assert r["usage"]["completion_tokens"] == 16
    r = httpx.post(f"{fake_server.url}/v1/completions", json={"prompt": "a" * 1020, "ignore_eos": True}, timeout=30).json()
    assert r["usage"]["completion_tokens"] == 4  # what fits
    r = httpx.post(f"{fake_server.url}/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "abc"}], "sf_trt": {"ignore_eos": True}}).json()
    assert r["usage"]["completion_tokens"] == 1024 - r["usage"]["prompt_tokens"]


def test_seed_minus_one_draws_a_seed_that_reproduces_the_answer(client):
    kw = dict(model="fake", prompt="the cat sat on the mat", max_tokens=20, temperature=1.0)
    a, b = client.completions.create(**kw, seed=-1), client.completions.create(**kw, seed=-1)
    seeds = a.model_extra["sf_trt"]["seed"], b.model_extra["sf_trt"]["seed"]
    assert seeds[0] != seeds[1] and all(0 <= s < 2**63 for s in seeds)
    assert client.completions.create(**kw, seed=seeds[0]).choices[0].text == a.choices[0].text


def test_annotations_and_vllms_fields_are_accepted(fake_server):
    body = {"messages": [{"role": "user", "content": "ab"}], "max_tokens": 5, "store": False, "metadata": {"team": "a"},
            "service_tier": "auto", "user": "u1", "parallel_tool_calls": True, "ignore_eos": True, "skip_special_tokens": True,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", f"{fake_server.url}/v1/chat/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    usages = [ch["usage"]["completion_tokens"] for ch in chunks]
    assert usages == sorted(usages) and usages[-1] == 5 and all(ch["usage"] is not None for ch in chunks)


def test_text_offset_counts_characters_not_bytes(client):
    """The fake copies the prompt's bytes, so its output holds characters of 2 and 3 bytes,
    each spread over as many tokens."""
    r = client.completions.create(model="fake", prompt="é€a é€a é€a é€a", max_tokens=24, temperature=0, logprobs=1,
                                  extra_body={"sf_trt": {"return_token_ids": True}})
    c = r.choices[0]
    ids = c.model_extra["token_ids"]
    assert any(t >= 0x80 for t in ids)
    # the characters complete before token j (an invalid byte is one U+FFFD, as in the text)
    want = [len(codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(t for t in ids[:j] if t < 256)))
            for j in range(len(ids))]
    assert c.logprobs.text_offset == want and want[-1] <= len(c.text)
    streamed = [o for ch in client.completions.create(model="fake", prompt="é€a é€a é€a é€a", max_tokens=24, temperature=0,
                                                      logprobs=1, stream=True) if ch.choices and ch.choices[0].logprobs
                for o in ch.choices[0].logprobs.text_offset]
    assert streamed == want


# -- routes ----------------------------------------------------------------------------------------


def test_a_model_by_id_and_head_on_health(client, fake_server):
    m = client.models.retrieve("fake")
    assert m.id == "fake" and m.owned_by == "sf_trt"
    resp = httpx.get(f"{fake_server.url}/v1/models/gpt-4", timeout=10)
    assert resp.status_code == 404 and "'gpt-4' does not exist" in envelope(resp)["message"]
    resp = httpx.head(f"{fake_server.url}/health", timeout=10)
    assert resp.status_code == 200 and resp.content == b""


@pytest.mark.parametrize("method, path, status, type_", [
    ("GET", "/v1/nowhere", 404, "NotFoundError"),
    ("GET", "/v1/completions", 405, "MethodNotAllowedError"),
    ("DELETE", "/health", 405, "MethodNotAllowedError"),
])
def test_the_frameworks_own_errors_use_the_envelope(fake_server, method, path, status, type_):
    resp = httpx.request(method, f"{fake_server.url}{path}", timeout=10)
    assert (resp.status_code, envelope(resp)["type"]) == (status, type_)


class BrokenTokenizer(ByteTokenizer):
    def encode(self, text: str) -> list[int]:
        raise RuntimeError("a bug")


def test_an_unexpected_failure_is_a_500_in_the_envelope_and_the_server_goes_on():
    with live_server(tokenizer=BrokenTokenizer(257, 256)) as live:
        resp = httpx.post(f"{live.url}/v1/completions", json={"prompt": "ab"}, timeout=10)
        assert resp.status_code == 500 and envelope(resp)["message"] == "the server failed: RuntimeError"
        assert httpx.post(f"{live.url}/v1/completions", json={"prompt": [97, 98], "max_tokens": 2}, timeout=10).status_code == 200


def test_tokenize_and_detokenize_in_vllms_shapes_give_the_ids_the_routes_prefill(fake_server):
    url = fake_server.url
    r = httpx.post(f"{url}/tokenize", json={"model": "fake", "prompt": "hé", "return_token_strs": True}, timeout=10).json()
    assert r == {"count": 3, "max_model_len": 1024, "tokens": [104, 0xC3, 0xA9], "token_strs": ["h", "\ufffd", "\ufffd"]}
    messages = [{"role": "user", "content": "hi"}]
    r = httpx.post(f"{url}/tokenize", json={"messages": messages}, timeout=10).json()
    assert r["tokens"] == TOK.encode_chat(messages) and r["token_strs"] is None
    done = httpx.post(f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 1}, timeout=10).json()
    assert done["usage"]["prompt_tokens"] == r["count"]
    r = httpx.post(f"{url}/tokenize", json={"messages": messages, "add_generation_prompt": False}, timeout=10).json()
    assert r["tokens"] == TOK.encode_chat(messages, add_generation_prompt=False)
    assert httpx.post(f"{url}/detokenize", json={"tokens": [104, 0xC3, 0xA9, 256]}, timeout=10).json() == {"prompt": "hé<|special:256|>"}
    resp = httpx.post(f"{url}/detokenize", json={"tokens": [1, 999]}, timeout=10)
    assert resp.status_code == 400 and envelope(resp)["type"] == "TOKEN_OUT_OF_VOCAB" and "token 999 at index 1" in envelope(resp)["message"]
    resp = httpx.post(f"{url}/tokenize", json={"model": "other", "prompt": "a"}, timeout=10)
    assert resp.status_code == 404
    resp = httpx.post(f"{url}/tokenize", json={"prompt": "a", "mood": 1}, timeout=10)
    assert resp.status_code == 400 and envelope(resp)["param"] == "mood"


# -- slow clients, draining ---------------------------------------------------------------------------


def test_a_slow_loris_is_cut_at_the_read_timeout_and_idle_connections_close():
    with live_server(read_timeout_s=1.0, keep_alive_s=0.5) as live:
        host, port = live.url.removeprefix("http://").split(":")
        t0 = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n")
            closed = False
            while time.monotonic() - t0 < 4:
                try:
                    sock.sendall(b"X")  # one header byte at a time
                    time.sleep(0.2)
                    sock.setblocking(False)
                    try:
                        closed = sock.recv(1024) == b""
                    except BlockingIOError:
                        pass
                    finally:
                        sock.setblocking(True)
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                if closed:
                    break
        assert closed and 0.9 < time.monotonic() - t0 < 3
        # a connection that sends nothing at all
        raw, took = raw_exchange(live.url, b"", timeout_s=5)
        assert raw == b"" and 0.9 < took < 3
        # a body that stops coming: 408
        raw, took = raw_exchange(live.url, head("/v1/completions", 100), b'{"prompt": ', timeout_s=5)
        assert status_of(raw) == 408 and 0.9 < took < 3
        # an idle keep-alive connection closes after the keep-alive timeout
        raw, took = raw_exchange(live.url, head("/v1/completions", 33), b'{"prompt": "ab", "max_tokens": 2}', timeout_s=5)
        assert status_of(raw) == 200 and 0.4 < took < 2.5


def test_while_draining_new_requests_get_503_and_running_ones_finish():
    import signal

    with live_server(SlowFake(FAKE)) as live:
        body = {"prompt": "abc", "max_tokens": 300, "ignore_eos": True, "sf_trt": {"speculate": "none"}}
        result = {}
        thread = threading.Thread(target=lambda: result.update(r=httpx.post(f"{live.url}/v1/completions", json=body, timeout=30)))
        thread.start()
        wait_for(lambda: live.engine.num_running == 1)
        live.server.handle_exit(signal.SIGTERM, None)  # what uvicorn calls on SIGTERM
        resp = httpx.post(f"{live.url}/v1/completions", json={"prompt": "a", "max_tokens": 2}, timeout=10)
        assert resp.status_code == 503 and envelope(resp)["type"] == "ServiceUnavailableError"
        assert "shutting down" in envelope(resp)["message"]
        assert httpx.get(f"{live.url}/health", timeout=10).status_code == 503
        thread.join(30)
        assert result["r"].status_code == 200 and result["r"].json()["usage"]["completion_tokens"] == 300
        wait_for(lambda: live.server.should_exit)
