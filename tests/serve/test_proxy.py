"""The middleware Ray's proxy runs (sf_trt/serve/proxy.py), on the ASGI messages Ray's proxy sends:
its plain-text errors become OpenAI's envelope (status and Retry-After kept), the replicas' own
answers pass untouched, and a request whose replica died gets a 503 or an SSE error event; a
request naming a `user` gets the hash of it as Ray's session id.
(Through a real Ray proxy: tests/cli/test_serve_ray*.py.)"""

from __future__ import annotations

import asyncio
import json

from sf_trt.serve.proxy import LOST, ROUTING_BODY_LIMIT, OpenAIErrorBodies, UserRoutingKey, routing_key


def run(messages: list[dict], *, raise_after: bool = False) -> list[dict]:
    async def app(scope, receive, send):
        for m in messages:
            await send(m)
        if raise_after:
            raise RuntimeError("the replica's actor died")

    sent: list[dict] = []

    async def send(m):
        sent.append(m)

    asyncio.run(OpenAIErrorBodies(app)({"type": "http"}, None, send))
    return sent


def start(status: int, kind: bytes, *extra: tuple) -> dict:
    return {"type": "http.response.start", "status": status, "headers": [[b"content-type", kind], *extra]}


def test_a_plain_text_429_becomes_the_envelope_with_its_status_and_retry_after():
    sent = run([start(429, b"text/plain; charset=utf-8", (b"retry-after", b"2")),
                {"type": "http.response.body", "body": b"Request dropped due to backpressure (num_queued_requests=2, max_queued_requests=2)."}])
    assert sent[0]["status"] == 429 and (b"retry-after", b"2") in sent[0]["headers"]
    assert (b"content-type", b"application/json") in sent[0]["headers"]
    body = json.loads(sent[1]["body"])
    assert body == {"error": {"message": "Request dropped due to backpressure (num_queued_requests=2, max_queued_requests=2).",
                              "type": "RateLimitError", "param": None, "code": 429}}
    assert dict(sent[0]["headers"])[b"content-length"] == str(len(sent[1]["body"])).encode()


def test_json_errors_and_answers_pass_untouched_chunk_by_chunk():
    own = [start(400, b"application/json"), {"type": "http.response.body", "body": b'{"error": {}}'}]
    assert run(own) == own
    stream = [start(200, b"text/event-stream"), {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True},
              {"type": "http.response.body", "body": b"data: [DONE]\n\n"}]
    assert run(stream) == stream


def test_a_replica_lost_before_answering_is_a_503_and_mid_stream_an_sse_error_event():
    sent = run([], raise_after=True)
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"])["error"] == {"message": LOST, "type": "ServiceUnavailableError", "param": None, "code": 503}
    sent = run([start(200, b"text/event-stream"), {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}],
               raise_after=True)
    tail = sent[-1]["body"].decode()
    assert tail.startswith("event: error\ndata: ") and tail.endswith("data: [DONE]\n\n") and not sent[-1].get("more_body")
    assert json.loads(tail.split("data: ", 1)[1].split("\n\n", 1)[0])["error"]["type"] == "ServiceUnavailableError"


# -- the routing key ----------------------------------------------------------------------------------


def route(chunks: list[bytes], headers: list | None = None, method: str = "POST") -> tuple[list, list[dict]]:
    """What the app behind UserRoutingKey sees: the scope's headers and the body messages it receives."""
    seen: dict = {}

    async def app(scope, receive, send):
        seen["headers"] = scope["headers"]
        got = []
        while True:
            m = await receive()
            got.append(m)
            if not m.get("more_body"):
                break
        seen["messages"] = got

    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return messages.pop(0)

    asyncio.run(UserRoutingKey(app)({"type": "http", "method": method, "headers": list(headers or [])}, receive, None))
    return seen["headers"], seen["messages"]


def test_a_users_request_gets_the_hash_of_its_user_as_rays_session_id_and_its_body_unchanged():
    body = json.dumps({"prompt": "hi", "user": "alice"}).encode()
    headers, messages = route([body[:9], body[9:]], [(b"content-type", b"application/json")])
    assert (b"x-session-id", routing_key("alice").encode()) in headers and "alice" not in routing_key("alice")
    assert [m["body"] for m in messages] == [body[:9], body[9:]] and routing_key("alice") != routing_key("bob")


def test_no_user_a_client_session_id_a_get_or_a_body_past_the_limit_add_no_key():
    assert route([b'{"prompt": "hi"}'])[0] == []
    assert route([b"not json"])[0] == []
    assert route([b'{"user": "alice"}'], [(b"x-session-id", b"mine")])[0] == [(b"x-session-id", b"mine")]
    assert route([b'{"user": "alice"}'], method="GET")[0] == []
    big = [b'{"user": "alice", "prompt": "', b"x" * ROUTING_BODY_LIMIT, b'"}']
    headers, messages = route(big)
    assert headers == [] and b"".join(m["body"] for m in messages) == b"".join(big)


def test_the_session_header_follows_rays_setting(monkeypatch):
    monkeypatch.setenv("RAY_SERVE_SESSION_ID_HEADER_KEY", "X-Correlation-Id")
    assert (b"x-correlation-id", routing_key("alice").encode()) in route([b'{"user": "alice"}'])[0]
