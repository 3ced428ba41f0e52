"""The pipeline's stage table: one explicit row per stage, in order (no import-time magic).

Each row names the stage's config class and entry function (imported only when the stage
runs), the stages whose outputs it reads, and whether it runs the verifier in-process (so that
``specdraft run`` loads the verifier once and hands it to every stage that needs it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specdraft.core.assets import resolve_path


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage.

    ``config_cls`` and ``entry`` are ``"module:attribute"`` strings; ``upstream`` lists the
    stages whose manifests are this stage's inputs; ``uses_verifier(config)`` says whether the
    stage runs the verifier in-process with that config; ``verifier_arg`` is what its entry's
    ``verifier=`` takes: ``"model"`` (the HF model) or ``"pair"`` (``(model, tokenizer)``);
    ``input_files(config)`` names the user files it reads, keyed as in its manifest's ``inputs``
    (their content hashes decide, with the config hash, whether it is complete);
    ``outdated(config, manifest)`` gives the reason a complete stage must still rerun because of
    what this machine now has (e.g. eval's ``engine: auto`` once vLLM is installed), else None;
    ``not_needed(stages)`` (every stage's config by name) gives the reason the run has no use
    for this stage's artifacts (extract when train is ``online``: the states come from the
    verifier or the servers at each step, nothing on disk), else None; ``entry_kwargs(config)``
    are the further keyword arguments its entry takes with that config (train's live source
    with ``--endpoint``, built where the CLI builds it).
    """

    name: str
    config_cls: str
    entry: str
    upstream: tuple[str, ...]
    uses_verifier: Callable[[Any], bool]
    verifier_arg: str = "model"
    input_files: Callable[[Any], dict[str, Path]] = lambda c: {}
    outdated: Callable[[Any, dict[str, Any]], str | None] = lambda c, m: None
    not_needed: Callable[[dict[str, Any]], str | None] = lambda stages: None
    entry_kwargs: Callable[[Any], dict[str, Any]] = lambda c: {}

    def load_config_cls(self) -> type:
        return _resolve(self.config_cls)

    def load_entry(self) -> Callable[..., dict[str, Any]]:
        return _resolve(self.entry)


def _resolve(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


STAGES: tuple[StageSpec, ...] = (
    StageSpec("generate", "specdraft.generate.config:GenerateConfig",
              "specdraft.generate.run:run", (), lambda c: c.backend == "local", "pair",
              lambda c: {"prompts": resolve_path(c.prompts)}),
    StageSpec("prepare", "specdraft.prepare.config:PrepareConfig",
              "specdraft.prepare.run:run", ("generate",), lambda c: False,
              input_files=lambda c: {"data": Path(c.data)} if c.data else {}),
    StageSpec("vocab", "specdraft.vocab.config:VocabConfig",
              "specdraft.vocab.run:run", ("prepare",), lambda c: False),
    StageSpec("extract", "specdraft.extract.config:ExtractConfig",
              "specdraft.extract.run:run", ("prepare",),
              # the engine, or the running servers (--endpoint), hold the verifier
              lambda c: c.backend != "vllm" and not c.endpoint,
              not_needed=lambda s: _train_online(s.get("train"))),
    StageSpec("train", "specdraft.train.config:TrainConfig",
              "specdraft.train.run:run", ("extract", "vocab"),
              # online: the verifier in this process, unless servers capture (--endpoint);
              # the teacher check's fresh forward always runs it here
              lambda c: (bool(c.online) and not c.endpoint) or c.teacher_check,
              entry_kwargs=lambda c: _live_source(c.endpoint)),
    StageSpec("export", "specdraft.export.config:ExportConfig",
              "specdraft.export.run:run", ("train",), lambda c: False),
    StageSpec("eval", "specdraft.eval.config:EvalConfig",
              "specdraft.eval.run:run", ("export",), lambda c: c.server is None,
              input_files=lambda c: {"prompts": resolve_path(c.prompts)},
              outdated=lambda c, m: _engine_now_available(c, m)),
)


def _live_source(endpoint: Any) -> dict[str, Any]:
    """``train --online --endpoint``'s row source (as :mod:`specdraft.cli.train` passes it)."""
    if not endpoint:
        return {}
    from specdraft.extract.live_source import open_live_source

    return {"source": open_live_source}


def _train_online(train: Any) -> str | None:
    if train is None or not train.online:
        return None
    where = "the servers" if train.endpoint else "the verifier in the trainer's process"
    return f"train is online: its hidden states come from {where} at each step, none on disk"


def _engine_now_available(config: Any, manifest: dict[str, Any]) -> str | None:
    """Eval with ``engine: auto`` ran offline only, and a python with vLLM exists now."""
    if config.engine != "auto" or manifest.get("engine") is not None:
        return None
    from specdraft.core.errors import ConfigError
    from specdraft.engines.python import vllm_python

    try:
        vllm_python(config.engine_python)
    except ConfigError:
        return None
    return "engine auto: vLLM is installed now and the last eval ran offline only"

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
