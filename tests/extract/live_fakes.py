"""A stand-in for ``specdraft serve`` without vLLM: an in-process HTTP transport (httpx
``MockTransport``) answering ``/health``, ``/v1/models`` and ``/v1/completions`` the way vLLM 0.32's
OpenAI server with specdraft's connector does, from the transformers verifier.

Per capture request it writes, atomically, the connector's file at the request's
``kv_transfer_params["hidden_states_path"]``: ``hidden_states`` ``[T, n_ids, H]`` in vLLM's
layer-id convention (id k < N = HF ``hidden_states[k]``; id N = the last decoder layer's output
BEFORE the final norm, read with a forward hook) and ``token_ids`` ``[T]``; it answers the greedy
next token in ``choices[0].token_ids``. Faults: ``die_after`` (connection refused from the n-th
completion on, until ``revive()``), ``capture_ids`` (what its served names say), ``root``,
``scale`` (states multiplied: another verifier whose head agrees), ``head_shift`` (answers
another token than the verifier's head picks), ``capture=False`` (a plain server: no file, and
its answer names no ``kv_transfer_params.hidden_states_path``).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Sequence

import httpx
import torch

from specdraft.core.atomic import atomic_save_safetensors
from specdraft.engines.capture import descriptor


#: One forward at a time over every fake: the hook sits on the (shared) model.
FORWARD = threading.Lock()


class FakeServer:
    """One fake server of ``model`` (an HF Llama in fp32) capturing ``capture_ids``."""

    def __init__(self, model, capture_ids: Sequence[int], root: str, *,
                 die_after: int | None = None, scale: float = 1.0, head_shift: int = 0,
                 announce_ids: Sequence[int] | None = None, capture: bool = True) -> None:
        self.model, self.ids, self.root = model, list(capture_ids), root
        self.announce = list(capture_ids if announce_ids is None else announce_ids)
        self.die_after, self.scale, self.head_shift = die_after, scale, head_shift
        self.capture = capture  # False: a plain server (no connector): no file, no path said
        self.completions = 0  # capture requests answered
        self.rows: list[int] = []  # the dataset rows it captured (from the file names)
        self.lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.die_after is not None and self.completions >= self.die_after

    def revive(self) -> None:
        self.die_after = None

    def states(self, ids: list[int]) -> tuple[torch.Tensor, int]:
        """``([T, n_ids, H], greedy next token)`` in vLLM's convention."""
        N = len(self.model.model.layers)
        seen = {}
        hook = self.model.model.layers[-1].register_forward_hook(
            lambda m, a, out: seen.__setitem__("pre", out[0] if isinstance(out, tuple) else out))
        try:
            with torch.no_grad():
                out = self.model(torch.tensor([ids]), output_hidden_states=True)
        finally:
            hook.remove()
        cols = [seen["pre"][0] if k == N else out.hidden_states[k][0] for k in self.ids]
        answer = int(out.logits[0, -1].argmax()) + self.head_shift
        return torch.stack(cols, dim=1) * self.scale, answer

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused (fake server down)", request=request)
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [
                {"id": "tiny", "root": self.root}, {"id": descriptor(self.announce),
                                                    "root": self.root}]})
        if path == "/v1/completions":
            body = json.loads(request.content)
            ids = list(body["prompt"])
            target = body["kv_transfer_params"]["hidden_states_path"]
            with self.lock:  # taken or refused atomically: concurrent requests race here
                if self.down:
                    raise httpx.ConnectError("connection refused (fake server down)",
                                             request=request)
                self.completions += 1
            with FORWARD:
                hidden, answer = self.states(ids)
                if self.capture:
                    atomic_save_safetensors({"hidden_states": hidden.contiguous(),
                                             "token_ids": torch.tensor(ids, dtype=torch.long)},
                                            target)
            with self.lock:
                self.rows.append(int(Path(target).name[3:12]))
            said = {"hidden_states_path": target} if self.capture else None
            return httpx.Response(200, json={"choices": [{"text": "", "token_ids": [answer]}],
                                             "kv_transfer_params": said})
        return httpx.Response(404)


def install(monkeypatch, servers: dict[str, FakeServer]) -> None:
    """Route :func:`specdraft.extract.endpoint.make_client` for each URL to its fake."""
    import specdraft.extract.endpoint as ep

    def make_client(url: str, timeout_s: float) -> httpx.Client:
        return httpx.Client(base_url=url, timeout=timeout_s,
                            transport=httpx.MockTransport(servers[url].handle))
    monkeypatch.setattr(ep, "make_client", make_client)
