"""``specdraft generate``: answer every prompt with the verifier and write
``RUN/generate/samples.jsonl`` (finished samples) and ``rejects.jsonl`` (each with its reason).

Resume (``--resume``): the settings stored in ``settings.json`` when the stage started are
compared with the new ones (:mod:`specdraft.core.resume`: transport and bookkeeping settings may
change, sampling, template, model and checks may not); a torn last line of either file is cut (and
reported); ids already in
``samples.jsonl`` are skipped, and so are ids rejected for a reason the model caused
(``truncated``, ``malformed_think``, ``empty_answer``, ``empty_reasoning``): rerunning them would
give the same answer. Ids rejected with ``error`` (server/network failure after retries) are
retried: their old lines are removed from ``rejects.jsonl`` (rewritten atomically) before work
starts. Completion order never matters: each finished sample is one whole JSONL line, appended
in flushed, fsynced batches.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, TextIO

from specdraft.core.atomic import atomic_open
from specdraft.core.context import StageContext, single_process
from specdraft.core.errors import ConfigError, InputError
from specdraft.core.jsonl import JsonlWriter, iter_jsonl, repair_torn_tail
from specdraft.core.assets import resolve_path
from specdraft.core.manifest import GenerateManifest, StageClock, path_sha256, write_manifest
from specdraft.core.rejects import Rejects, check_reject_fraction
from specdraft.core.resume import record_settings
from specdraft.core.rundir import open_stage_dir
from specdraft.generate.config import GenerateConfig
from specdraft.artifacts.prompts import REASONS as PROMPT_REASONS
from specdraft.artifacts.prompts import Prompt, read_prompts
from specdraft.generate.progress import Progress, format_summary
from specdraft.generate.screen import lower_bound_messages, screen_lengths, too_long
from specdraft.generate.samples import Checks, SampleState

STAGE = "generate"
#: The local backend's settings that make up the chat format (explicit ones are checked against
#: the run's, ``RUN/verifier.json``).
CHAT_SETTINGS = ("chat_template", "chat_template_kwargs", "think_tokens", "stop_tokens")
SAMPLES = "samples.jsonl"
REJECTS = "rejects.jsonl"
RETRIED_REASONS = frozenset({"error"})
#: Rejects of input rows found while reading the file (counted again by every run over it, not
#: finished ids): duplicates and the reader's reasons (:data:`specdraft.artifacts.prompts.REASONS`).
INPUT_REASONS = frozenset({"duplicate", "duplicate_id", *PROMPT_REASONS})


@dataclass
class PriorState:
    """What an interrupted run left: finished ids, reject counts kept, torn bytes cut."""

    done: set[str] = field(default_factory=set)
    samples: int = 0
    rejected: Counter = field(default_factory=Counter)
    retried: set[str] = field(default_factory=set)
    input_keys: set[tuple[str, str, str]] = field(default_factory=set)
    torn_bytes: dict[str, int] = field(default_factory=dict)


def _prior_records(path: Path, keys: tuple[str, ...]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``iter_jsonl(path)``, each record checked to hold string ``keys``; an
    :class:`InputError` naming ``path:line`` otherwise (the file was edited by hand)."""
    for lineno, rec in iter_jsonl(path):
        bad = [k for k in keys if not isinstance(rec.get(k), str)]
        if bad:
            raise InputError(f"{path}:{lineno}: {bad} missing or not a string; this file was "
                             f"not written by generate: rerun with --overwrite")
        yield lineno, rec


def load_prior(out: Path) -> PriorState:
    """Repair torn tails, read finished ids, drop ``error`` rejects (to be retried)."""
    st = PriorState(torn_bytes={n: repair_torn_tail(out / n) for n in (SAMPLES, REJECTS)})
    if (out / SAMPLES).exists():
        for _, rec in _prior_records(out / SAMPLES, ("id",)):
            st.done.add(rec["id"])
            st.samples += 1
    if (out / REJECTS).exists():
        kept = []
        for _, rec in _prior_records(out / REJECTS, ("id", "reason")):
            if rec["reason"] in RETRIED_REASONS:
                st.retried.add(rec["id"])
                continue
            kept.append(rec)
            st.rejected[rec["reason"]] += 1
            if rec["reason"] in INPUT_REASONS:  # a row of the file, not a finished id
                st.input_keys.add((rec["reason"], rec["id"], str(rec.get("source", ""))))
            else:
                st.done.add(rec["id"])
        if st.retried:
            with atomic_open(out / REJECTS, "w", encoding="utf-8") as f:
                f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
    st.retried -= st.done
    return st


class Sink:
    """Buffers finished samples and writes them with the rejects in flushed, fsynced batches
    (every ``flush_every`` samples or ``flush_interval_s`` seconds, and on :meth:`close`)."""

    def __init__(self, out: Path, config: GenerateConfig, progress: Progress) -> None:
        self.out = out
        self.writer = JsonlWriter(out / SAMPLES)
        self.rejects = Rejects(out, REJECTS)
        self.config = config
        self.progress = progress
        self.meta = {"chat_template_kwargs": config.chat_template_kwargs,
                     "sampling": config.sampling(), "backend": config.backend}
        self.buffer: list[dict[str, Any]] = []
        self.turn_counts: Counter[str] = Counter()  # of the samples written (tool calling)
        self.pending = 0
        self.written = 0
        self._last = time.monotonic()

    def put(self, state: SampleState, *, emit: bool = True) -> None:
        """A finished sample: buffered as a record, or added to the rejects (``emit``: whether
        its progress update may print the line, :meth:`Progress.update`)."""
        reason = state.reject[0] if state.reject else None
        if reason is None:
            self.buffer.append(state.record(self.meta))
            self.turn_counts.update(state.tool_counts())
        else:
            self.rejects.add(state.prompt.id, reason, state.reject[1], **state.reject_fields())
        self.pending += 1
        self.progress.update(reject=reason, completion_tokens=state.completion_tokens(),
                             reasoning=state.has_reasoning(),
                             sequence_tokens=state.sequence_tokens(),
                             token_ids=state.token_ids(), emit=emit)
        self.maybe_flush()

    def maybe_flush(self) -> None:
        due = time.monotonic() - self._last >= self.config.flush_interval_s
        if self.pending >= self.config.flush_every or (self.pending and due):
            self.flush()

    def flush(self) -> None:
        self.written += self.writer.write_batch(self.buffer)
        self.rejects.flush()
        self.buffer.clear()
        self.pending = 0
        self._last = time.monotonic()

    def close(self) -> None:
        self.flush()
        self.writer.close()
        self.rejects.close()


def _checks(config: GenerateConfig) -> Checks:
    return Checks(open_tag=config.think[0], close_tag=config.think[1],
                  require_reasoning=config.require_reasoning,
                  malformed_think=config.malformed_think, keep_truncated=config.keep_truncated)


def _reject_input(sink: Sink, prior: PriorState, reason: str, sample_id: str, detail: str,
                  source: str) -> None:
    """Add an input row's reject, unless an earlier run over this file already wrote it."""
    if (reason, sample_id, source) not in prior.input_keys:
        sink.rejects.add(sample_id, reason, detail, source=source)


def _select(config: GenerateConfig, out: Path, prior: PriorState, sink: Sink
            ) -> tuple[list[Prompt], dict[str, int], Counter[str]]:
    """Prompts still to do, after ``--limit`` and resume; bad rows and duplicates go to the
    rejects (file:line, id, reason). Also returns the rows' reject counts (for
    ``--max-reject-fraction``)."""
    read = read_prompts(config.prompts, fields=config.field_map(),
                        sampling=config.sampling(),
                        chat_template_kwargs=config.chat_template_kwargs,
                        system_prompt=config.system_prompt)
    prompts, dups = read.prompts, read.duplicates
    bad: Counter[str] = Counter()
    for err in read.rejected:
        bad[err.reason] += 1
        _reject_input(sink, prior, err.reason, err.sample_id, err.detail, err.where)
    if config.limit is not None:
        prompts = prompts[: config.limit]
    chosen = {p.id for p in prompts}
    for d in dups:
        if d.id in chosen:
            _reject_input(sink, prior, "duplicate", d.id, "same conversation and sampling as "
                          "an earlier row", d.source)
    todo = [p for p in prompts if p.id not in prior.done]
    counts = {"rows_in": read.rows, "unique_prompts": len(read.prompts),
              "rows_rejected": len(read.rejected), "selected": len(prompts),
              "already_done": len(prompts) - len(todo),
              "orphan_ids": len(prior.done - chosen)}
    return todo, counts, bad


class Screen:
    """Rejects over-long prompts before they are sent (:mod:`specdraft.generate.screen`) and
    stops a run whose input is mostly rejected; ``facts`` says how lengths were checked."""

    def __init__(self, config: GenerateConfig, sink: Sink, prior: PriorState,
                 rows: int, bad: Counter[str], stream: TextIO | None) -> None:
        self.config, self.sink, self.rows, self.stream = config, sink, rows, stream
        self.rejected = bad + Counter({"too_long": prior.rejected["too_long"]})
        self.facts: dict[str, Any] = {}

    def __call__(self, todo: list[Prompt], count: Any, context: int | None,
                 **facts: Any) -> list[Prompt]:
        """``todo`` without its ``too_long`` prompts; raises :class:`InputError` past
        ``--max-reject-fraction``. ``count(prompt)``: its tokens (None: unknown)."""
        self.facts = {"context_tokens": context, **facts}
        if context is None and todo:
            why = ("the server lists no max_model_len; pass --verifier"
                   if self.config.backend == "openai" else
                   "its config has no max_position_embeddings")
            _say(self.stream, f"generate: the verifier's context length is unknown ({why}); "
                              f"over-long prompts are not screened")

        def reject(p: Prompt, detail: str) -> None:
            self.sink.rejects.add(p.id, "too_long", detail, source=p.source)
            self.rejected["too_long"] += 1

        kept = screen_lengths(todo, count, context, reject)
        self.facts["too_long"] = len(todo) - len(kept)
        first = [_short(f"{r.get('source')}: {r['detail']}", 160)
                 for r in self.sink.rejects.pending if r["reason"] != "duplicate"][:2]
        try:
            check_reject_fraction(+self.rejected, self.rows, self.config.max_reject_fraction,
                                  details=f"first: {' | '.join(first)}; nothing was generated "
                                          f"or written: fix the input and rerun (or raise "
                                          f"--max-reject-fraction)")
        except InputError:
            self.sink.rejects.discard()  # refused before any work: no file blocks the rerun
            raise
        self.sink.progress.set_total(len(kept))
        return kept


def run(config: GenerateConfig, ctx: StageContext | None = None, *, verifier: Any = None,
        stream: TextIO | None = None) -> GenerateManifest:
    """Run the generate stage; return its manifest (typed).

    ``ctx``: this process (:mod:`specdraft.core.context`; one process only, the local backend
    loads the verifier on ``ctx.device``), else read from the environment.

    ``verifier``: for ``backend="local"``, an already-loaded
    :class:`~specdraft.generate.local_backend.LocalBackend` or ``(model, tokenizer)`` pair, so
    a pipeline loads the verifier once; None loads ``config.verifier``. ``stream`` receives the
    progress lines and summary (default stderr).

    Raises :class:`~specdraft.core.errors.StageDirError` on non-empty output without
    ``--resume``/``--overwrite``, :class:`~specdraft.core.errors.InputError` on an unreadable
    prompt file or an input mostly rejected (``--max-reject-fraction``; bad rows are
    rejects), :class:`ConfigError` on a missing API key variable. ``KeyboardInterrupt``
    propagates after every finished sample has been written (the state is resumable).
    """
    clock = StageClock()
    ctx = single_process(STAGE, ctx, getattr(config, "device", None))
    api_key = _api_key(config)
    out = open_stage_dir(config.run_dir, STAGE, resume=config.resume,
                         overwrite=config.overwrite)
    changes = record_settings(out, config, stage=STAGE, resume=config.resume)
    prior = load_prior(out)
    for name, cut in prior.torn_bytes.items():
        if cut:
            _say(stream, f"generate: cut a torn last line ({cut} bytes) from {out / name}")
    progress = Progress(0, interval_s=config.progress_interval_s, stream=stream)
    sink = Sink(out, config, progress)
    facts: dict[str, Any] = {}
    try:
        todo, counts, bad = _select(config, out, prior, sink)
        screen = Screen(config, sink, prior, counts["rows_in"], bad, stream)
        progress.set_total(len(todo))
        progress.start(f"generate: {len(todo)} prompts to answer ({config.backend} backend); "
                       f"a progress line every {config.progress_interval_s:g} s")
        if config.backend == "openai":
            facts = asyncio.run(_run_openai(todo, config, sink, api_key, screen))
        else:
            facts = _run_local(todo, config, sink, verifier, str(ctx.device), screen)
        facts["length_check"] = screen.facts
    finally:
        sink.close()
        progress.close()
    summary = progress.summary()
    summary["rejected"] = dict(sorted(sink.rejects.counts.items()))  # with duplicate prompts
    summary["turns"] = turn_summary(sink.turn_counts)
    _say(stream, format_summary(summary))
    return _finish(config, out, clock, prior, sink, counts, summary,
                   {**facts, "resume_changes": changes})


def turn_summary(counts: Counter[str]) -> dict[str, int]:
    """The turn counts of the samples written this run: ``regenerated`` (answered by the
    verifier), ``kept`` (the data's tool calls kept because a result follows them),
    ``tool_call_answers`` (regenerated answers that call tools), ``tool_results_kept``,
    ``not_generated_after_tool_call`` and ``samples_with_tools`` (docs/stages.md)."""
    keys = ("regenerated", "kept", "tool_call_answers", "tool_results_kept",
            "not_generated_after_tool_call", "samples_with_tools")
    return {k: int(counts[k]) for k in keys}


def _finish(config: GenerateConfig, out: Path, clock: StageClock, prior: PriorState,
            sink: Sink, counts: dict[str, int], summary: dict[str, Any],
            facts: dict[str, Any]) -> GenerateManifest:
    rejected = prior.rejected + sink.rejects.counts
    counts = {**counts, "retried_errors": len(prior.retried), "finished_this_run":
              sink.progress.done, "samples": prior.samples + sink.written,
              "rejected": dict(sorted(rejected.items()))}
    extra = {"summary": summary, "torn_tail_bytes_cut": prior.torn_bytes, **facts,
             "reject_policy_on_resume": "error rejects retried; other reasons kept"}
    return write_manifest(out, stage=STAGE, config=config, clock=clock,
                          inputs={"prompts": path_sha256(resolve_path(config.prompts))},
                          counts=counts,
                          extra=extra)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _say(stream: TextIO | None, text: str) -> None:
    import sys

    print(text, file=stream or sys.stderr, flush=True)


def _api_key(config: GenerateConfig) -> str | None:
    if config.api_key_env is None:
        return None
    key = os.environ.get(config.api_key_env)
    if not key:
        raise ConfigError(f"--api-key-env {config.api_key_env}: environment variable is not set")
    return key


def request_body(config: GenerateConfig) -> dict[str, Any]:
    """Fields sent with every chat completion request (extra body fields last, so they win)."""
    body: dict[str, Any] = {**config.sampling(), "stream": False}
    if config.chat_template_kwargs:
        body["chat_template_kwargs"] = config.chat_template_kwargs
    if config.return_token_ids:
        body["return_token_ids"] = True
    return {**body, **config.extra_body}


async def _run_openai(todo: list[Prompt], config: GenerateConfig, sink: Sink,
                      api_key: str | None, screen: Screen) -> dict[str, Any]:
    from specdraft.generate.client import OpenAIBackend, RequestFailed

    checks = _checks(config)
    async with OpenAIBackend(config.endpoint, model=config.model, api_key=api_key,
                             body_defaults=request_body(config),
                             concurrency=config.concurrency, timeout_s=config.timeout_s,
                             max_retries=config.max_retries, backoff_base_s=config.backoff_base_s,
                             backoff_max_s=config.backoff_max_s, seed=config.seed) as be:
        model = await _resolve_model(be)
        todo = await _screen_served(todo, config, be, screen)
        it = iter(todo)

        async def worker() -> None:
            for prompt in it:
                state = SampleState(prompt)
                while not state.done:
                    try:
                        state.add(await be.complete(state.request(), state.request_fields()),
                                  checks)
                    except RequestFailed as err:
                        state.fail(err.kind, str(err), err.attempts)
                sink.put(state)

        await _drive([worker() for _ in range(min(config.concurrency, len(todo)))], sink)
    return {"model": model, "endpoints": be.urls, "retries": dict(sorted(be.retries.items())),
            "retries_by_endpoint": dict(sorted(be.retries_by_endpoint.items())),
            "peak_in_flight": dict(sorted(be.peak_in_flight.items())),
            "failed_requests": dict(sorted(be.failures.items()))}


async def _screen_served(todo: list[Prompt], config: GenerateConfig, be: Any,
                         screen: Screen) -> list[Prompt]:
    """:class:`Screen` for a server: its context from ``/v1/models`` (else the ``--verifier``
    config), each prompt's tokens from its ``/tokenize`` (else the ``--verifier`` tokenizer)."""
    context, source = await be.context_length(), "server /v1/models max_model_len"
    given = "verifier" in config.model_fields_set
    if context is None and given:
        context, source = _verifier_context(config.verifier), "--verifier config"
    if context is None or not todo:
        return screen(todo, None, None)
    first = await be.count_prompt_tokens(lower_bound_messages(todo[0]), tools=todo[0].tools)
    if first is not None:
        sem = asyncio.Semaphore(config.concurrency)

        async def one(p: Prompt) -> int | None:
            async with sem:
                return await be.count_prompt_tokens(lower_bound_messages(p), tools=p.tools)

        counts = dict(zip([p.id for p in todo[1:]],
                          await asyncio.gather(*(one(p) for p in todo[1:]))))
        counts[todo[0].id] = first
        return screen(todo, lambda p: counts[p.id], context, context_from=source,
                      counted_by="server /tokenize")
    if not given:
        return screen(todo, None, None, context_from=source)
    count = _verifier_counter(config)
    return screen(todo, count, context, context_from=source, counted_by="--verifier tokenizer")


def _verifier_context(verifier: str) -> int | None:
    """``max_position_embeddings`` of the ``--verifier`` config, None when it cannot be read."""
    from specdraft.core.profile import load_hf_config, text_config

    try:
        value = getattr(text_config(load_hf_config(verifier)), "max_position_embeddings", None)
    except Exception:  # any unreadable config only turns the screen off (said on stderr)
        return None
    return value if isinstance(value, int) and value > 0 else None


def _verifier_counter(config: GenerateConfig) -> Any:
    """``count(prompt)``: tokens of its lower-bound conversation rendered with the
    ``--verifier`` tokenizer's chat template (the server renders with the same one)."""
    from specdraft.core.chat import ChatFormat, TemplateError, message_for_template
    from specdraft.core.verifier import load_tokenizer

    tok = load_tokenizer(config.verifier)
    fmt = ChatFormat.resolve(tok, chat_template=config.chat_template,
                             kwargs=config.chat_template_kwargs)
    renderer = fmt.renderer(tok)

    def count(p: Prompt) -> int | None:
        try:
            text = renderer.render([message_for_template(m) for m in lower_bound_messages(p)],
                                   tools=p.tools, kwargs=fmt.kwargs, add_generation_prompt=True)
        except TemplateError:
            return None
        return len(renderer.encode(text))

    return count


async def _resolve_model(be: Any) -> str:
    import httpx

    try:
        return await be.resolve_model()
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as err:
        raise ConfigError(f"--endpoint: no endpoint could list its models (last, {be.urls[-1]}: "
                          f"{type(err).__name__}: {err}); pass --model NAME") from None


async def _drive(coros: list[Any], sink: Sink) -> None:
    """Run the workers; a ticker flushes and prints progress while requests are in flight.
    On cancellation (Ctrl-C) the workers are cancelled; finished samples stay in the sink."""
    tasks = [asyncio.ensure_future(c) for c in coros]

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0.5)
            sink.progress.tick()
            sink.maybe_flush()

    tick = asyncio.ensure_future(ticker())
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in [*tasks, tick]:
            t.cancel()
        await asyncio.gather(*tasks, tick, return_exceptions=True)


def _run_local(todo: list[Prompt], config: GenerateConfig, sink: Sink,
               verifier: Any, device: str, screen: Screen) -> dict[str, Any]:
    """Generate in-process; the chat format is resolved here (the first stage to touch the
    tokenizer) and bound to the run (``RUN/verifier.json``,
    :func:`specdraft.artifacts.verifier_contract.bind`); also recorded as
    ``RUN/generate/chat_format.json``."""
    from specdraft.artifacts import verifier_contract
    from specdraft.core.chat import DEFAULT_THINK, ChatFormat
    from specdraft.core.verifier import load_tokenizer, load_verifier
    from specdraft.generate.local_backend import LocalBackend

    if isinstance(verifier, LocalBackend):
        backend = verifier
    else:
        if verifier is None and not todo:
            screen(todo, None, None)
            return {"model": Path(config.verifier).name}
        model, tok = verifier if verifier is not None else (
            load_verifier(config.verifier, dtype=config.dtype, device=device),
            load_tokenizer(config.verifier))
        think = config.think
        fmt = ChatFormat.resolve(tok, chat_template=config.chat_template,
                                 kwargs=config.chat_template_kwargs,
                                 think_tokens=None if think == DEFAULT_THINK else think,
                                 stop_tokens=config.stop_tokens)
        given = verifier_contract.describe(STAGE, verifier=config.verifier, tokenizer=tok,
                                           chat=fmt)
        explicit = bool(set(CHAT_SETTINGS) & config.model_fields_set)
        fmt = verifier_contract.bind(config.run_dir, given, chat_explicit=explicit).chat or fmt
        backend = LocalBackend(model, tok, name=Path(config.verifier).name,
                               max_tokens=config.max_tokens, temperature=config.temperature,
                               top_p=config.top_p, seed=config.seed, chat_format=fmt)
    backend.chat_format.save(sink.out)
    todo = screen(todo, lambda p: backend.count_tokens(lower_bound_messages(p), tools=p.tools),
                  backend.context, context_from="verifier max_position_embeddings",
                  counted_by="verifier tokenizer")
    checks = _checks(config)
    for i in range(0, len(todo), config.batch_size):
        states = [SampleState(p) for p in todo[i: i + config.batch_size]]
        while active := [s for s in states if not s.done]:
            requests = [s.request() for s in active]
            for s, r in zip(active, requests):  # a later turn's history may outgrow the context
                detail = too_long(backend.count_tokens(r, tools=s.prompt.tools), backend.context)
                if detail:
                    s.reject = ("too_long", f"turn {len(s.turns)}: {detail}")
            go = [(s, r) for s, r in zip(active, requests) if not s.done]
            outs = backend.generate([r for _, r in go], tools=[s.prompt.tools for s, _ in go]) \
                if go else []
            for (s, _), o in zip(go, outs):
                s.add(o, checks)
        for s in states:
            sink.put(s, emit=False)
        sink.progress.tick()  # one line per finished batch, counting all of it
    return {"model": backend.name, "endpoints": [backend.endpoint]}
