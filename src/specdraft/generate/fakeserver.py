"""A loopback OpenAI-compatible server that speaks vLLM's response shape, for tests and the
client benchmark (stdlib ``asyncio`` only, HTTP/1.1 with keep-alive).

A *handler* decides each reply: ``async handler(body: dict) -> Reply``. :func:`vllm_reply`
builds a well-formed one; a handler may sleep (slow server), return a 5xx, malformed bytes, or
``Reply(drop=True)`` (the connection is reset without a response).

Run standalone (benchmark): ``python -m specdraft.generate.fakeserver`` prints its URL.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests",
            500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


@dataclass
class Reply:
    """``status`` and ``body`` (a dict is JSON-encoded, bytes are sent as is) or ``drop``."""

    status: int = 200
    body: Any = None
    drop: bool = False


def last_user(body: dict[str, Any]) -> str:
    """Content of the last user message of a chat request."""
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


def tool_call_entries(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``[{"name", "arguments": {...}}]`` as vLLM's ``message.tool_calls`` (its tool parsers'
    shape: an id, ``type: "function"``, ``arguments`` a JSON string with ``json.dumps``'
    default separators and ``ensure_ascii=False``, as ``vllm/tool_parsers/hermes_tool_parser.py``
    writes them)."""
    return [{"id": f"chatcmpl-tool-{i}", "type": "function",
             "function": {"name": c["name"],
                          "arguments": json.dumps(c.get("arguments", {}), ensure_ascii=False)}}
            for i, c in enumerate(calls)]


def vllm_reply(body: dict[str, Any], *, content: str | None = None, reasoning: str | None = None,
               finish_reason: str = "stop", token_ids: list[int] | None = None,
               tool_calls: list[dict[str, Any]] | None = None) -> Reply:
    """A vLLM-shaped chat completion (``message.reasoning``, ``choices[0].token_ids``,
    top-level ``prompt_token_ids`` when the request had ``return_token_ids``). ``tool_calls``
    (``[{"name", "arguments"}]``) makes it an answer that calls tools, as vLLM returns one with
    a tool parser: ``message.tool_calls`` (:func:`tool_call_entries`), ``content`` None unless
    given, ``finish_reason`` ``"tool_calls"``."""
    user = last_user(body)
    if tool_calls:
        finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
    else:
        content = f"Answer to: {user}" if content is None else content
    ids = token_ids if token_ids is not None else list(range(1, len((content or "").split()) + 2))
    calls = tool_call_entries(tool_calls) if tool_calls else []
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content,
                                                      "reasoning": reasoning, "tool_calls": calls},
                              "logprobs": None, "finish_reason": finish_reason,
                              "stop_reason": None}
    out: dict[str, Any] = {"id": "chatcmpl-loopback", "object": "chat.completion",
                           "created": 0, "model": body.get("model") or "loopback",
                           "choices": [choice],
                           "usage": {"prompt_tokens": len(user.split()),
                                     "completion_tokens": len(ids),
                                     "total_tokens": len(user.split()) + len(ids)}}
    if body.get("return_token_ids"):
        choice["token_ids"] = ids
        out["prompt_token_ids"] = list(range(100, 100 + len(user.split())))
    return Reply(200, out)


async def echo_handler(body: dict[str, Any]) -> Reply:
    """Zero-latency handler: a well-formed reply at once."""
    return vllm_reply(body)


def _encode(reply: Reply) -> bytes:
    data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
    head = (f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


class LoopbackServer:
    """Serves ``handler`` on ``127.0.0.1:port`` (0 = a free port) in a background thread.

    ``with LoopbackServer(handler) as url: ...`` starts it and stops it. ``GET …/models``
    lists one model, ``model_name``, with ``max_model_len`` when given (as vLLM lists it).
    ``POST /tokenize`` (vLLM's route, at the server root) answers ``{"count"}`` = the number of
    whitespace-separated words of all message contents (the loopback's "tokens", as in
    :func:`vllm_reply`'s usage) when ``tokenize`` is true, else 404. Every chat request body
    received is kept in ``chat_bodies`` (tests assert what was, and was not, sent).
    ``routes``: more answers, ``{path suffix: async route(method, raw body) -> Reply}``
    (``/metrics``, ``/completions``), tried before the chat route; ``card``: more fields of the
    listed model (vLLM's ``root``).
    """

    def __init__(self, handler: Callable[[dict[str, Any]], Awaitable[Reply]] = echo_handler,
                 *, port: int = 0, model_name: str = "loopback-model",
                 max_model_len: int | None = None, tokenize: bool = True,
                 routes: dict[str, Callable[[str, bytes], Awaitable[Reply]]] | None = None,
                 card: dict[str, Any] | None = None) -> None:
        self.routes = routes or {}
        self.card = card or {}
        self.handler = handler
        self.port = port
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.tokenize = tokenize
        self.chat_bodies: list[dict[str, Any]] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self.authorizations: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> str:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self.loop)
        fut.result(timeout=10)
        return self.url

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", self.port,
                                                  backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        async def _stop() -> None:
            self._server.close()
            for t in asyncio.all_tasks():
                if t is not asyncio.current_task():
                    t.cancel()

        asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = next((int(l.split(":", 1)[1]) for l in lines[1:]
                               if l.lower().startswith("content-length:")), 0)
                raw = await reader.readexactly(length) if length else b""
                self.authorizations.append(next((l.split(":", 1)[1].strip() for l in lines[1:]
                                                 if l.lower().startswith("authorization:")),
                                                None))
                reply = await self._dispatch(method, path, raw)
                if reply.drop:
                    writer.transport.abort()
                    return
                writer.write(_encode(reply))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _dispatch(self, method: str, path: str, raw: bytes) -> Reply:
        if method == "GET" and path.rstrip("/").endswith("/models"):
            card: dict[str, Any] = {"id": self.model_name, "object": "model", **self.card}
            if self.max_model_len is not None:
                card["max_model_len"] = self.max_model_len
            return Reply(200, {"object": "list", "data": [card]})
        if method == "POST" and path.rstrip("/") == "/tokenize" and self.tokenize:
            body = json.loads(raw)
            words = sum(len(str(m.get("content") or "").split()) for m in body["messages"])
            return Reply(200, {"count": words, "max_model_len": self.max_model_len,
                               "tokens": list(range(words))})
        for suffix, route in self.routes.items():
            if path.rstrip("/").endswith(suffix):
                return await route(method, raw)
        if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            return Reply(404, {"error": f"no route {method} {path}"})
        body = json.loads(raw)
        self.chat_bodies.append(body)
        return await self.handler(body)


def main() -> None:
    """Serve :func:`echo_handler` until killed; print the URL on stdout first."""
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = LoopbackServer(port=port)
    print(server.start(), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
