"""``specdraft eval --engine sglang``: launch an SGLang server with the verifier and the exported
drafter, send the eval's prompt token ids to its native ``/generate``, stop it.

For GPU users (SGLang does not install on a CPU-only machine). The server:
``python -m sglang.launch_server --model-path V --speculative-algorithm EAGLE3
--speculative-draft-model-path D --speculative-num-steps k --speculative-eagle-topk 1
--speculative-num-draft-tokens k+1`` (chain drafting of k tokens, as vLLM's) on 127.0.0.1.

Figures: SGLang counts per request ``meta_info.completion_tokens`` and ``spec_verify_ct``
(verify forwards); τ = Σ completion tokens / Σ verify forwards — SGLang's own
``avg_spec_accept_length`` (``/get_server_info``, recorded beside it). It counts the prefill's
first token as a committed token without a verify step, so it reads a little above vLLM's
``1 + accepted / drafts`` on short answers. No per-position counters.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import httpx

from specdraft.core.errors import InputError
from specdraft.core.verifier import resolve_dtype
from specdraft.engines.verifier_dir import engine_hf_dir
from specdraft.eval.acceptance import acceptance_rule
from specdraft.engines.launcher import free_port, http_ready, launch
from specdraft.engines.python import module_version, sglang_python
from specdraft.engines.serve import sglang_server_args
from specdraft.eval.engine import engine_drafter

def launch_command(python: str, verifier_dir: Path, drafter_dir: Path, *, k: int, port: int,
                   dtype: str, topk: int = 1, num_draft_tokens: int | None = None) -> list[str]:
    """The SGLang server command line (module doc; flags from
    :func:`specdraft.engines.serve.sglang_server_args`), bound to 127.0.0.1:``port``; ``topk``
    and ``num_draft_tokens`` (none: k + 1) for a tree (``specdraft eval --topk``)."""
    return [*sglang_server_args(str(verifier_dir), str(drafter_dir), k=k, topk=topk,
                                num_draft_tokens=num_draft_tokens, python=python),
            "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port)]


@contextlib.contextmanager
def launch_server(cmd: list[str], log_path: Path, *, port: int,
                  timeout_s: float) -> Iterator[str]:
    """Start ``cmd`` (:func:`specdraft.engines.launcher.launch`), wait up to ``timeout_s`` for
    ``/health`` (or ``/get_model_info``), yield the base URL; the process group is always
    stopped (also on Ctrl-C). Raises :class:`EngineError` with the log's last lines."""
    url = f"http://127.0.0.1:{port}"
    with launch(cmd, log_path, name="the SGLang server", env={**os.environ, "PYTHONPATH": ""},
                ready=http_ready(url, ("/health", "/get_model_info")), startup_s=timeout_s,
                timeout_flag="--engine-timeout-s", poll_s=1.0):
        yield url


def sglang_eval(client: httpx.Client, prompt_ids: Sequence[Sequence[int]], *, max_tokens: int,
                temperature: float, stop_ids: Sequence[int]) -> dict[str, Any]:
    """One native ``/generate`` per prompt (token ids in, ids out); τ from ``meta_info``.

    Raises :class:`InputError` on an HTTP error or when the server reports no verify steps
    (no drafter loaded)."""
    tokens, completion, verify, t0 = [], 0, 0, time.perf_counter()
    for i, ids in enumerate(prompt_ids):
        r = client.post("/generate", json={"input_ids": list(ids), "sampling_params": {
            "max_new_tokens": max_tokens, "temperature": temperature,
            "stop_token_ids": list(stop_ids)}})
        if r.status_code != 200:
            raise InputError(f"{client.base_url}/generate: prompt {i}: HTTP {r.status_code} "
                             f"{r.text[:200]}")
        body = r.json()
        meta = body.get("meta_info") or {}
        tokens.append(list(body.get("output_ids") or []))
        completion += int(meta.get("completion_tokens") or len(tokens[-1]))
        verify += int(meta.get("spec_verify_ct") or 0)
    seconds = time.perf_counter() - t0
    if verify <= 0:
        raise InputError("SGLang reports no spec_verify_ct: is the drafter loaded "
                         "(--speculative-algorithm EAGLE3)?")
    info = client.get("/get_server_info")
    avg = None
    if info.status_code == 200:
        data = info.json()
        avg = data.get("avg_spec_accept_length") or next(
            (s.get("avg_spec_accept_length") for s in data.get("internal_states") or []), None)
    return {"tau": completion / verify, "verify_steps": verify, "new_tokens": completion,
            "acceptance_rate": None, "per_position": [], "server_avg_spec_accept_length": avg,
            "tokens": tokens, "generate_s": round(seconds, 2),
            "tokens_per_s": completion / seconds if seconds > 0 else 0.0}


def sglang_version(python: str) -> str:
    """``"sglang X.Y.Z"`` as ``python`` imports it (``"sglang unknown"`` when it cannot)."""
    return f"sglang {module_version(python, 'sglang') or 'unknown'}"


def measure_sglang(config: Any, *, prompts: list[dict[str, Any]], stop_ids: Sequence[int],
                   out: Path) -> dict[str, Any]:
    """SGLang's figures for ``config`` (an EvalConfig) on the prompts' rendered ids."""
    python = sglang_python(config.engine_python)
    vdir = engine_hf_dir(config.verifier, config.run_dir or out)
    ddir = engine_drafter(config, out)
    dtype = resolve_dtype(config.dtype, config.device)  # the offline eval's dtype
    port = free_port()
    cmd = launch_command(python, vdir, ddir, k=config.k, port=port, dtype=dtype,
                         topk=getattr(config, "topk", 1),
                         num_draft_tokens=getattr(config, "num_draft_tokens", None))
    with launch_server(cmd, out / "engine.log", port=port,
                       timeout_s=config.engine_timeout_s) as url:
        with httpx.Client(base_url=url, timeout=config.engine_timeout_s) as client:
            res = sglang_eval(client, [p["prompt_ids"] for p in prompts],
                              max_tokens=config.max_new_tokens, temperature=config.temperature,
                              stop_ids=stop_ids)
    tokens = res.pop("tokens")
    return {"name": "sglang", "version": sglang_version(python), "k": config.k,
            "temperature": config.temperature,
            "acceptance_rule": acceptance_rule(config.temperature, "greedy"),
            "dtype": dtype, "verifier_dir": str(vdir), "drafter_dir": str(ddir),
            "command": " ".join(cmd), **res,
            "prompts": [{"id": p["id"], "new_tokens": len(t), "tokens": t}
                        for p, t in zip(prompts, tokens)]}
