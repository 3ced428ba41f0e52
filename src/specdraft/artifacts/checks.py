"""The doctor's checks: each returns a pass/fail :class:`Check` with a concrete fix.

They target the silent failures of deployed drafters (server healthy, acceptance 1–15%): a
shape or vocabulary that belongs to another verifier, aux ids an engine reads differently, a
missing or broken ``d2t``, an embedding that is not the verifier's, a computation field
left to a loader default, a short ``max_position_embeddings``, a chat template changed since
``prepare``, think markers split into several tokens, a stored teacher that is not the
verifier's own distribution (or all-zero / out-of-band hidden states).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from specdraft.core.chat import DEFAULT_THINK, ChatFormat
from specdraft.core.conventions import vocab_map_problems
from specdraft.core.manifest import ExtractManifest, PrepareManifest
from specdraft.core.aux_ids import sglang_capture_hf_ids, vllm_capture_hf_ids
from specdraft.artifacts.contract import check_contract
from specdraft.artifacts.drafter import DrafterOnDisk
from specdraft.artifacts.formats import FORMAT_SPECS
from specdraft.artifacts.rules import aux_id_problems, tensor_problems
from specdraft.models.eagle3 import COMPUTATION_FIELDS
from specdraft.artifacts.layout import RunLayout


@dataclass
class Check:
    """Outcome of one check; ``fix`` says what to do when it fails. ``ran`` False: the check
    could not run (nothing to compare against): status ``not run``, never ``pass``; it does
    not fail the doctor (``ok`` stays True) but is printed ``[NOT RUN]`` with its reason."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    ran: bool = True

    def to_dict(self) -> dict[str, Any]:
        status = "not run" if not self.ran else "pass" if self.ok else "fail"
        return {"name": self.name, "ok": self.ok, "status": status, "detail": self.detail,
                "fix": self.fix}


@dataclass
class Subject:
    """What the doctor inspects: the drafter, the verifier (model + tokenizer) and, for a run
    directory, the upstream manifests and the run's record (``chat_format``, ``run_identity``:
    :func:`specdraft.artifacts.verifier_contract.run_verifier`)."""

    drafter: DrafterOnDisk
    verifier: Any
    tokenizer: Any
    run_dir: Path | None = None
    extract: ExtractManifest | None = None
    prepare: PrepareManifest | None = None
    chat_format: ChatFormat | None = None
    verifier_path: str | None = None
    run_identity: dict[str, Any] | None = None
    skip: tuple[str, ...] = ()  # the checks the drafter's kind does not take (its doctor hook)

    @property
    def vcfg(self) -> Any:
        c = self.verifier.config
        return getattr(c, "text_config", None) or c


def check_shapes(s: Subject) -> Check:
    """Drafter hidden / target hidden / vocab equal the verifier's; fc input = n_aux x H."""
    c, v = s.drafter.config, s.vcfg
    problems = []
    if c.target_hidden_size != v.hidden_size:
        problems.append(f"target_hidden_size {c.target_hidden_size} != verifier {v.hidden_size}")
    if c.hidden_size != v.hidden_size:
        problems.append(f"hidden_size {c.hidden_size} != verifier {v.hidden_size} (the draft "
                        f"layer reads the verifier's embedding)")
    if c.vocab_size != v.vocab_size:
        problems.append(f"vocab_size {c.vocab_size} != verifier {v.vocab_size}")
    fc, n_aux = s.drafter.state.get("fc.weight"), len(c.aux_layer_ids)
    if fc is not None and fc.shape[1] != n_aux * c.target_hidden_size:
        problems.append(f"fc.weight input {fc.shape[1]} != {n_aux} aux x "
                        f"{c.target_hidden_size}")
    return Check("hidden size and vocab match", not problems,
                 "; ".join(problems) or f"hidden {c.hidden_size}, vocab {c.vocab_size}, fc "
                 f"input {n_aux} x {c.target_hidden_size}",
                 "train the drafter on this verifier, or point --verifier at the model it was "
                 "trained for; then re-run `specdraft export`")


def check_tensors(s: Subject) -> Check:
    """The tensors are the ones the drafter's config describes, name and shape
    (:func:`specdraft.artifacts.rules.tensor_problems`, the rule eval and export apply: e.g.
    ``norm_before_fc`` and ``input_norm.weight`` together); the verifier tables the kind shares
    may be absent."""
    from specdraft import kinds

    shared = kinds.of(s.drafter).hooks().shared_tables()
    vocab = ("d2t", "t2d")  # named by check_vocab
    problems = tensor_problems(s.drafter.config, s.drafter.state, shared=(*shared, *vocab))
    return Check("tensors are the ones the config describes", not problems,
                 "; ".join(problems) or f"{len(s.drafter.state)} tensors, names and shapes as "
                 f"the config says",
                 "re-export from the trained drafter (specdraft export writes the config and "
                 "the tensors together)")


def _engine_readings(d: DrafterOnDisk) -> dict[str, list[int] | None]:
    """HF hidden_states each engine would capture for this drafter on disk (a format outside
    the EAGLE-3 table, DFlash's, is read back by its kind as its engine reads it)."""
    if d.raw_config is None:  # specdraft's own directory: our convention
        return {"specdraft": list(d.config.aux_layer_ids)}
    if d.format not in FORMAT_SPECS:
        return {d.format: list(d.config.aux_layer_ids)}
    raw = d.raw_config
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    out = {"vllm": vllm_capture_hf_ids(top) if top else None}
    if d.format != "speculators" and "sglang" in d.config.served_by:  # MLA: vLLM only
        inner = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        out["sglang"] = sglang_capture_hf_ids(inner) if inner else None
    return out


def check_aux_ids(s: Subject) -> Check:
    """Each engine's reading of the ids (converted to HF hidden_states) = the training ids."""
    want = [int(i) for i in (s.extract.aux_layer_ids if s.extract else None)
            or s.drafter.config.aux_layer_ids]
    n = s.vcfg.num_hidden_layers
    problems = []
    if s.extract is not None and not s.extract.aux_layer_ids:
        problems.append("RUN/extract/manifest.json has no aux_layer_ids: the drafter's ids "
                        "cannot be checked against the extracted features (re-run extract)")
    for engine, ids in _engine_readings(s.drafter).items():
        if ids is None:
            problems.append(f"{engine}: no aux ids where it reads them")
        elif ids != want:
            problems.append(f"{engine} would capture hidden_states {ids}, trained on {want}")
    problems += aux_id_problems(want, n, source="aux ids")  # the rule eval and export apply
    if s.drafter.format in ("sglang", "vllm") and len(want) != 3:
        problems.append(f"{len(want)} aux layers: vLLM/SGLang build fc for 3")
    return Check("aux ids present, right convention per engine", not problems,
                 "; ".join(problems) or f"hidden_states {want} for every engine",
                 "re-run `specdraft export` (it writes vLLM's top-level ids and SGLang's "
                 "eagle_config ids, each in its engine's convention)")


def check_vocab(s: Subject) -> Check:
    """d2t / t2d present and consistent; EOS in the draft vocab; coverage of the training data."""
    c = s.drafter.config
    problems = vocab_map_problems(s.drafter.state.get("d2t"), s.drafter.state.get("t2d"),
                               c.draft_vocab_size, c.vocab_size)
    detail = f"draft vocab {c.draft_vocab_size} of {c.vocab_size}"
    t2d = s.drafter.state.get("t2d")
    eos = s.tokenizer.eos_token_id
    if t2d is not None and t2d.shape == (c.vocab_size,) and eos is not None and not bool(t2d[eos]):
        problems.append(f"EOS {eos} is not in the draft vocab: the drafter can never propose "
                        f"the end of an answer")
    cov = coverage(s, t2d) if t2d is not None and not problems else None
    if cov is not None:
        detail += f", covers {cov:.1%} of the prepared completion tokens"
        if cov < 0.9:
            problems.append(f"draft vocab covers only {cov:.1%} of the training completions")
    return Check("d2t/t2d present and sane, draft vocab coverage", not problems,
                 "; ".join(problems) or detail,
                 "re-run `specdraft vocab` (and train/export) so that d2t/t2d come from the "
                 "same data; export writes both")


def coverage(s: Subject, t2d: torch.Tensor) -> float | None:
    """Share of loss-masked tokens of ``RUN/prepare/dataset`` (first 2000 rows) in the draft
    vocab; None without a prepared dataset."""
    if s.run_dir is None or not RunLayout(s.run_dir).dataset.exists():
        return None
    from datasets import load_from_disk

    ds = load_from_disk(str(RunLayout(s.run_dir).dataset))
    inside = total = 0
    for row in ds.select(range(min(len(ds), 2000))):
        ids = torch.tensor(row["input_ids"], dtype=torch.long)
        mask = torch.tensor(row["loss_mask"], dtype=torch.bool)
        inside += int(t2d[ids[mask]].sum())
        total += int(mask.sum())
    return inside / total if total else None


def check_embed(s: Subject) -> Check:
    """``embed_tokens.weight`` absent (shared) or bit-identical to the verifier's."""
    own = s.drafter.state.get("embed_tokens.weight")
    ref = s.verifier.get_input_embeddings().weight.detach().cpu()
    if own is None:
        return Check("embed_tokens equal to the verifier's", True,
                     "absent: the engines use the verifier's embedding")
    ok = own.shape == ref.shape and torch.equal(own, ref.to(own.dtype))
    return Check("embed_tokens equal to the verifier's", ok,
                 "bit-identical copy" if ok else "differs from the verifier's embedding "
                 "(random init or another model)",
                 "export with `--embed copy` (or `--embed omit`) from a drafter trained with the "
                 "verifier's frozen embedding")


def check_computation_fields(s: Subject) -> Check:
    """Every computation field (``norm_before_residual``, the EAGLE-3.1 norms, the layer) written
    explicitly, each engine that loads this format computing the drafter's value from it, and
    none of them ignoring a field the drafter needs (:func:`specdraft.artifacts.contract.
    check_contract`): vLLM's llama_eagle3 path defaults ``norm_before_residual`` to false, its
    speculators reader to true; SGLang reads none of them."""
    raw, c = s.drafter.raw_config, s.drafter.config
    own = c.layout_problems(s.drafter.format, raw) if raw is not None else None
    if own is not None:  # a layer with its own layout (vLLM's MLA drafter reads its own)
        problems = own
    else:
        problems = [] if raw is None else check_contract(s.drafter.format, raw, c)
    values = ", ".join(f"{n}={getattr(c, n)}" for n in COMPUTATION_FIELDS)
    return Check("computation fields explicit and served", not problems,
                 values if not problems else "; ".join(problems),
                 "re-run `specdraft export` (writes every field; --format vllm for fields "
                 "SGLang ignores)")


def check_max_positions(s: Subject) -> Check:
    mine, theirs = s.drafter.config.max_position_embeddings, s.vcfg.max_position_embeddings
    return Check("max_position_embeddings >= the verifier's", mine >= theirs,
                 f"drafter {mine}, verifier {theirs}",
                 "set max_position_embeddings to the verifier's (train copies it with "
                 "Eagle3Config.from_verifier) and re-export")


def check_chat_template(s: Subject) -> Check:
    """The run's chat format (``RUN/verifier.json``'s, :func:`run_verifier`) renders with the
    template the verifier's tokenizer has now: the engine will render with the tokenizer's."""
    if s.chat_format is None:
        return Check("chat template unchanged since prepare", True,
                     "the run records no chat format: nothing to compare", ran=False)
    template = getattr(s.tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = template.get("default", "")
    now = hashlib.sha256(template.encode("utf-8")).hexdigest()
    recorded = s.chat_format.template_sha256
    return Check("chat template unchanged since prepare", now == recorded,
                 f"prepare {recorded[:12]} ({s.chat_format.template_source}), "
                 f"verifier {now[:12]}",
                 "re-run `specdraft prepare` (and the stages after it) with the verifier's "
                 "current template, or serve with the template used at prepare "
                 "(--chat-template)")


def check_think_tokens(s: Subject) -> Check:
    """Think markers (from the run's chat format, or in the chat template) are single tokens."""
    markers = list(s.chat_format.think_names or ()) if s.chat_format else []
    template = str(getattr(s.tokenizer, "chat_template", "") or "")
    markers += [m for m in DEFAULT_THINK if m in template and m not in markers]
    if not markers:
        return Check("think tokens are single tokens", True, "no think markers in use")
    split = {m: s.tokenizer.encode(m, add_special_tokens=False) for m in markers}
    bad = {m: ids for m, ids in split.items() if len(ids) != 1}
    return Check("think tokens are single tokens", not bad,
                 ", ".join(f"{m} -> {ids}" for m, ids in split.items()),
                 "add the markers as special tokens of the verifier's tokenizer (as the model "
                 "was trained), or drop them from the template; then re-run prepare")


def check_teacher(s: Subject) -> Check:
    """The stored teacher of a few ``RUN/extract`` rows equals a fresh forward of this verifier
    and the rows' hidden states are in band (:mod:`specdraft.artifacts.teacher_check`, the check
    train runs before its first step)."""
    name = "stored teacher = the verifier's own distribution, hidden states in band"
    layout = RunLayout(s.run_dir) if s.run_dir is not None else None
    if layout is None or s.extract is None or not layout.vocab.exists() \
            or not (layout.extract / "index.jsonl").exists():
        return Check(name, True, "no RUN/extract rows and RUN/vocab: nothing to compare",
                     ran=False)
    from specdraft.artifacts.hidden_states import DiskSource, load_verifier_head
    from specdraft.artifacts import teacher_check as tc
    from specdraft.artifacts.batches import Collator
    from specdraft.artifacts.vocab_map import load_vocab_map

    extract = layout.extract
    d2t, _ = load_vocab_map(s.run_dir)
    device = s.verifier.get_input_embeddings().weight.device
    collator = Collator(load_verifier_head(extract)["lm_head.weight"], d2t, device)
    report = tc.check_teacher(DiskSource(extract), collator, s.verifier,
                              storage=s.extract.storage.format)
    return Check(name, report.status == "passed", report.line(),
                 "re-run `specdraft extract` with this verifier (the final state must be the "
                 "output of its own final norm; no all-zero rows), then train again")


def check_verifier_identity(s: Subject) -> Check:
    """The verifier is the model the drafter was trained on
    (:mod:`specdraft.core.verifier_identity`): config, tokenizer, chat template and the weight
    fingerprint against the drafter's record (else the run's); a variant of it passes, named."""
    from specdraft.core.verifier_identity import compare, drafter_identity, identify_like

    name = "verifier is the model the drafter was trained on"
    recorded = drafter_identity(s.drafter.path, s.drafter.config) or s.run_identity
    if s.verifier_path is None or recorded is None:
        return Check(name, True, "no verifier identity recorded with the drafter: nothing "
                     "to compare", ran=False)
    c = compare(recorded, identify_like(recorded, s.verifier_path, tokenizer=s.tokenizer))
    return Check(name, c.kind != "other", c.line(),
                 f"point --verifier at the model the drafter was trained on "
                 f"({recorded.get('path')}), or train a drafter for this one")


def check_hidden_probe(s: Subject) -> Check:
    """A few ``RUN/extract`` rows recomputed with this verifier have the stored hidden states
    (:func:`specdraft.artifacts.hidden_states.probe_hidden_states`): catches a verifier whose
    hidden basis changed (QuaRot-style rotation) while its logits, and every check above, agree."""
    from specdraft.artifacts.hidden_states import probe_or_skip
    from specdraft.core.verifier_identity import compare, drafter_identity, identify_like

    recorded = drafter_identity(s.drafter.path, s.drafter.config) or s.run_identity
    quantized = s.verifier_path is not None and recorded is not None and compare(
        recorded, identify_like(recorded, s.verifier_path, tokenizer=s.tokenizer)).requantized
    report = probe_or_skip(s.verifier, s.run_dir, quantized=quantized)
    return Check("hidden states = the ones the drafter was trained on",
                 not report["ran"] or report["ok"], report["line"],
                 "serve the drafter with the exact verifier it was trained on (a rotated or "
                 "re-trained checkpoint needs a drafter trained on its own hidden states)",
                 ran=report["ran"])


CHECKS: list[Callable[[Subject], Check]] = [
    check_shapes, check_tensors, check_aux_ids, check_vocab, check_embed, check_computation_fields,
    check_max_positions, check_chat_template, check_think_tokens, check_teacher,
    check_verifier_identity, check_hidden_probe]


def subject(target: str | Path, verifier_path: str, *, verifier: Any | None = None,
            dtype: str = "auto") -> Subject:
    """What to check: the drafter of ``target`` (a run directory's drafter,
    :meth:`RunLayout.drafter`, or a drafter directory), the verifier (``verifier`` when loaded,
    else ``verifier_path`` loaded in ``dtype``) and, for a run, its upstream manifests."""
    from specdraft.artifacts.drafter import read_drafter
    from specdraft.artifacts.verifier_contract import run_verifier
    from specdraft.core.manifest import load_stage_manifest
    from specdraft.core.verifier import load_tokenizer, load_verifier

    from specdraft import kinds
    from specdraft.core.errors import InputError

    layout = RunLayout(target)
    run = layout.root if layout.is_run() else None
    record = run_verifier(run)
    drafter = read_drafter(layout.drafter() if run else layout.root)
    why = kinds.of(drafter).hooks().doctor(drafter)  # None: every check; a tuple: skip those
    if isinstance(why, str):
        raise InputError(why)
    return Subject(
        drafter=drafter,
        verifier=verifier if verifier is not None else load_verifier(verifier_path, dtype=dtype),
        tokenizer=load_tokenizer(verifier_path), run_dir=run,
        extract=load_stage_manifest(layout.extract) if run else None,
        prepare=load_stage_manifest(layout.prepare) if run else None,
        chat_format=record.chat, verifier_path=verifier_path, run_identity=record.identity,
        skip=tuple(why or ()))


def _not_of_kind(check: Callable[[Subject], Check], s: Subject) -> dict[str, Any]:
    """A check the drafter's kind does not take (its doctor hook names it), reported NOT RUN."""
    from specdraft import kinds

    name = check.__name__.removeprefix("check_").replace("_", " ")
    return Check(name, True, f"not a check of a {kinds.of(s.drafter).name} drafter",
                 ran=False).to_dict()


def check_drafter(target: str | Path, verifier_path: str, *, verifier: Any | None = None,
                  dtype: str = "auto") -> dict[str, Any]:
    """Run every check of :data:`CHECKS` on :func:`subject`'s drafter and verifier:
    ``{"drafter", "format", "ok", "checks": [{name, ok, detail, fix}]}``. Writes nothing; used
    by ``specdraft doctor`` and by eval to explain an engine gap."""
    s = subject(target, verifier_path, verifier=verifier, dtype=dtype)
    checks = [c(s).to_dict() if c.__name__ not in s.skip else _not_of_kind(c, s)
              for c in CHECKS]
    return {"drafter": str(s.drafter.path), "format": s.drafter.format,
            "ok": all(c["ok"] for c in checks), "checks": checks}
