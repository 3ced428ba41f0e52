"""The run's verifier contract, ``RUN/verifier.json``: which verifier and tokenizer a run is bound
to and how it renders chats, written once by the first stage that touches the verifier or its
tokenizer and checked by every later one.

Without it each stage resolved these from its own flags, so a run could generate with one chat
template, prepare with another and extract from a third model, each stage content with itself.
The contract holds (docs/verifier-binding.md):

- ``loading``: the verifier path as given, a separate tokenizer, ``trust_remote_code``. The
  dtype and device are not bound: an fp32 extract and a bf16 eval of the same model are one
  verifier (the hidden-state probe of eval/doctor checks what the dtype does to the states);
- ``identity``: :func:`specdraft.core.verifier_identity.identify` (config, storage, weight sample,
  tokenizer and template hashes); ``tokenizer_sha256``; ``vocab_size`` (LM head rows) and
  ``tokenizer_size``;
- ``profile``: :func:`specdraft.core.profile.resolve_profile` of its config (or the reason it
  cannot be resolved: stages that need it refuse with that reason);
- ``chat``: the :class:`~specdraft.core.chat.ChatFormat` (template, kwargs, stop ids, think
  markers), set by the first stage that renders chats (local generate or prepare).

Rules (:func:`bind`): a field is written once and changed only by a rerun of the stage that
wrote the contract (it starts the run over: the stages after it rerun too); a field still empty
(no chat yet, no identity because the first stage had only a tokenizer) is filled by the first
stage that knows it. A later stage given another model, tokenizer or vocabulary is refused with
every
difference named; a stage whose chat settings were left at their defaults renders with the
contract's chat format, and one given other settings explicitly is refused.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from specdraft.core.chat import ChatFormat
from specdraft.core.errors import ConfigError
from specdraft.core.jsonl import read_model

CONTRACT_FILE = "verifier.json"


class Loading(BaseModel):
    """How the verifier is located and trusted (not its dtype or device: module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    verifier: str
    tokenizer: str | None = None
    trust_remote_code: bool = False


class VerifierContract(BaseModel):
    """The contents of ``RUN/verifier.json`` (module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: Literal[1] = 1
    written_by: str
    loading: Loading
    identity: dict[str, Any] | None = None
    tokenizer_sha256: str
    vocab_size: int
    tokenizer_size: int
    profile: dict[str, Any] | None = None
    profile_error: str | None = None
    chat: ChatFormat | None = None
    filled_by: dict[str, str] = {}


def contract_path(run_dir: str | os.PathLike) -> Path:
    from specdraft.artifacts.layout import RunLayout

    return RunLayout(run_dir).verifier_contract


def load(run_dir: str | os.PathLike | None) -> VerifierContract | None:
    """The contract of ``run_dir``, or None when the run has none yet (or no run dir).

    Raises :class:`InputError` naming the file when it exists but cannot be read."""
    if run_dir is None or not contract_path(run_dir).exists():
        return None
    return read_model(contract_path(run_dir), VerifierContract, what="verifier contract")


def describe(stage: str, *, verifier: str, tokenizer: Any, tokenizer_path: str | None = None,
             trust_remote_code: bool = False, chat: ChatFormat | None = None
             ) -> VerifierContract:
    """What ``stage`` knows of its verifier, as a contract (nothing written).

    ``tokenizer``: the loaded tokenizer the stage uses. The identity is None when the verifier's
    files cannot be read here (``prepare --tokenizer DIR`` with a verifier path that exists only
    on the serving machine); the profile records its error instead of raising, so a stage that
    does not need it (prepare) still runs on a family specdraft cannot train for yet."""
    from specdraft.core.profile import load_hf_config, resolve_profile, text_config
    from specdraft.core.verifier_identity import identify, tokenizer_hashes

    identity = profile = error = rows = None
    try:
        identity = identify(verifier, tokenizer=None if tokenizer_path else tokenizer,
                            trust_remote_code=trust_remote_code)
    except (ConfigError, OSError, ValueError):
        pass
    try:  # the config is read once: the LM head's rows, then the profile
        hf = load_hf_config(verifier, trust_remote_code=trust_remote_code)
        rows = getattr(text_config(hf), "vocab_size", None)
        profile = resolve_profile(hf).to_dict()
    except (ConfigError, OSError, ValueError) as err:
        error = f"{type(err).__name__}: {err}"
    return VerifierContract(
        written_by=stage, identity=identity,
        loading=Loading(verifier=str(verifier), tokenizer=tokenizer_path,
                        trust_remote_code=trust_remote_code),
        tokenizer_sha256=tokenizer_hashes(tokenizer)["tokenizer_sha256"],
        vocab_size=int(rows) if rows else len(tokenizer), tokenizer_size=len(tokenizer),
        profile=profile, profile_error=None if profile else error, chat=chat)


def bind_model_stage(run_dir: str | os.PathLike, stage: str, verifier: str, *,
                     trust_remote_code: bool = False, in_memory: bool = False) -> None:
    """Check the verifier a model-loading stage (extract, online train) was given against the
    run's contract (:func:`bind`) before it loads the model: another model, tokenizer or
    vocabulary than the one the run generated and prepared with raises :class:`ConfigError`
    naming each difference. Skipped (said on stderr) only for a model handed over in memory
    (``in_memory``) whose ``verifier`` names no loadable tokenizer."""
    from specdraft.core.verifier import load_tokenizer

    try:
        tok = load_tokenizer(verifier, trust_remote_code=trust_remote_code)
    except (ConfigError, OSError) as err:
        if not in_memory:
            raise
        print(f"{stage}: verifier not bound to the run ({err})", file=sys.stderr)
        return
    bind(run_dir, describe(stage, verifier=verifier, tokenizer=tok,
                           trust_remote_code=trust_remote_code))


def bind(run_dir: str | os.PathLike | None, given: VerifierContract, *,
         chat_explicit: bool = False) -> VerifierContract:
    """Bind ``given`` (:func:`describe` of this stage) to the run and return the contract the
    stage must use.

    No contract yet, or one written by this same stage (a rerun: it may change its own
    settings): ``given`` is written atomically and returned. Another stage's contract: every binding
    difference is collected and :class:`ConfigError` raised naming ``RUN/verifier.json``, the
    stage that wrote it and each difference; else its empty fields are filled from ``given``
    (and written) and it is returned. Its ``chat`` wins over ``given.chat`` unless
    ``chat_explicit`` (the stage was given chat settings), when a different rendering is
    refused. ``run_dir`` None: ``given`` is returned (a stage run outside a run directory)."""
    from specdraft.core.atomic import atomic_write_json

    if run_dir is None:
        return given
    path, held = contract_path(run_dir), load(run_dir)
    if held is None or held.written_by == given.written_by:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, given.model_dump(mode="json"))
        return given
    problems = _differences(held, given, chat_explicit)
    if problems:
        raise ConfigError(
            f"{path} (written by {held.written_by}) binds this run to --verifier "
            f"{held.loading.verifier}; {given.written_by} was given: " + "; ".join(problems)
            + ". Give this stage the run's verifier and leave its chat settings unset (the "
              "run's are used), or start a new --run-dir")
    filled = _filled(held, given)
    if filled is not held:
        atomic_write_json(path, filled.model_dump(mode="json"))
    return filled


def _differences(held: VerifierContract, given: VerifierContract, chat_explicit: bool
                 ) -> list[str]:
    """Human-readable binding differences of ``given`` from ``held`` (empty: compatible)."""
    from specdraft.core.verifier_identity import compare

    problems = []
    if held.identity and given.identity:
        c = compare(held.identity, given.identity)
        if c.kind == "other":
            problems.append(f"another model ({'; '.join(c.differences)})")
        elif c.kind == "variant":
            print(f"verifier: {given.loading.verifier} is a quantized variant of the run's "
                  f"{held.loading.verifier} ({c.given}; the run's: {c.recorded})",
                  file=sys.stderr)
    if held.tokenizer_sha256 != given.tokenizer_sha256:
        problems.append("another tokenizer (vocabulary, added/special tokens or how the probe "
                        "text encodes)")
    if held.vocab_size != given.vocab_size:
        problems.append(f"vocab_size {given.vocab_size} (the run's: {held.vocab_size})")
    if chat_explicit and held.chat and given.chat:
        differs = held.chat.rendering_differs(given.chat)
        if differs:
            shown = ", ".join(f"{k} {_short(getattr(given.chat, k))} (the run's: "
                              f"{_short(getattr(held.chat, k))})" for k in differs)
            problems.append(f"chat settings that render chats differently: {shown}")
    return problems


def _short(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _filled(held: VerifierContract, given: VerifierContract) -> VerifierContract:
    """``held`` with its empty fields (identity, profile, chat) taken from ``given``; ``held``
    itself when nothing was filled."""
    update: dict[str, Any] = {}
    if held.identity is None and given.identity is not None:
        update["identity"] = given.identity
    if held.profile is None and given.profile is not None:
        update.update(profile=given.profile, profile_error=None)
    if held.chat is None and given.chat is not None:
        update["chat"] = given.chat
    if not update:
        return held
    filled_by = {**held.filled_by, **{k: given.written_by for k in update
                                      if k != "profile_error"}}
    return held.model_copy(update={**update, "filled_by": filled_by})


# ------------------------------------------------------------ the one reader of the run's record
@dataclass(frozen=True)
class RunVerifier:
    """The verifier facts a run is bound to, as every later stage reads them (train, export,
    eval, doctor): ``profile`` (:class:`~specdraft.core.profile.VerifierProfile`), ``chat``
    (:class:`~specdraft.core.chat.ChatFormat`), ``identity``
    (:func:`specdraft.core.verifier_identity.identify`'s record); each None when the run has not
    recorded it. ``source`` names where they were read, for messages: ``RUN/verifier.json``, or
    the fallback of a run without one (:func:`run_verifier`)."""

    profile: Any
    chat: ChatFormat | None
    identity: dict[str, Any] | None
    source: str

    @property
    def profile_source(self) -> str:
        """Where :attr:`profile` came from, for a message (``RUN/verifier.json profile``)."""
        return f"{self.source} profile"


def run_verifier(run_dir: str | os.PathLike | None) -> RunVerifier:
    """Read the run's verifier record once: ``RUN/verifier.json`` (:func:`load`) when the run
    has one. Fallback, only for a run without ``verifier.json`` (made before the contract
    existed, or assembled by hand from stage directories): the profile and identity of
    ``RUN/extract/manifest.json``, the chat format of ``RUN/prepare/chat_format.json``, else
    ``RUN/generate/chat_format.json`` (:func:`specdraft.core.chat.run_chat_format`). No run
    directory: every field None. Raises :class:`InputError` naming a file that exists but cannot
    be read, :class:`ConfigError` for a stored profile specdraft cannot parse."""
    from specdraft.core.chat import run_chat_format
    from specdraft.core.manifest import ExtractManifest, load_stage_manifest
    from specdraft.core.profile import VerifierProfile

    if run_dir is None:
        return RunVerifier(None, None, None, "no run directory")
    held = load(run_dir)
    if held is not None:
        profile = None if held.profile is None else VerifierProfile.from_dict(
            held.profile, source=f"{contract_path(run_dir)} profile")
        return RunVerifier(profile, held.chat, held.identity, "RUN/verifier.json")
    from specdraft.artifacts.layout import RunLayout

    extract = load_stage_manifest(RunLayout(run_dir).extract)
    if not isinstance(extract, ExtractManifest):
        extract = None
    return RunVerifier(extract.profile if extract else None, run_chat_format(run_dir),
                       extract.verifier_identity if extract else None,
                       "RUN/extract/manifest.json")
