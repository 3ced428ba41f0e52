"""``eval --server``: is the served model the verifier the drafter was trained on?

Before any figure is measured, three things are read from the running engine and compared with
what the run stored:

1. **its name**: ``GET /v1/models`` ``id`` (and vLLM's ``root``, the path it loaded) against the
   verifier the run is bound to (``RUN/verifier.json``'s identity path, the engines' HF name of
   it, :func:`specdraft.engines.serve.served_verifier`) or ``--verifier`` when given: equal, or
   the same last path component (``/models/SmolLM2-135M-Instruct`` serves
   ``HuggingFaceTB/SmolLM2-135M-Instruct``);
2. **its ``max_model_len``** (vLLM and SGLang list it in ``/v1/models``): at most the recorded
   verifier's ``max_position_embeddings`` (a longer context is another config: rope scaling, or
   another model) and long enough for the stored rows checked below;
3. **its next-token log-probabilities** on :data:`ROWS` stored ``RUN/extract`` rows,
   :data:`POSITIONS` supervised positions each: ``POST /v1/completions`` with the row's token ids
   up to the position as the prompt, ``max_tokens`` 1, temperature 0, ``logprobs``
   :data:`TOP_K` and vLLM's ``return_tokens_as_token_ids`` (top tokens spelled ``token_id:N``).
   The stored teacher is ``log_softmax(final_hidden @ lm_headᵀ)`` (``RUN/extract`` rows and
   ``verifier_head.safetensors``: what training distilled). Per position, the mean absolute
   difference of the served top-k log-probabilities from the teacher's for the same token ids
   (an engine that spells tokens as text: the sorted values against the teacher's top-k),
   and whether the served top token is the teacher's argmax. The check fails when the mean
   over the positions exceeds :data:`MAX_LOGPROB_DIFF` nats or the top tokens agree at fewer
   than :data:`MIN_TOP1` of them (limits measured, see their comment).

A check that cannot run (no run directory, no extract rows, a server that lists no
``max_model_len``) is reported as ``not run`` with the reason, never as passed. A failed check
refuses the eval (:class:`ConfigError`) unless ``--allow-other-verifier``, recorded in
``results.json`` as ``served_model``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import httpx

from specdraft.core.errors import ConfigError, InputError

ROWS = 2             # stored extract rows whose teacher is compared with the served one
POSITIONS = 8        # supervised positions per row (one completion request each)
TOP_K = 5            # served log-probabilities per position
# Limits of the logprob check, measured with transformers (`python
# benchmarks/probe_calibration.py [--smollm2]`, statistic "logp"; docs/verifier-binding.md),
# against the fp32 teacher stored in bf16. SmolLM2-135M: a bf16 forward (a GPU server) mean
# 0.076 nats, top-1 0.97; 8-bit round-to-nearest 0.089, 0.94; 4-bit round-to-nearest (cruder
# than GPTQ/AWQ) 1.51, 0.63; tiny Llama: another random init 0.49, top-1 0.00. A served model
# passes when its top token is the teacher's at MIN_TOP1 of the positions and its top-k
# log-probabilities differ from the teacher's by at most MAX_LOGPROB_DIFF nats on average.
MIN_TOP1 = 0.4
MAX_LOGPROB_DIFF = 2.0


def _basename(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1].lower()


def expected_names(config: Any) -> list[str]:
    """The names the served model may carry: the run's recorded verifier path and the engines'
    HF name of it, else ``--verifier`` when given; empty when neither is known."""
    from specdraft.artifacts.verifier_contract import run_verifier
    from specdraft.engines.serve import hub_id, served_verifier

    names: list[str] = []
    identity = run_verifier(config.run_dir).identity if config.run_dir else None
    given = "verifier" in config.model_fields_set
    for v in ([identity.get("path")] if identity else []) + ([config.verifier] if given
                                                             else []):
        if v:
            names += [str(v), served_verifier(config.run_dir, str(v)), hub_id(str(v)) or ""]
    return [n for n in dict.fromkeys(names) if n and not n.startswith("<")]


def check_name(card: dict[str, Any], expected: list[str]) -> dict[str, Any]:
    """The served ``id``/``root`` against ``expected`` (:func:`expected_names`)."""
    served = [str(card.get(k)) for k in ("id", "root") if card.get(k)]
    if not expected:
        return {"status": "not run", "served": served,
                "line": "served model name: not checked (no --run-dir with a recorded "
                        "verifier, and no --verifier given)"}
    ok = any(s == e or _basename(s) == _basename(e) for s in served for e in expected)
    line = (f"served model name: {served[0]!r} is the run's verifier" if ok else
            f"served model name: the server serves {' / '.join(map(repr, served))} "
            f"(GET /v1/models id / root), not the verifier the drafter was trained on "
            f"({', '.join(map(repr, expected))})")
    return {"status": "passed" if ok else "failed", "served": served, "expected": expected,
            "line": line}


def check_context(card: dict[str, Any], recorded: int | None, needed: int) -> dict[str, Any]:
    """The served ``max_model_len`` against the recorded ``max_position_embeddings`` and the
    ``needed`` tokens of the rows checked."""
    served = card.get("max_model_len")
    if served is None:
        return {"status": "not run", "line": "served max_model_len: not checked (the server "
                                             "lists no max_model_len in /v1/models)"}
    problems = []
    if recorded is not None and int(served) > int(recorded):
        problems.append(f"max_model_len {served} is longer than the max_position_embeddings "
                        f"{recorded} of the verifier the drafter was trained on (another config"
                        f": rope scaling, or another model)")
    if int(served) < needed:
        problems.append(f"max_model_len {served} is shorter than the {needed} tokens of the "
                        f"stored rows checked")
    line = "served max_model_len: " + ("; ".join(problems) if problems else
                                       f"{served} (trained-on verifier: {recorded})")
    return {"status": "failed" if problems else "passed", "served": int(served),
            "recorded": recorded, "line": line}


def stored_teacher(run_dir: Path | None) -> list[dict[str, Any]] | None:
    """Up to :data:`ROWS` x :data:`POSITIONS` stored teacher positions: ``{"row", "prompt"
    (token ids up to and including the position), "logprobs" [V] float64}``; None without
    ``RUN/extract`` rows."""
    import torch

    from specdraft.artifacts.hidden_states import DiskSource, extract_rows_dir, \
        load_verifier_head

    rows = extract_rows_dir(run_dir)
    if rows is None:
        return None
    source = DiskSource(rows)
    head = load_verifier_head(rows)["lm_head.weight"].double()  # [V, H]
    out = []
    for row in source.get_batch(range(min(ROWS, len(source)))):
        for j, p in enumerate(row.target_positions.tolist()[:POSITIONS]):
            logits = row.final_hidden[j].double() @ head.T  # [V]
            out.append({"row": row.key, "position": p,
                        "prompt": row.input_ids[:p + 1].tolist(),
                        "logprobs": torch.log_softmax(logits, dim=-1)})
    return out


def _served_top(client: httpx.Client, model: str, prompt: list[int]) -> dict[str, float]:
    r = client.post("/v1/completions", json={
        "model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
        "logprobs": TOP_K, "return_tokens_as_token_ids": True})
    if r.status_code != 200:
        raise InputError(f"{client.base_url}/v1/completions: HTTP {r.status_code} "
                         f"{r.text[:200]} (the served-model check sends token ids with "
                         f"logprobs {TOP_K})")
    try:
        top = r.json()["choices"][0]["logprobs"]["top_logprobs"][0]
        return {str(k): float(v) for k, v in top.items()}
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise InputError(f"{client.base_url}/v1/completions returned no top_logprobs "
                         f"({type(e).__name__}: {e})") from e


def _position_diff(top: dict[str, float], teacher: Any) -> tuple[float, bool | None]:
    """Mean |served - stored| over the served top-k, and whether the served top token is the
    teacher's argmax: by token id when the engine spells ``token_id:N``, else sorted values
    against the teacher's top-k (agreement unknown: None)."""
    import torch

    ids = [k.removeprefix("token_id:") for k in top]
    if top and all(k.startswith("token_id:") for k in top) and all(i.isdigit() for i in ids):
        pairs = [(v, float(teacher[int(i)])) for i, v in zip(ids, top.values())]
        best = int(ids[max(range(len(ids)), key=lambda j: list(top.values())[j])])
        agree: bool | None = best == int(teacher.argmax())
    else:
        mine = sorted(top.values(), reverse=True)
        pairs = list(zip(mine, torch.topk(teacher, len(mine)).values.tolist()))
        agree = None
    return sum(abs(a - b) for a, b in pairs) / max(len(pairs), 1), agree


def check_logprobs(client: httpx.Client, model: str, teacher: list[dict[str, Any]] | None
                   ) -> dict[str, Any]:
    """The served log-probabilities against the stored teacher (module doc, item 3)."""
    if not teacher:
        return {"status": "not run", "line": "served logprobs: not checked (no RUN/extract "
                                             "rows: give --run-dir of the run that extracted "
                                             "them)"}
    got = [_position_diff(_served_top(client, model, t["prompt"]), t["logprobs"])
           for t in teacher]
    mean = sum(d for d, _ in got) / len(got)
    known = [a for _, a in got if a is not None]
    top1 = sum(known) / len(known) if known else None
    ok = math.isfinite(mean) and mean <= MAX_LOGPROB_DIFF and (top1 is None or
                                                                top1 >= MIN_TOP1)
    agreement = f"{top1:.2f}" if top1 is not None else "unknown (tokens spelled as text)"
    line = (f"served logprobs: {len(got)} stored positions, mean |served - stored| top-{TOP_K} "
            f"log-probability {mean:.3g} nats (at most {MAX_LOGPROB_DIFF:g}), top token = the "
            f"teacher's at {agreement} of them (at least {MIN_TOP1:g})"
            + ("" if ok else ": the served model is not the one whose teacher the drafter "
                             "was trained on"))
    return {"status": "passed" if ok else "failed", "positions": len(got),
            "mean_abs_diff": mean, "top1": top1, "line": line}


def recorded_context(config: Any) -> int | None:
    """``max_position_embeddings`` of the verifier the run recorded, else of ``--verifier``
    when given, else None."""
    from specdraft.artifacts.verifier_contract import run_verifier

    identity = run_verifier(config.run_dir).identity if config.run_dir else None
    if identity and identity.get("config", {}).get("max_position_embeddings"):
        return int(identity["config"]["max_position_embeddings"])
    if "verifier" not in config.model_fields_set:
        return None
    from specdraft.core.profile import load_hf_config

    hf = load_hf_config(config.verifier)
    hf = getattr(hf, "text_config", None) or hf
    return getattr(hf, "max_position_embeddings", None)


def check_served(config: Any, client: httpx.Client) -> dict[str, Any]:
    """Run the three checks (module doc) against the server of ``client``; print each line on
    stderr. Raises :class:`ConfigError` naming every failed check unless
    ``config.allow_other_verifier`` (then ``allowed_by_flag`` is recorded)."""
    from specdraft.eval.server import model_card

    card = model_card(client)
    teacher = stored_teacher(config.run_dir)
    needed = max((len(t["prompt"]) + 1 for t in teacher or []), default=0)
    checks = {"name": check_name(card, expected_names(config)),
              "max_model_len": check_context(card, recorded_context(config), needed),
              "logprobs": check_logprobs(client, str(card["id"]), teacher)}
    for c in checks.values():
        print(f"eval: {c['line']}", file=sys.stderr)
    failed = [c["line"] for c in checks.values() if c["status"] == "failed"]
    if failed and not config.allow_other_verifier:
        raise ConfigError(f"--server {config.server}: {'; '.join(failed)}. Serve the verifier "
                          f"the drafter was trained on, or pass --allow-other-verifier to "
                          f"measure anyway (recorded in the results)")
    return {**checks, "ok": not failed, "allowed_by_flag": bool(failed)}
