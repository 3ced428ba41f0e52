"""Every spelling of the aux layer ids, converted in one place, with one table of conventions.

specdraft's own convention (:data:`specdraft.core.conventions.AUX_CONVENTION`): aux id ``i`` =
HF ``hidden_states[i]`` = the input to decoder layer ``i`` (0 = the embedding output). Every
other module converts to and from it with :func:`to_convention` / :func:`from_convention` (or
the named helpers below); none writes a ``+ 1`` or ``- 1`` of its own. :data:`CONVENTIONS` holds
one row per convention, naming the engine file its rule was read from (read for facts only):

========================= ===================================== ==============================
convention                written from HF ids ``a``             read back as HF ids
========================= ===================================== ==============================
``hf``                    ``a``                                 ``a``
``vllm``                  ``a`` (top-level                      ``a``
                          ``eagle_aux_hidden_state_layer_ids``)
``sglang``                ``a - 1`` when ``a[0] == 2``, else    ``w + 1`` when ``w[0] == 1``,
                          ``a`` (``eagle_config`` ids)          else ``w`` (after PR #25454)
``sglang_legacy``         as ``sglang``                         ``w + 1`` (before PR #25454)
``extract_capture``       ``sorted(a ∪ {N})`` (what the         the ids other than ``N``
                          extraction engine records)
``dflash``                ``a - 1`` (``target_layer_ids``,      ``t + 1``
                          layer-output ids)
========================= ===================================== ==============================

Round trips: ``from(to(a)) == a`` for every row whenever ``a`` is valid
(:func:`specdraft.core.conventions.check_aux_layer_ids`), except SGLang's two documented holes:
a first id of 1 has no current SGLang spelling, and for a first id other than 2 the legacy rule
reads ``a + 1`` (the reason export writes ``a - 1`` only for a first id of 2, which both rules
read back identically). ``tests/core/test_aux_ids.py`` tests each row by hand-computed values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from specdraft.core.errors import ConfigError


def _ints(ids: Sequence[int]) -> list[int]:
    return [int(i) for i in ids]


# ------------------------------------------------------------------------ the named conversions
def hf_to_vllm_ids(ids: Sequence[int]) -> list[int]:
    """HF ids -> vLLM's top-level ``eagle_aux_hidden_state_layer_ids`` (identity: vLLM 0.32
    ``model_executor/models/interfaces.py`` ``EagleModelMixin._maybe_add_hidden_state`` records
    ``hidden_states + residual`` before layer ``j`` under id ``j``)."""
    return _ints(ids)


def vllm_capture_hf_ids(written: Sequence[int]) -> list[int]:
    """What vLLM captures for written ids, as HF ``hidden_states`` indices (identity)."""
    return _ints(written)


def hf_to_sglang_ids(ids: Sequence[int]) -> list[int]:
    """HF ids -> SGLang's ``eagle_config.eagle_aux_hidden_state_layer_ids``.

    First id 2: ``ids - 1`` (read back identically before and after SGLang PR #25454). Other
    first ids: as-is (the current rule). A first id of 1 has no SGLang spelling: it is written
    as-is and :func:`specdraft.artifacts.validate.check_aux_ids` refuses it.
    """
    ids = _ints(ids)
    return [i - 1 for i in ids] if ids and ids[0] == 2 else ids


def sglang_capture_hf_ids(written: Sequence[int]) -> list[int]:
    """What SGLang captures for written ids, as HF ``hidden_states`` indices.

    The current rule (``python/sglang/srt/models/llama.py`` ``set_eagle3_layers_to_capture``
    after SGLang PR #25454): +1 when the first id is 1, else as-is. Capture happens before
    layer ``c``, i.e. HF ``hidden_states[c]``.
    """
    written = _ints(written)
    return [i + 1 for i in written] if written and written[0] == 1 else written


def sglang_legacy_capture_hf_ids(written: Sequence[int]) -> list[int]:
    """The rule before SGLang PR #25454: every explicit id shifted by +1."""
    return [i + 1 for i in _ints(written)]


def extraction_capture_ids(aux_ids: Sequence[int], n_layers: int) -> list[int]:
    """The ids the extraction engine (vLLM, ``extract/vllm_backend.py``) is asked to capture,
    ascending as vLLM orders them (``interfaces.py`` keeps ``sorted(set(ids))``): the aux ids
    and ``N``, the last layer's pre-norm output, from which the final state is computed."""
    return sorted(set(_ints(aux_ids)) | {int(n_layers)})


def aux_from_extraction_capture(capture_ids: Sequence[int], n_layers: int) -> list[int]:
    """The aux ids among the extraction engine's capture ids: all but ``N`` (an aux id is never
    ``N``: :func:`specdraft.core.conventions.check_aux_layer_ids`)."""
    return [i for i in _ints(capture_ids) if i != int(n_layers)]


def hf_to_dflash_target_ids(ids: Sequence[int]) -> list[int]:
    """HF ids -> DFlash ``target_layer_ids`` (``a - 1``): DFlash counts layer *outputs*, and HF
    ``hidden_states[a]`` is the output of layer ``a - 1`` (vLLM 0.32
    ``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`` ``get_eagle3_aux_layers_from_config``
    adds 1 to ``dflash_config.target_layer_ids``; :mod:`specdraft.models.dflash`)."""
    return [i - 1 for i in _ints(ids)]


def dflash_target_to_hf_ids(target_layer_ids: Sequence[int]) -> list[int]:
    """DFlash ``target_layer_ids`` -> the HF ``hidden_states`` indices it reads (``t + 1``)."""
    return [i + 1 for i in _ints(target_layer_ids)]


# ------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class AuxIdConvention:
    """One spelling of the aux ids: what an id means there, where the engine defines it, and the
    two conversions with specdraft's HF ids (``n_layers``: the verifier's decoder layers, used
    only by the rows that need it)."""

    name: str
    meaning: str
    source: str
    from_hf: Callable[[Sequence[int], int | None], list[int]]
    to_hf: Callable[[Sequence[int], int | None], list[int]]


def _no_n(f: Callable[[Sequence[int]], list[int]]) -> Callable[[Sequence[int], int | None],
                                                              list[int]]:
    return lambda ids, n_layers=None: f(ids)


def _need_n(f: Callable[[Sequence[int], int], list[int]]) -> Callable[[Sequence[int], int | None],
                                                                     list[int]]:
    def g(ids: Sequence[int], n_layers: int | None = None) -> list[int]:
        if n_layers is None:
            raise ConfigError("the extraction engine's capture ids need the verifier's layer "
                              "count (n_layers)")
        return f(ids, n_layers)
    return g


CONVENTIONS: dict[str, AuxIdConvention] = {c.name: c for c in (
    AuxIdConvention(
        "hf", "id i = HF hidden_states[i] = input to decoder layer i (specdraft's own)",
        "transformers modeling_llama.py LlamaModel.forward (all_hidden_states)",
        _no_n(_ints), _no_n(_ints)),
    AuxIdConvention(
        "vllm", "top-level eagle_aux_hidden_state_layer_ids; id j = input to layer j",
        "vllm/v1/spec_decode/eagle/eagle3_utils.py get_eagle3_aux_layers_from_config; "
        "vllm/model_executor/models/interfaces.py EagleModelMixin._maybe_add_hidden_state",
        _no_n(hf_to_vllm_ids), _no_n(vllm_capture_hf_ids)),
    AuxIdConvention(
        "sglang", "eagle_config.eagle_aux_hidden_state_layer_ids; +1 when the first id is 1",
        "python/sglang/srt/model_executor/model_runner.py (eagle_config ids only); "
        "python/sglang/srt/models/llama.py set_eagle3_layers_to_capture (after PR #25454)",
        _no_n(hf_to_sglang_ids), _no_n(sglang_capture_hf_ids)),
    AuxIdConvention(
        "sglang_legacy", "as sglang, every explicit id read +1 (before SGLang PR #25454)",
        "python/sglang/srt/models/llama.py set_eagle3_layers_to_capture (before PR #25454)",
        _no_n(hf_to_sglang_ids), _no_n(sglang_legacy_capture_hf_ids)),
    AuxIdConvention(
        "extract_capture", "ids the extraction engine records: aux ids and N (pre-norm final)",
        "vllm/model_executor/models/llama.py LlamaModel.forward (records id idx + 1 after "
        "layer idx); specdraft/extract/vllm_backend.py",
        _need_n(extraction_capture_ids), _need_n(aux_from_extraction_capture)),
    AuxIdConvention(
        "dflash", "DFlash target_layer_ids: id t = output of decoder layer t",
        "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py "
        "get_eagle3_aux_layers_from_config (adds 1); vllm/model_executor/models/qwen3_dflash.py",
        _no_n(hf_to_dflash_target_ids), _no_n(dflash_target_to_hf_ids)),
)}


def _row(convention: str) -> AuxIdConvention:
    if convention not in CONVENTIONS:
        raise ConfigError(f"aux-id convention {convention!r}: expected one of "
                          f"{sorted(CONVENTIONS)}")
    return CONVENTIONS[convention]


def to_convention(convention: str, hf_ids: Sequence[int], *,
                  n_layers: int | None = None) -> list[int]:
    """specdraft's HF ids spelled in ``convention`` (a key of :data:`CONVENTIONS`). Raises
    :class:`ConfigError` for an unknown convention, or a missing ``n_layers`` where needed."""
    return _row(convention).from_hf(hf_ids, n_layers)


def from_convention(convention: str, ids: Sequence[int], *,
                    n_layers: int | None = None) -> list[int]:
    """``ids`` spelled in ``convention`` read back as specdraft's HF ids (the engine's reading).
    Raises like :func:`to_convention`."""
    return _row(convention).to_hf(ids, n_layers)
