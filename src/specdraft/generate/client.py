"""The ``openai`` backend: an asyncio ``httpx`` client for ``/v1/chat/completions`` servers
(vLLM, SGLang, llama.cpp, ...), with load spreading over several endpoints and retries.

Retried (exponential backoff with jitter, ``Retry-After`` honoured): HTTP 429 and 5xx, timeouts,
connection errors (refused, reset, dropped without a response) and malformed bodies (not JSON,
no ``choices[0].message``). Other HTTP errors (400, 401, 404, 422, ...) fail at once: retrying
cannot fix the request. The API key is read from the environment and only ever sent as the
``Authorization`` header; it never appears in records, manifests or messages.

Endpoint health: an endpoint whose attempt failed with a retryable error is *cooling down* for
:func:`backoff_s` of its consecutive failures (a success ends it) and is not picked while another
is up; a retry goes to another endpoint than the one that just failed when there is one. Without
this, "fewest in flight" sends nearly every request to an endpoint that fails at once (it never
has any in flight), and prompts are lost although a healthy endpoint is there.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class TurnOutput:
    """One generated assistant turn, backend-neutral.

    ``message`` is the raw assistant message (``content`` and maybe ``reasoning`` /
    ``reasoning_content`` and ``tool_calls``, as the server parsed them);
    ``completion_token_ids`` / ``prompt_token_ids`` are the exact ids when the backend returned
    them (vLLM ``return_token_ids``: ``choices[0].token_ids`` and the top-level
    ``prompt_token_ids``), else None. ``latency_s`` is wall seconds of the successful attempt;
    ``attempts`` counts tries (1 = no retry).
    """

    message: dict[str, Any]
    finish_reason: str | None
    usage: dict[str, Any]
    completion_token_ids: list[int] | None
    prompt_token_ids: list[int] | None
    latency_s: float
    endpoint: str
    model: str
    attempts: int = 1


class RetryableError(Exception):
    """A failed attempt worth retrying; ``kind`` is one of ``http_429``, ``http_5xx``,
    ``timeout``, ``connection``, ``malformed``."""

    def __init__(self, kind: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after


class RequestFailed(Exception):
    """A request that failed for good (after ``attempts`` tries); ``kind`` of the last error."""

    def __init__(self, kind: str, message: str, attempts: int) -> None:
        super().__init__(message)
        self.kind = kind
        self.attempts = attempts


def chat_url(endpoint: str) -> str:
    """``http://h:8000`` / ``…/v1`` / ``…/v1/chat/completions`` -> the chat completions URL."""
    url = endpoint.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


def backoff_s(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): "equal jitter" exponential
    backoff, uniform in ``[d/2, d]`` with ``d = min(cap, base * 2**attempt)``. The exponent is
    clamped at 64 (an endpoint failing thousands of times in a row would overflow a float)."""
    d = min(cap, base * (2.0 ** min(attempt, 64)))
    return d / 2 + rng.uniform(0, d / 2)


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return float(resp.headers.get("retry-after", ""))
    except ValueError:
        return None


def _int_list(value: Any) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(x, int) for x in value):
        raise RetryableError("malformed", "token ids are not a list of ints")
    return value


def parse_response(resp: httpx.Response) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(body, choices[0])`` of a 200 response, or :class:`RetryableError` ``malformed``."""
    try:
        body = resp.json()
    except (ValueError, UnicodeDecodeError) as err:
        raise RetryableError("malformed", f"response is not JSON ({err}): "
                                          f"{resp.text[:200]!r}") from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) \
            or not isinstance(choices[0].get("message"), dict):
        raise RetryableError("malformed", f"no choices[0].message in {str(body)[:200]!r}")
    calls = choices[0]["message"].get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(
            isinstance(c, dict) and isinstance(c.get("function"), dict)
            and isinstance(c["function"].get("name"), str) for c in calls)):
        raise RetryableError("malformed", f"message.tool_calls is not a list of function calls: "
                                          f"{str(calls)[:200]!r}")
    return body, choices[0]


class OpenAIBackend:
    """Sends chat completion requests; use as ``async with OpenAIBackend(...) as b``.

    ``endpoints``: base URLs, load-spread by fewest requests in flight (ties round-robin).
    ``body_defaults``: fields sent with every request (``max_tokens``, ``temperature``,
    ``chat_template_kwargs``, ``return_token_ids``, extra body fields, ...). ``retries`` counts
    failed attempts by kind, ``retries_by_endpoint`` by endpoint base URL; ``failures`` counts
    requests that failed for good; ``peak_in_flight`` is, per endpoint base URL, the most
    requests posted to it at once (sent and not yet answered: the load the server was given).
    """

    def __init__(self, endpoints: list[str], *, model: str | None,
                 body_defaults: dict[str, Any], api_key: str | None = None,
                 concurrency: int = 64, timeout_s: float = 600.0, max_retries: int = 5,
                 backoff_base_s: float = 1.0, backoff_max_s: float = 60.0,
                 seed: int | None = None) -> None:
        self.urls = [chat_url(e) for e in endpoints]
        self.model = model
        self.body_defaults = dict(body_defaults)
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff = (backoff_base_s, backoff_max_s)
        self.retries: Counter[str] = Counter()
        self.retries_by_endpoint: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.peak_in_flight: Counter[str] = Counter()
        self._inflight = {u: 0 for u in self.urls}
        self._posted = {u: 0 for u in self.urls}
        self._fails = {u: 0 for u in self.urls}  # consecutive failed attempts
        self._down_until = {u: 0.0 for u in self.urls}  # time.monotonic() seconds
        self._rr = itertools.count()
        self._rng = random.Random(seed)
        self._clients: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
        self._all: list[httpx.AsyncClient] = []
        self._make = self._client_factory(api_key, len(self.urls))
        self._secret = api_key
        self._room = concurrency

    def _client_factory(self, api_key: str | None, n_urls: int):
        """One small client per request slot: httpx's pool scans all its connections on every
        request, so one pool of 256 connections costs O(256) per request; slots of one
        connection per endpoint keep it O(1) (measured in benchmarks/bench_generate_client.py).
        """
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=n_urls, max_keepalive_connections=n_urls)
        ssl_ctx = httpx.create_ssl_context()  # shared: building one per client is slow
        return lambda: httpx.AsyncClient(headers=headers, limits=limits, verify=ssl_ctx,
                                         timeout=httpx.Timeout(self.timeout_s))

    async def _acquire(self) -> httpx.AsyncClient:
        if self._clients.empty() and self._room > 0:
            self._room -= 1
            self._all.append(self._make())
            return self._all[-1]
        return await self._clients.get()

    async def __aenter__(self) -> "OpenAIBackend":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(c.aclose() for c in self._all), return_exceptions=True)

    async def resolve_model(self) -> str:
        """The model name: the configured one, else the first id of ``GET /v1/models`` of the
        first endpoint that answers it (one endpoint down at start does not stop the run).
        Raises the last endpoint's error when none answers."""
        if self.model:
            return self.model
        client = await self._acquire()
        try:
            for i, chat in enumerate(self.urls):
                try:
                    resp = await client.get(chat.removesuffix("/chat/completions") + "/models")
                    resp.raise_for_status()
                    self.model = resp.json()["data"][0]["id"]
                    return self.model
                except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError):
                    if i == len(self.urls) - 1:
                        raise
        finally:
            self._clients.put_nowait(client)
        raise AssertionError("unreachable")

    async def context_length(self) -> int | None:
        """The served model's context in tokens: ``max_model_len`` of its entry in ``GET
        /v1/models`` (vLLM, SGLang say it), or None when no endpoint says."""
        client = await self._acquire()
        try:
            for chat in self.urls:
                try:
                    resp = await client.get(chat.removesuffix("/chat/completions") + "/models")
                    resp.raise_for_status()
                    cards = resp.json()["data"]
                    card = next((c for c in cards if c.get("id") == self.model), cards[0])
                    value = card.get("max_model_len")
                    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                        return value
                except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError,
                        AttributeError):
                    continue
        finally:
            self._clients.put_nowait(client)
        return None

    async def count_prompt_tokens(self, messages: list[dict[str, Any]], *,
                                  tools: list | None = None) -> int | None:
        """Tokens of ``messages`` (and ``tools``) rendered with the server's chat template and
        its generation prompt, from the server's ``POST /tokenize`` (vLLM's and SGLang's
        tokenizer route at the server root: ``{"model", "messages", "add_generation_prompt"}``
        -> ``{"count"}``); None when the server has no such route or does not answer it
        (nothing is generated)."""
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        if isinstance(self.body_defaults.get("chat_template_kwargs"), dict):
            body["chat_template_kwargs"] = self.body_defaults["chat_template_kwargs"]
        client = await self._acquire()
        try:
            url = self.urls[0].removesuffix("/chat/completions").removesuffix("/v1")
            resp = await client.post(url + "/tokenize", json=body)
            count = resp.json().get("count") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            count = None
        finally:
            self._clients.put_nowait(client)
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    def _pick(self, avoid: str | None = None) -> str:
        """The endpoint for the next attempt: among those up (not cooling down; all of them when
        none is), not ``avoid`` (the one that just failed) unless it is the only one, the one
        with fewest requests in flight (ties round-robin); when all cool down, the one that
        recovers first."""
        turn = next(self._rr)
        n = len(self.urls)
        order = [self.urls[(turn + i) % n] for i in range(n)]
        now = time.monotonic()
        up = [u for u in order if self._down_until[u] <= now]
        pool = [u for u in (up or order) if u != avoid] or [avoid]
        if up:
            return min(pool, key=lambda u: self._inflight[u])
        return min(pool, key=lambda u: self._down_until[u])

    def _health(self, url: str, ok: bool) -> None:
        """Record an attempt's outcome: a success ends the endpoint's cooldown, a retryable
        failure starts one of :func:`backoff_s` (its consecutive failures so far)."""
        if ok:
            self._fails[url], self._down_until[url] = 0, 0.0
            return
        self._fails[url] += 1
        cool = backoff_s(self._fails[url] - 1, *self.backoff, self._rng)
        self._down_until[url] = time.monotonic() + cool

    async def complete(self, messages: list[dict[str, Any]],
                       fields: dict[str, Any] | None = None) -> TurnOutput:
        """One chat completion for ``messages``, retried as described in the module docstring.

        ``fields``: this conversation's own request fields (``tools``, ``tool_choice``), sent
        before :attr:`body_defaults` (so ``--extra-body`` still wins). Raises
        :class:`RequestFailed` (kind and last error) when every attempt failed.
        """
        body = {"model": self.model, "messages": messages, **(fields or {}),
                **self.body_defaults}
        payload = json.dumps(body, ensure_ascii=False).encode()
        url = None
        for attempt in range(self.max_retries + 1):
            url = self._pick(avoid=url)
            try:
                out = await self._attempt(url, payload, attempt + 1)
                self._health(url, ok=True)
                return out
            except RetryableError as err:
                self._health(url, ok=False)
                self.retries[err.kind] += 1
                self.retries_by_endpoint[url.removesuffix("/chat/completions")] += 1
                if attempt == self.max_retries:
                    self.failures[err.kind] += 1
                    raise RequestFailed(err.kind, f"{url}: {err}", attempt + 1) from None
                wait = backoff_s(attempt, *self.backoff, self._rng)
                if err.retry_after is not None:
                    wait = max(wait, min(err.retry_after, self.backoff[1]))
                await asyncio.sleep(wait)
            except RequestFailed as err:
                self.failures[err.kind] += 1
                err.attempts = attempt + 1
                raise
        raise AssertionError("unreachable")

    async def _attempt(self, url: str, payload: bytes, attempt: int) -> TurnOutput:
        self._inflight[url] += 1
        client = await self._acquire()
        self._posted[url] += 1
        base = url.removesuffix("/chat/completions")
        self.peak_in_flight[base] = max(self.peak_in_flight[base], self._posted[url])
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                resp = await client.post(
                    url, content=payload, headers={"Content-Type": "application/json"})
        except (TimeoutError, httpx.TimeoutException) as err:
            raise RetryableError("timeout", f"no response within {self.timeout_s}s "
                                            f"({type(err).__name__})") from None
        except httpx.TransportError as err:
            raise RetryableError("connection", f"{type(err).__name__}: {err}") from None
        finally:
            self._inflight[url] -= 1
            self._posted[url] -= 1
            self._clients.put_nowait(client)
        return self._to_output(resp, url, attempt, time.perf_counter() - t0)

    def _body(self, resp: httpx.Response, limit: int) -> str:
        """The start of an error response, quoted, with the API key masked: a server that
        echoes the key it was sent ("invalid key sk-…") must not put it in rejects.jsonl."""
        text = resp.text
        if self._secret:
            text = text.replace(self._secret, "***")
        return repr(text[:limit])

    def _to_output(self, resp: httpx.Response, url: str, attempt: int,
                   latency: float) -> TurnOutput:
        if resp.status_code == 429 or resp.status_code >= 500:
            kind = "http_429" if resp.status_code == 429 else "http_5xx"
            raise RetryableError(kind, f"HTTP {resp.status_code}: {self._body(resp, 200)}",
                                 _retry_after(resp))
        if resp.status_code != 200:
            raise RequestFailed(f"http_{resp.status_code}",
                                f"{url}: HTTP {resp.status_code}: {self._body(resp, 300)}", attempt)
        body, choice = parse_response(resp)
        return TurnOutput(
            message=choice["message"], finish_reason=choice.get("finish_reason"),
            usage=body.get("usage") or {},
            completion_token_ids=_int_list(choice.get("token_ids")),
            prompt_token_ids=_int_list(body.get("prompt_token_ids")),
            latency_s=round(latency, 4), endpoint=url.removesuffix("/chat/completions"),
            model=str(body.get("model") or self.model), attempts=attempt)
