"""Drafter kinds: the registry every stage dispatches through (docs/architecture.md "Kinds").

A kind is one drafter algorithm (``eagle3``, ``dflash``, ...). Its name is declared, never
guessed: every specdraft drafter config carries it (``"kind"`` in ``drafter_config.json``,
written from the config class's ``kind``); an engine-native ``config.json`` that has no room for
it, and a ``drafter_config.json`` written before the field existed, are recognised by
:func:`detect_kind` alone, from the declared facts of each row (:attr:`Kind.architectures`,
:attr:`Kind.speculators_types`, :attr:`Kind.legacy_keys`).

One row per kind (:class:`Kind`) is every table the stages read, one column each:

====================  ======================================================================
column                read by
====================  ======================================================================
``home``              the kind's module (:class:`KindHome`): config/model classes, the train
                      builder, read-back of its formats, export, doctor, run defaults
``objective``         ``train``: ``"module:attr"`` of ``(drafter, train config) -> Objective``
``decoder``           ``eval``: ``"module:attr"`` of the offline decoder ``(eval config,
                      verifier, drafter, prompt ids, stop ids) -> [Generation]``
``options``           ``train``: the :class:`~specdraft.train.config.TrainConfig` fields only
                      this kind reads (one set to a non-default value for another kind is
                      refused)
``formats``           ``export``: the engine formats it is written in (the first: the default
                      of ``specdraft run``)
``engine_method``     ``eval``: vLLM's ``speculative_config.method``
``architectures``     :func:`detect_kind`: engine ``architectures`` that are this kind
====================  ======================================================================

``objective`` and ``decoder`` are named by string because they live in the stages (``train``,
``eval``) that import this package, never the other way; the stage resolves them
(:func:`resolve`). A kind registered from outside (``tests/kinds/toy_kind.py``) may give
callables instead. This module imports nothing heavy (the CLI reads it without torch); the
homes are imported when a stage first asks for them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Protocol

from specdraft.core.errors import ConfigError, InputError

#: The kind a drafter config written before kinds were declared is, unless its keys are another
#: kind's :attr:`Kind.legacy_keys` (every such drafter was EAGLE-3 or DFlash).
LEGACY_DEFAULT = "eagle3"


@dataclass(frozen=True)
class Kind:
    """One drafter kind: its row in every table (module doc)."""

    name: str
    home: str | ModuleType
    objective: str | Callable[..., Any]
    decoder: str | Callable[..., Any]
    options: frozenset[str] = frozenset()
    formats: tuple[str, ...] = ()
    engine_method: str | None = None
    architectures: frozenset[str] = frozenset()
    speculators_types: frozenset[str] = frozenset()
    legacy_keys: frozenset[str] = frozenset()
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def hooks(self) -> "KindHome":
        """The kind's home module (imported on first use)."""
        if "home" not in self._cache:
            self._cache["home"] = (importlib.import_module(self.home)
                                   if isinstance(self.home, str) else self.home)
        return self._cache["home"]


class KindHome(Protocol):
    """What a kind's home module defines (every registered kind has each; tested). ``options``
    below is the train config (read through the kind's own :attr:`Kind.options` and the shared
    fields: ``seed``, ``lm_head_init``...)."""

    #: the config class(es) written by this kind, by ``from_dict``
    def config_from_dict(self, raw: dict[str, Any]) -> Any: ...

    def check_keys(self, path: Any, raw: dict[str, Any]) -> None: ...

    def model(self, config: Any) -> Any: ...

    def build(self, options: Any, profile: Any, source: Any, head: dict[str, Any],
              d2t: Any, t2d: Any, identity: dict[str, Any] | None) -> Any: ...

    def read_export(self, path: Any, raw: dict[str, Any]) -> tuple[Any, dict[str, Any], str]: ...

    def shared_tables(self) -> tuple[str, ...]: ...

    def export_candidate(self, request: Any, src: Any, facts: dict[str, Any]) -> Any: ...

    def engine_format(self, config: Any) -> str: ...

    def doctor(self, drafter: Any) -> str | tuple[str, ...] | None: ...

    def engine_hints(self) -> list[str]: ...

    def run_defaults(self, sections: dict[str, dict[str, Any]], path: Any) -> None: ...


#: The hook names of :class:`KindHome`, each checked on every registered kind.
HOOKS = ("config_from_dict", "check_keys", "model", "build", "read_export", "shared_tables",
         "export_candidate", "engine_format", "doctor", "engine_hints", "run_defaults")


class Objective(Protocol):
    """The training objective of a kind, as :class:`specdraft.train.loop.Trainer` runs it: an
    ``nn.Module`` wrapping ``drafter`` whose ``forward(batch, norm)`` returns a
    :class:`specdraft.train.objective.StepOutput` (loss and per-step hits), ``steps`` loss
    positions with ``weights``, ``loss_counts(batch)`` the supervised count per step ``[S]``,
    and a settable ``step`` (the optimizer step, for draws seeded by it)."""

    drafter: Any
    steps: int
    weights: list[float]
    step: int

    def loss_counts(self, batch: Any) -> Any: ...

    def __call__(self, batch: Any, norm: Any) -> Any: ...


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    """Add ``kind`` to the registry (a name registered twice is refused: one home per kind)."""
    if kind.name in KINDS and KINDS[kind.name] != kind:
        raise ValueError(f"drafter kind {kind.name!r} is already registered")
    KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Remove a kind registered from outside (tests)."""
    KINDS.pop(name, None)


def get(name: str) -> Kind:
    """The registered kind ``name``; :class:`ConfigError` listing the known ones otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(f"drafter kind {name!r} is not registered (known: "
                          f"{', '.join(sorted(KINDS))})") from None


def of(obj: Any) -> Kind:
    """The kind of a drafter model, a drafter config or a
    :class:`~specdraft.artifacts.drafter.DrafterOnDisk`: its config class's declared ``kind``."""
    config = getattr(obj, "config", obj)
    name = getattr(config, "kind", None)
    if not isinstance(name, str):
        raise TypeError(f"{type(config).__name__} declares no drafter kind")
    return get(name)


def detect_kind(raw: dict[str, Any], *, where: Any = "drafter config") -> str:
    """The kind of a drafter config dict: its ``"kind"`` field when it has one; else an engine
    ``config.json`` by its ``architectures`` / ``speculators_model_type``; else a
    ``drafter_config.json`` written before the field (a kind's :attr:`Kind.legacy_keys` all
    present, else :data:`LEGACY_DEFAULT`). The one place a kind is inferred from keys.

    Raises :class:`InputError` naming ``where`` for an unknown declared kind."""
    if "kind" in raw:
        name = raw["kind"]
        if not isinstance(name, str) or name not in KINDS:
            raise InputError(f"{where}: kind {name!r} is not a registered drafter kind "
                             f"({', '.join(sorted(KINDS))})")
        return name
    archs = raw.get("architectures")
    arch_set = set(archs) if isinstance(archs, list) and \
        all(isinstance(a, str) for a in archs) else set()
    for kind in KINDS.values():
        if arch_set & kind.architectures or \
                raw.get("speculators_model_type") in kind.speculators_types:
            return kind.name
    for kind in KINDS.values():
        if kind.legacy_keys and kind.legacy_keys <= set(raw):
            return kind.name
    return LEGACY_DEFAULT


def resolve(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """A ``"module:attr"`` reference (a stage's objective or decoder), or a callable as is."""
    if callable(ref):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def other_kinds_options(name: str) -> frozenset[str]:
    """The train options some other kind reads and ``name`` does not."""
    own = get(name).options
    return frozenset().union(*(k.options for k in KINDS.values() if k.name != name)) - own


#: ``TrainConfig`` fields only the EAGLE-3 kind reads (EAGLE-3.1's norms and the draft layer
#: are options of this kind).
EAGLE3_OPTIONS = frozenset({"ttt_steps", "step_weight", "loss", "align_topk", "oov_policy",
                            "lm_head_init", "attn_impl", "norm_before_residual",
                            "norm_before_fc", "fc_norm", "norm_output", "drafter_layer"})
#: ``TrainConfig`` fields only the DFlash kind reads.
DFLASH_OPTIONS = frozenset({"dflash_block_size", "dflash_layers", "dflash_anchors",
                            "dflash_gamma", "dflash_mask_token_id", "dflash_anchor_draw",
                            "dflash_weights", "dflash_dpace_alpha", "dflash_labels",
                            "dflash_init_std", "dflash_target_layers"})
#: DFlash's default block size (``--dflash-block-size``; ``specdraft run`` evaluates it with
#: ``k`` = block size - 1).
DFLASH_BLOCK_SIZE = 8

register(Kind(
    "eagle3", "specdraft.kinds.eagle3", objective="specdraft.train.objective:ttt_objective",
    decoder="specdraft.eval.run:decode_eagle3", options=EAGLE3_OPTIONS,
    formats=("sglang", "vllm", "speculators"), engine_method="eagle3",
    architectures=frozenset({"LlamaForCausalLMEagle3", "Eagle3Qwen3ForCausalLM",
                             "Eagle3DeepseekV2ForCausalLM", "Eagle3Speculator"}),
    speculators_types=frozenset({"eagle3"})))
register(Kind(
    "dflash", "specdraft.kinds.dflash",
    objective="specdraft.train.dflash_objective:dflash_objective",
    decoder="specdraft.eval.dflash:decode_offline", options=DFLASH_OPTIONS, formats=("vllm",),
    engine_method="dflash", architectures=frozenset({"DFlashDraftModel"}),
    legacy_keys=frozenset({"mask_token_id", "target_layer_ids"})))
