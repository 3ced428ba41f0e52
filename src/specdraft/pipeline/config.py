"""Settings of ``specdraft run``: one YAML with shared keys and a section per stage.

```yaml
run_dir: runs/demo          # shared: every stage's --run-dir
verifier: smollm2           # shared: HF dir, .gguf file, or the embedded default
device: cpu                 # shared: where the verifier runs (generate/extract/train/eval)
generate: {prompts: builtin:demo_train, max_tokens: 128}
prepare: {max_seq_len: 1024}
chat: {template_kwargs: {enable_thinking: false}}   # shared: the run's one chat format
...
```

Each section takes exactly the fields of that stage's config (the stage's CLI flags with
``_``); the shared keys are filled into every section that has such a field and does not set
it. Sections are validated on load, each error naming the section and flag.

The chat format is one setting per run (:data:`CHAT_FIELDS`): given under ``chat:`` or in any
one stage section, it is filled into every stage that renders chats (generate, prepare, eval),
so local generation and prepare cannot disagree; two different values are refused, naming
both places.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from specdraft.artifacts.layout import RunLayout
from specdraft.core.config import StageConfig, load_yaml
from specdraft.core.errors import ConfigError
from specdraft.generate.config import LEGACY_THINK, fold_think_pair
from specdraft.pipeline.stages import STAGE_NAMES, STAGES

SHARED_KEYS = ("run_dir", "verifier", "device")

#: The run's chat format: ``chat:`` key -> ``{stage: field}`` of each stage that renders chats.
#: ``think_tokens`` is ``[opener, closer]``.
CHAT_FIELDS: dict[str, dict[str, str]] = {
    "template": {"generate": "chat_template", "prepare": "chat_template",
                 "eval": "chat_template"},
    "template_kwargs": {"generate": "chat_template_kwargs", "prepare": "chat_template_kwargs",
                        "eval": "chat_template_kwargs"},
    "think_tokens": {"generate": "think_tokens", "prepare": "think_tokens"},
    "stop_tokens": {"generate": "stop_tokens", "prepare": "stop_tokens"},
}


@dataclass(frozen=True)
class PipelineConfig:
    """The resolved pipeline: shared keys and one validated stage config per stage."""

    run_dir: str
    verifier: str
    device: str
    stages: dict[str, StageConfig]
    source: str

    @classmethod
    def from_yaml(cls, path: str | Path, *, run_dir: str | None = None,
                  selected: Sequence[str] | None = None) -> "PipelineConfig":
        """Load and validate ``path``; ``run_dir`` (the ``--run-dir`` flag) overrides the file's.

        ``selected`` (default: every stage) are the stages ``--from``/``--until`` will run. A
        stage is validated when it is selected or its section is in the file; an absent section
        of a stage that will not run is left out of ``stages`` (``--until export`` needs no
        ``eval`` section and its required ``prompts``).

        Raises :class:`ConfigError` naming the file, section and flag.
        """
        data = load_yaml(path)
        unknown = sorted(set(data) - set(SHARED_KEYS) - set(STAGE_NAMES) - {"chat"})
        if unknown:
            raise ConfigError(f"{path}: unknown key(s) {unknown}; expected {list(SHARED_KEYS)}, "
                              f"`chat` and stage sections {list(STAGE_NAMES)}")
        shared = {"run_dir": run_dir or data.get("run_dir"),
                  "verifier": data.get("verifier", "smollm2"), "device": data.get("device", "cpu")}
        if not shared["run_dir"]:
            raise ConfigError(f"{path}: set `run_dir:` (or pass --run-dir)")
        for spec in STAGES:
            if not isinstance(data.get(spec.name) or {}, dict):
                raise ConfigError(f"{path}: section `{spec.name}` must be a mapping, got "
                                  f"{type(data[spec.name]).__name__}")
        sections = {spec.name: dict(data.get(spec.name) or {}) for spec in STAGES}
        _one_chat_format(sections, data.get("chat"), path)
        _kind_defaults(sections, path)
        _export_format_default(sections, shared["verifier"])
        _eval_the_export(sections, shared["run_dir"])
        wanted = set(STAGE_NAMES if selected is None else selected) | {
            name for name in STAGE_NAMES if data.get(name) is not None}
        stages = {spec.name: _stage_config(spec, sections[spec.name], shared, path)
                  for spec in STAGES if spec.name in wanted}
        _engine_can_serve(stages, shared["verifier"], path)
        _export_can_carry(stages, shared["verifier"], path)
        return cls(stages=stages, source=str(path), **shared)


def _engine_can_serve(stages: dict[str, StageConfig], verifier: str, path: str | Path) -> None:
    """Refuse, before any stage runs, a run whose eval engine cannot serve the drafter train
    will build on this verifier (:data:`specdraft.engines.vllm_cpu.VLLM_REFUSALS`: e.g. a
    Llama-layer EAGLE-3 drafter on an MLA verifier in vLLM's CPU build), naming the combination
    and the alternative. Checked when the run trains and evaluates with ``engine: vllm`` (or
    ``auto`` with a vLLM python here); eval checks the drafter it is given again."""
    train, ev = stages.get("train"), stages.get("eval")
    if ev is None or ev.engine not in ("vllm", "auto"):
        return
    import torch

    from specdraft.engines.vllm_cpu import tensor_parallel_refusal

    tp = tensor_parallel_refusal(ev.engine_tensor_parallel_size,
                                 cpu=not torch.cuda.is_available())
    if tp:
        raise ConfigError(f"{path} [eval]: {tp}")
    if train is None:
        return
    from specdraft.core.errors import SpecdraftError
    from specdraft.core.profile import load_hf_config, resolve_profile
    from specdraft.engines.python import vllm_python
    from specdraft.engines.vllm_cpu import combination, vllm_refusals
    from specdraft.models.eagle3 import resolve_draft_layer

    if ev.engine == "auto":
        try:
            vllm_python(ev.engine_python)
        except ConfigError:
            return  # auto without vLLM: offline only, said by eval
    try:
        profile = resolve_profile(load_hf_config(verifier))
    except (SpecdraftError, OSError, ValueError):
        return  # an unreadable verifier is named by the first stage that loads it
    layer = resolve_draft_layer(train.drafter_layer, profile.model_type)
    refusals = vllm_refusals(combination(train.drafter, layer, profile))
    if refusals:
        auto = f" ({layer})" if layer != train.drafter_layer else ""
        raise ConfigError(f"{path}: eval.engine {ev.engine} with train.drafter {train.drafter}, "
                          f"train.drafter_layer {train.drafter_layer}{auto} and verifier "
                          f"{verifier}: " + " ".join(refusals) + " (or set eval.engine: none)")


_COMPUTATION_NORMS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def _format_problems(fmt: str, trained: dict[str, Any], verifier: str) -> list[str]:
    """:func:`specdraft.artifacts.contract.export_problems` of export format ``fmt`` for the
    EAGLE-3 drafter train will build: ``trained`` holds its norms and ``drafter_layer`` (an
    ``auto`` layer is resolved from the verifier's config; one that does not load here counts
    as ``llama``: the first stage that loads it names it)."""
    from types import SimpleNamespace

    from specdraft.artifacts.contract import export_problems
    from specdraft.core.errors import SpecdraftError
    from specdraft.core.profile import load_hf_config, resolve_profile
    from specdraft.models.eagle3 import resolve_draft_layer

    layer = trained["drafter_layer"]
    if layer == "auto":
        try:
            layer = resolve_draft_layer("auto", resolve_profile(load_hf_config(verifier))
                                        .model_type)
        except (SpecdraftError, OSError, ValueError):
            layer = "llama"
    fields = {name: bool(trained[name]) for name in _COMPUTATION_NORMS}
    return export_problems(fmt, SimpleNamespace(**fields, draft_layer=layer))


def _export_format_default(sections: dict[str, dict[str, Any]], verifier: str) -> None:
    """An EAGLE-3 run that names no ``export.format`` is exported in vLLM's format when the
    default ``sglang`` one would drop a field train sets (the EAGLE-3.1 norms, a Qwen3 or MLA
    layer: :data:`specdraft.artifacts.contract.ENGINE_READS`), as a DFlash run is
    (:mod:`specdraft.kinds`); an explicit format is checked by :func:`_export_can_carry`."""
    from specdraft import kinds
    from specdraft.train.config import TrainConfig

    train, export = sections["train"], sections["export"]
    if "format" in export or train.get("drafter", kinds.LEGACY_DEFAULT) != "eagle3":
        return
    trained = {name: train.get(name, TrainConfig.model_fields[name].default)
               for name in (*_COMPUTATION_NORMS, "drafter_layer")}
    if _format_problems("sglang", trained, verifier):
        export["format"] = "vllm"


def _export_can_carry(stages: dict[str, StageConfig], verifier: str, path: str | Path) -> None:
    """Refuse, before any stage runs, an EAGLE-3 run whose export format would drop a
    computation field train sets (:func:`_format_problems`: e.g. the EAGLE-3.1 norms in the
    ``sglang`` format, which SGLang does not read), so the mismatch is not found after
    training; export checks the trained drafter again."""
    train, export = stages.get("train"), stages.get("export")
    if train is None or export is None or train.drafter != "eagle3":
        return
    trained = {name: getattr(train, name) for name in (*_COMPUTATION_NORMS, "drafter_layer")}
    problems = _format_problems(export.format, trained, verifier)
    if problems:
        raise ConfigError(f"{path} [export]: format {export.format}: " + "; ".join(problems)
                          + " (here: export.format: vllm)")


def _one_chat_format(sections: dict[str, dict[str, Any]], chat: Any, path: str | Path) -> None:
    """Fill the run's chat format (:data:`CHAT_FIELDS`) into every stage that renders chats.

    Each value comes from ``chat:`` or from the one stage section that sets it; raises
    :class:`ConfigError` naming both places when two of them set it differently."""
    if chat is not None and not isinstance(chat, dict):
        raise ConfigError(f"{path}: section `chat` must be a mapping, got {type(chat).__name__}")
    chat = dict(chat or {})
    unknown = sorted(set(chat) - set(CHAT_FIELDS))
    if unknown:
        raise ConfigError(f"{path} [chat]: unknown key(s) {unknown}; expected {list(CHAT_FIELDS)}")
    for key, targets in CHAT_FIELDS.items():
        found = {"chat": chat[key]} if key in chat else {}
        for stage, field in targets.items():
            value = _chat_value(sections[stage], field)
            if value is not None:
                found[f"{stage}.{field}"] = value
        if len({json.dumps(v, sort_keys=True) for v in found.values()}) > 1:
            places = ", ".join(f"{where}: {json.dumps(v)}" for where, v in found.items())
            raise ConfigError(f"{path}: the chat format is one setting per run, but `{key}` "
                              f"differs ({places}); set it once under `chat:`")
        if found:
            value = next(iter(found.values()))
            for stage, field in targets.items():
                _set_chat_value(sections[stage], field, value)


def _chat_value(section: dict[str, Any], field: str) -> Any:
    """A section's value of a :data:`CHAT_FIELDS` field (think tokens as a list), or None.
    generate's ``think_open``/``think_close`` of older settings files count as its
    ``think_tokens`` (:func:`specdraft.generate.config.fold_think_pair`)."""
    if field == "think_tokens" and set(LEGACY_THINK) & set(section):
        try:
            folded = fold_think_pair(section)
        except ValueError as err:
            raise ConfigError(f"[generate]: {err}") from None
        section.clear()
        section.update(folded)
    value = section.get(field)
    if field == "think_tokens" and isinstance(value, str):
        return [t.strip() for t in value.split(",")]
    return list(value) if isinstance(value, tuple) else value


def _set_chat_value(section: dict[str, Any], field: str, value: Any) -> None:
    section[field] = value


def _kind_defaults(sections: dict[str, dict[str, Any]], path: str | Path) -> None:
    """The run defaults of the drafter kind ``train.drafter`` names (its home's
    ``run_defaults``, :mod:`specdraft.kinds`: DFlash exports ``format: vllm`` and evaluates
    ``k`` = block size - 1), applied before any stage runs; an unknown kind is left to the
    train config to refuse."""
    from specdraft import kinds

    name = sections["train"].get("drafter", kinds.LEGACY_DEFAULT)
    if name in kinds.KINDS:
        kinds.get(name).hooks().run_defaults(sections, path)


def _eval_the_export(sections: dict[str, dict[str, Any]], run_dir: str) -> None:
    """Unless told otherwise, ``eval`` measures the exported drafter: the artifact deployed."""
    export = sections["export"]
    out = export.get("out") or str(RunLayout(run_dir).export(export.get("format", "sglang")))
    if not sections["eval"].get("drafter"):
        sections["eval"]["drafter"] = out


def _stage_config(spec: Any, section: dict[str, Any], shared: dict[str, Any],
                  path: str | Path) -> StageConfig:
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: section `{spec.name}` must be a mapping")
    cls = spec.load_config_cls()
    values = dict(section)
    for key, value in shared.items():
        if key in cls.model_fields and key not in values:
            values[key] = value
    for key in ("resume", "overwrite"):
        if key in values:
            raise ConfigError(f"{path} [{spec.name}]: `{key}` is decided by `specdraft run` "
                              f"(it resumes partial stages and reruns changed ones); remove it")
    return cls.build(values, source=f"{path} [{spec.name}]")
