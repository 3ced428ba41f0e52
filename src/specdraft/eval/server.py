"""``specdraft eval --server URL``: acceptance measured by a running vLLM or SGLang.

The prompts go through ``/v1/chat/completions``; acceptance comes from the server's own counters:

- vLLM: Prometheus ``/metrics`` counters ``vllm:spec_decode_num_drafts``,
  ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
  ``..._num_accepted_tokens_per_pos{position="i"}`` (``_total`` suffix in the text format;
  ``vllm/v1/spec_decode/metrics.py``), read before and after and differenced, so traffic before
  the eval does not count. τ = 1 + accepted / drafts (bonus counted); position ``i`` rate =
  accepted at ``i`` / drafts; acceptance rate = accepted / draft tokens.
- SGLang: ``/get_server_info`` ``avg_spec_accept_length`` (top level or in
  ``internal_states[0]``), else Prometheus ``sglang:spec_accept_length``. SGLang exposes no
  per-position counters; per request, ``completion_tokens / meta_info.spec_verify_ct`` when the
  native ``/generate`` is used (not here).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from specdraft.core.errors import InputError
from specdraft.engines.counters import SPEC, counter_difference, parse_prometheus, \
    prometheus_samples, spec_counters, vllm_figures

def vllm_counters(text: str) -> dict[str, Any]:
    """The vLLM spec-decode counters of a ``/metrics`` text, summed over label sets
    (:func:`specdraft.engines.counters.spec_counters`)."""
    return spec_counters(prometheus_samples(text))


def vllm_summary(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """τ, acceptance rate and per-position rates from two counter snapshots, differenced
    (:func:`specdraft.engines.counters.vllm_figures`). Raises :class:`EngineError` when the
    server did not speculate in between."""
    diff = counter_difference(before, after)
    return {"engine": "vllm", **vllm_figures(diff["drafts"], diff["draft_tokens"],
                                             diff["accepted"], diff["per_pos"])}


def sglang_summary(info: dict[str, Any] | None, metrics_text: str) -> dict[str, Any]:
    """τ from SGLang's server info (or its Prometheus gauge); no per-position rates."""
    tau = None
    if info:
        tau = info.get("avg_spec_accept_length")
        states = info.get("internal_states") or []
        if tau is None and states:
            tau = states[0].get("avg_spec_accept_length")
    if tau is None:
        values = [v for n, _, v in parse_prometheus(metrics_text)
                  if n == "sglang:spec_accept_length"]
        tau = values[-1] if values else None
    if tau is None:
        raise InputError("the server reports no speculative acceptance (no vLLM spec_decode "
                         "counters, no SGLang avg_spec_accept_length): is the drafter loaded?")
    return {"engine": "sglang", "tau": float(tau), "per_position": [],
            "acceptance_rate": None, "verify_steps": None}


def _get(client: httpx.Client, path: str) -> httpx.Response | None:
    try:
        r = client.get(path)
    except httpx.HTTPError:
        return None
    return r if r.status_code == 200 else None


def model_card(client: httpx.Client) -> dict[str, Any]:
    """The first model ``GET /v1/models`` lists (``id``; vLLM adds ``root``, the path it
    loaded, and ``max_model_len``). Raises :class:`InputError` when it lists none."""
    r = _get(client, "/v1/models")
    data = (r.json().get("data") if r is not None else None) or []
    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise InputError(f"{client.base_url}/v1/models lists no model")
    return data[0]


def model_name(client: httpx.Client) -> str:
    return str(model_card(client)["id"])


def send_prompts(client: httpx.Client, prompts: list[dict[str, Any]], *, max_tokens: int,
                 temperature: float) -> dict[str, Any]:
    """One chat completion per prompt (sequential); completion tokens and seconds."""
    model = model_name(client)
    tokens, t0 = 0, time.perf_counter()
    for p in prompts:
        r = client.post("/v1/chat/completions", json={
            "model": model, "messages": p["messages"], "max_tokens": max_tokens,
            "temperature": temperature})
        if r.status_code != 200:
            raise InputError(f"{client.base_url}: prompt {p['id']}: HTTP {r.status_code} "
                             f"{r.text[:200]}")
        tokens += int((r.json().get("usage") or {}).get("completion_tokens") or 0)
    return {"model": model, "new_tokens": tokens, "seconds": time.perf_counter() - t0}


def server_eval(url: str, prompts: list[dict[str, Any]], *, max_tokens: int,
                temperature: float, client: httpx.Client | None = None) -> dict[str, Any]:
    """Send ``prompts`` to the server at ``url``; return its acceptance figures."""
    client = client or httpx.Client(base_url=url, timeout=600)
    before = _get(client, "/metrics")
    before_text = before.text if before is not None else ""
    sent = send_prompts(client, prompts, max_tokens=max_tokens, temperature=temperature)
    after = _get(client, "/metrics")
    after_text = after.text if after is not None else ""
    if SPEC in after_text:
        out = vllm_summary(vllm_counters(before_text), vllm_counters(after_text))
    else:
        info = _get(client, "/get_server_info")
        out = sglang_summary(info.json() if info is not None else None, after_text)
    tps = sent["new_tokens"] / sent["seconds"] if sent["seconds"] > 0 else 0.0
    return {**out, "server": url, "model": sent["model"], "new_tokens": sent["new_tokens"],
            "tokens_per_s": tps, "seconds": sent["seconds"]}
