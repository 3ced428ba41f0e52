"""``specdraft prepare``: conversations -> ``RUN/prepare/dataset/`` with exact loss masks.

Reads ``RUN/generate/samples.jsonl`` (or ``--data``), encodes every supervised assistant turn
with :func:`specdraft.prepare.turns.encode_turn`, writes the dataset, ``rejects.jsonl`` and the
manifest. Prepare is deterministic and cheap, so ``--resume`` simply runs it again over the
same directory (outputs are replaced atomically).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from specdraft.core.chat import (DEFAULT_THINK, ChatFormat, Renderer,
                                 added_token_ids, byte_fallback_ids, message_reasoning,
                                 template_special_ids)
from specdraft.core.context import StageContext, single_process
from specdraft.core.errors import ConfigError, InputError, clip
from specdraft.core.manifest import (MANIFEST, PrepareManifest, StageClock, input_hash,
                                     path_sha256, write_manifest)
from specdraft.core.rejects import Rejects, check_reject_fraction
from specdraft.core.rundir import open_stage_dir, require_stage
from specdraft.prepare.config import PrepareConfig
from specdraft.prepare.records import (Sample, iter_records, iter_turns, record_id,
                                       split_inline_reasoning, to_sample)
from specdraft.prepare.stats import Summary
from specdraft.prepare.turns import (Rules, Turn, TurnRejected, check_token_ids,
                                     encode_turn, tool_call_rendering_differs)
from specdraft.prepare.writer import DatasetWriter
from specdraft.artifacts import verifier_contract
from specdraft.artifacts.prompts import REASONS as PROMPT_REASONS
from specdraft.artifacts.prompts import missing_message
from specdraft.artifacts.layout import RunLayout
from specdraft.artifacts.verifier_contract import VerifierContract

STAGE = "prepare"


def load_prepare_tokenizer(config: PrepareConfig) -> Any:
    """The tokenizer: ``--tokenizer`` (HF dir, ``.gguf`` or ``smollm2``) else the verifier's."""
    from specdraft.core.verifier import load_tokenizer

    if config.tokenizer is None:
        return load_tokenizer(config.verifier, trust_remote_code=config.trust_remote_code)
    path = Path(config.tokenizer)
    if path.is_dir():
        from transformers import AutoTokenizer

        from specdraft.core.verifier import require_trust

        require_trust(path, config.trust_remote_code)
        return AutoTokenizer.from_pretrained(str(path),
                                             trust_remote_code=config.trust_remote_code)
    return load_tokenizer(path, trust_remote_code=config.trust_remote_code)


#: The prepare settings that make up the chat format (explicit ones are checked against the run's).
CHAT_SETTINGS = ("chat_template", "chat_template_kwargs", "think_tokens", "stop_tokens",
                 "add_special_tokens")


def bind_verifier(config: PrepareConfig, tokenizer: Any) -> VerifierContract:
    """The run's verifier contract (``RUN/verifier.json``,
    :func:`specdraft.artifacts.verifier_contract.bind`) with this stage's verifier, tokenizer and
    chat format: its ``chat`` is the run's when this stage's chat settings were left unset (local
    generation resolved it), else the one these settings resolve, which must render chats as the
    run's does; its ``vocab_size`` is the verifier's LM head rows. Raises :class:`ConfigError`
    naming the contract and every difference (another verifier, tokenizer or vocabulary; other
    chat settings)."""
    fmt = ChatFormat.resolve(tokenizer, chat_template=config.chat_template,
                             kwargs=config.chat_template_kwargs,
                             add_special_tokens=config.add_special_tokens,
                             think_tokens=config.think_tokens, stop_tokens=config.stop_tokens)
    given = verifier_contract.describe(STAGE, verifier=config.verifier, tokenizer=tokenizer,
                                       tokenizer_path=config.tokenizer,
                                       trust_remote_code=config.trust_remote_code, chat=fmt)
    explicit = bool(set(CHAT_SETTINGS) & config.model_fields_set)
    return verifier_contract.bind(config.run_dir, given, chat_explicit=explicit)


def input_files(config: PrepareConfig) -> tuple[Path, dict[str, str]]:
    """The conversation source and the ``inputs`` hashes for the manifest."""
    if config.data is not None:
        path = Path(config.data)
        if not path.exists():
            raise ConfigError(missing_message(path, "--data"))
        return path, {"data": path_sha256(path)}
    require_stage(config.run_dir, "generate")
    gen = RunLayout(config.run_dir).generate
    return gen / "samples.jsonl", {"generate": input_hash(gen)}


class _Job:
    """State of one prepare run: renderer, rules, outputs and counters."""

    def __init__(self, config: PrepareConfig, fmt: ChatFormat, renderer: Renderer, rules: Rules,
                 out: Path, vocab_size: int) -> None:
        self.config, self.renderer, self.rules = config, renderer, rules
        self.default_kwargs = fmt.kwargs  # of samples that carry no chat_template_kwargs
        self.think_tags = rules.think or DEFAULT_THINK
        self.rejects = Rejects(out, filename=f"rejects.jsonl.tmp-{os.getpid()}")
        self.writer = DatasetWriter(out / f"dataset.arrow.tmp-{os.getpid()}")
        self.summary = Summary(vocab_size)
        self.vocab_size = vocab_size
        self.kwargs_seen: Counter[str] = Counter()
        self.ids_seen: set[str] = set()
        self.records_rejected = 0  # records rejected whole (their turns are not counted)
        #: supervised tool-call turns, and those whose stored call renders other than the
        #: server's ids (the first three named): manifest ``tool_calls``
        self.tool_calls: Counter[str] = Counter(turns=0, rendered_differently=0)
        self.tool_calls_first: list[dict[str, str]] = []

    def add_record(self, where: str, record: dict[str, Any]) -> None:
        """Encode every supervised turn of one record (rows or rejects)."""
        self.summary.samples_in += 1
        try:
            sample = to_sample(record, where, self.default_kwargs, self.config.field_map())
            sample = split_inline_reasoning(sample, self.think_tags)
        except TurnRejected as err:
            self.records_rejected += 1
            self.rejects.add(record_id(record, where, self.config.field_map()), err.reason,
                             err.detail, where=where)
            return
        if sample.id in self.ids_seen:
            self.records_rejected += 1
            self.rejects.add(sample.id, "duplicate_id", f"{where}: id seen before", where=where)
            return
        self.ids_seen.add(sample.id)
        self.kwargs_seen[json.dumps(sample.kwargs, sort_keys=True)] += 1
        for turn_index, meta in iter_turns(sample, self.config.turns):
            self.summary.turns_in += 1
            self.add_turn(sample, turn_index, meta)

    def add_turn(self, sample: Sample, turn_index: int, meta: dict[str, Any]) -> None:
        key = f"{sample.id}/{turn_index}"
        message = sample.messages[meta["message_index"]]
        try:
            turn = Turn(messages=sample.messages, message_index=meta["message_index"],
                        reasoning=message_reasoning(message),
                        finish_reason=str(meta.get("finish_reason") or "stop"),
                        completion_token_ids=check_token_ids(
                            meta.get("completion_token_ids"), "completion_token_ids",
                            self.vocab_size),
                        tools=sample.tools, kwargs=sample.kwargs,
                        prompt_token_ids=check_token_ids(meta.get("prompt_token_ids"),
                                                         "prompt_token_ids", self.vocab_size))
            if self.config.require_reasoning and not turn.reasoning.strip():
                raise TurnRejected("no_reasoning", "--require-reasoning and the turn has none")
            enc = encode_turn(self.renderer, turn, self.rules)
            check_scaffold(enc.scaffold, self.config.allow_empty_think_scaffold)
            _check_tool_calls(self.renderer, message, meta["message_index"], enc)
            differs = tool_call_rendering_differs(self.renderer, turn, self.rules, enc)
        except TurnRejected as err:
            self.rejects.add(key, err.reason, err.detail)
            return
        if message.get("tool_calls"):
            self.tool_calls["turns"] += 1
            if differs:
                self.tool_calls["rendered_differently"] += 1
                self.tool_calls_first.extend([{"id": key, "detail": differs}][:3 - len(
                    self.tool_calls_first)])
        self.writer.add({"input_ids": enc.input_ids, "loss_mask": enc.loss_mask,
                         "sample_id": sample.id, "turn_index": turn_index,
                         "seq_len": len(enc.input_ids), "truncated": enc.truncated})
        self.summary.add_row(enc.input_ids, enc.loss_mask, reasoning=bool(turn.reasoning.strip()),
                             truncated=enc.truncated, scaffold=enc.scaffold)


def check_scaffold(scaffold: str | None, allowed: bool) -> None:
    """Refuse a turn whose supervised tokens start with a thinking template's own empty think
    block (``empty_think_scaffold``, :func:`specdraft.prepare.turns.completion_text`) unless
    ``--allow-empty-think-scaffold``: with no server token ids the block is the template's text,
    not known to be the model's, and a drafter trained on it learns to draft a scaffold the
    served verifier may never write (issue 39). Raises :class:`TurnRejected`
    (``empty_think_scaffold``, a counted reject)."""
    if scaffold == "empty_think_scaffold" and not allowed:
        raise TurnRejected("empty_think_scaffold", "the chat template writes an empty think "
                           "block before this answer without reasoning, and no server token "
                           "ids say the model wrote it; pass --allow-empty-think-scaffold to "
                           "supervise it as generated, or generate with a server that returns "
                           "token ids (vLLM does)")


def _check_tool_calls(renderer: Renderer, message: dict[str, Any], index: int,
                      enc: Any) -> None:
    """A supervised turn that calls tools must supervise the calls: when the chat template does
    not render ``tool_calls`` (SmolLM2's, for one), the row would train on the end-of-turn token
    alone; ``tool_calls_unsupported`` instead of that silent row."""
    calls = message.get("tool_calls") or ([{"function": message["function_call"]}]
                                          if message.get("function_call") else [])
    if not calls:
        return
    text = renderer.decode([t for t, m in zip(enc.input_ids, enc.loss_mask) if m])
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or name not in text:
            raise TurnRejected("tool_calls_unsupported",
                               f"message {index}: the chat template does not "
                               f"render its tool call {clip(name)}; the row would supervise "
                               f"the end of the turn only")


def start_job(config: PrepareConfig, out: Path) -> tuple[_Job, ChatFormat, int]:
    """The job writing under ``out`` (tokenizer, chat format, rules), its chat format and the
    verifier's vocabulary size."""
    tokenizer = load_prepare_tokenizer(config)
    contract = bind_verifier(config, tokenizer)
    fmt, vocab_size = contract.chat, contract.vocab_size
    rules = Rules(stop_ids=frozenset(fmt.stop_token_ids), think=fmt.think_names,
                  max_seq_len=config.max_seq_len, reasoning_format=config.reasoning_format)
    job = _Job(config, fmt, fmt.renderer(tokenizer), rules, out, max(vocab_size, len(tokenizer)))
    return job, fmt, vocab_size


def run(config: PrepareConfig, ctx: StageContext | None = None) -> PrepareManifest:
    """Run the prepare stage; return its manifest (typed). Raises ConfigError / InputError /
    StageDirError with a message naming the flag, file+line or directory.

    ``ctx``: this process (:mod:`specdraft.core.context`), else read from the environment; the
    stage runs in one process (:func:`specdraft.core.context.single_process`)."""
    clock = StageClock()
    single_process(STAGE, ctx, "cpu")
    # an incomplete RUN/prepare (no manifest: a refused or killed run) holds nothing to resume
    # from (prepare is deterministic): a plain rerun replaces it
    incomplete = not (RunLayout(config.run_dir).stage(STAGE) / MANIFEST).exists()
    out = open_stage_dir(config.run_dir, STAGE, resume=config.resume,
                         overwrite=config.overwrite or (incomplete and not config.resume))
    source, inputs = input_files(config)
    job, fmt, vocab_size = start_job(config, out)
    renderer = job.renderer
    try:
        for n, (where, record) in enumerate(iter_records(source), 1):
            job.add_record(where, record)
            if n % 256 == 0:
                job.rejects.flush()
        _refuse_empty(job, source, out)
        _refuse_mostly_rejected(job, out)
        job.writer.finish(RunLayout(config.run_dir).dataset)
    except BaseException:
        job.writer.abort()
        raise
    job.rejects.close()
    os.replace(job.rejects.path, out / "rejects.jsonl")
    figures = job.summary.figures(dict(job.rejects.counts), elapsed_s=clock.elapsed_s())
    fmt = _with_sample_kwargs(fmt, job.kwargs_seen)
    fmt.save(out)
    extra = _facts(config, renderer, fmt, vocab_size, job)
    counts = {"in": figures["samples_in"], "turns_in": figures["turns_in"],
              "out": figures["tokenized"], "rejected": figures["rejected_by_reason"]}
    return write_manifest(out, stage=STAGE, config=config, clock=clock, inputs=inputs,
                          counts=counts, extra={**extra, "summary": figures})


def _refuse_empty(job: _Job, source: Any, out: Path) -> None:
    """An empty dataset is an error, not an artifact: say why every turn was rejected. The
    rejects go to their final name first (``RUN/prepare/rejects.jsonl``, the file the message
    names); no manifest is written, so the stage stays incomplete."""
    if job.summary.figures(dict(job.rejects.counts))["tokenized"] > 0:
        return
    final = _rejects_to_final(job, out)
    hint = f"details in {final}; fix the data and rerun (the incomplete {out} is replaced)" \
        if job.rejects.total else "no input turns"
    raise InputError(f"prepare: no row was produced from {source}; rejects by reason: "
                     f"{dict(job.rejects.counts) or 'none'} ({hint})")


def _rejects_to_final(job: _Job, out: Path) -> Path:
    """Close the rejects and give them their final name, ``RUN/prepare/rejects.jsonl``."""
    job.rejects.close()
    final = out / "rejects.jsonl"
    os.replace(job.rejects.path, final)
    return final


#: Rejects that say the input is wrong (not a setting's choice such as --max-seq-len or
#: --require-reasoning): the reader's reasons, a reused id, a record without an answer.
INPUT_REASONS = frozenset({*PROMPT_REASONS, "duplicate_id", "no_answer"})


def _refuse_mostly_rejected(job: _Job, out: Path) -> None:
    """``--max-reject-fraction``: input rejects (:data:`INPUT_REASONS`) over the units of input
    (turns, and records rejected whole) past the limit stop the run with the counts; no
    manifest is written."""
    units = job.summary.turns_in + job.records_rejected
    wrong = {k: n for k, n in job.rejects.counts.items() if k in INPUT_REASONS}
    try:
        check_reject_fraction(wrong, units, job.config.max_reject_fraction,
                              what="input turns (and records rejected whole)",
                              details=f"details in {out / 'rejects.jsonl'}; fix the data and "
                                      f"rerun (the incomplete {out} is replaced), or raise "
                                      f"--max-reject-fraction")
    except InputError as err:
        _rejects_to_final(job, out)
        raise InputError(f"prepare: {err}") from None


def _with_sample_kwargs(fmt: ChatFormat, seen: Counter[str]) -> ChatFormat:
    """The format with the ``chat_template_kwargs`` most samples were generated with (eval renders
    its prompts with them, as the training data was)."""
    if not seen:
        return fmt
    most = json.loads(seen.most_common(1)[0][0])
    return fmt.model_copy(update={"kwargs": most})


def _facts(config: PrepareConfig, renderer: Renderer, fmt: ChatFormat, vocab_size: int,
           job: _Job) -> dict[str, Any]:
    """Stage-specific manifest facts (tokenizer, chat format, forced vocab ids)."""
    tok = renderer.tokenizer
    think_ids = [fmt.think.opener_id, fmt.think.closer_id] if fmt.think else []
    used_special = job.summary.seen_special(added_token_ids(tok))
    eos = [int(tok.eos_token_id)] if tok.eos_token_id is not None else []
    return {
        "tokenizer": {"path": config.tokenizer or config.verifier, "name": tok.name_or_path,
                      "class": type(tok).__name__, "size": len(tok)},
        "verifier_vocab_size": vocab_size,
        "chat_format": fmt.summary(),
        "tool_calls": {**job.tool_calls, "first_rendered_differently": job.tool_calls_first,
                       "rule": "supervised: the server's completion_token_ids (else the "
                               "template's rendering); rendered_differently counts calls "
                               "whose rendering is not those ids"},
        "chat_template_kwargs": [{"kwargs": json.loads(k), "samples": n}
                                 for k, n in sorted(job.kwargs_seen.items())],
        "encoding": {
            "completion_span": "prompt+completion tokenized once; the prompt's tokens must be "
                               "its exact prefix (and equal the server's prompt_token_ids when "
                               "recorded); completion_token_ids used verbatim",
            "label_rule": "position p is supervised iff loss_mask[p+1] == 1 "
                          "(specdraft.core.conventions.supervised_positions)"},
        "forced_token_ids": {
            "eos": eos, "stop": list(fmt.stop_token_ids), "think": think_ids,
            "template_special": sorted(set(template_special_ids(renderer)) | set(used_special)),
            "byte_fallback": byte_fallback_ids(tok)},
    }
