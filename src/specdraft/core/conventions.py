"""Cross-stage conventions that every stage must read the same way.

Aux layer ids (EAGLE-3 features). Id ``i`` = HF ``hidden_states[i]`` = the input to decoder
layer ``i`` (0 = the embedding output). ``extract``, ``train``, ``export`` and ``doctor`` all
call :func:`check_aux_layer_ids`; the default comes from :func:`default_aux_layer_ids`.

Valid ids, from the engines' capture code (vLLM 0.32 ``model_executor/models/llama.py``
``LlamaModel.forward``: it records ``hidden_states + residual`` under id ``idx + 1`` after decoder
layer ``idx``, and ``interfaces.py`` ``EagleModelMixin._set_aux_hidden_state_layers`` keeps
``sorted(set(ids))``; SGLang captures in the same layer loop):

- ``1 <= i <= N - 1``: id ``N`` is the last layer's output *before* the final norm in the
  engines but *after* it in HF ``hidden_states[N]``, so a drafter trained on it sees other
  features when served; id 0 (the embedding) carries no verifier computation and is never taken;
- strictly increasing: the engines concatenate the captured states in layer order, whatever
  order the ids were given in, and drop duplicates.
"""

from __future__ import annotations

from typing import Sequence

from specdraft.core.errors import ConfigError

#: Engines build the EAGLE-3 ``fc`` for this many aux layers (vLLM/SGLang ``llama_eagle3.py``).
ENGINE_N_AUX = 3


def aux_id_range(n_layers: int) -> tuple[int, int]:
    """``(lo, hi)``, inclusive, of the aux ids valid for an ``n_layers``-layer verifier."""
    return 1, n_layers - 1


def default_aux_layer_ids(n_layers: int) -> list[int]:
    """The aux ids used when none are given, for an ``n_layers``-layer verifier.

    Rule: ``[2, N//2, N-3]``, the default capture of vLLM
    (``SupportsEagle3.get_eagle3_default_aux_hidden_state_layers``) and SGLang, when those are
    three distinct valid ids (N >= 7). For a shallower verifier that default has duplicates, so
    three ids are spread over ``[2, N-1]``: ``[2, (N+1)//2, N-1]`` (N=5: [2, 3, 4]; N=6:
    [2, 3, 5]); id 1 is avoided because SGLang's explicit ids cannot spell it (its PR #25454 shift,
    see :func:`specdraft.export.validate.check_aux_ids`). N=4 leaves only ``[1, 2, 3]`` (exports
    as ``--format vllm`` or ``speculators``). Export writes the ids into the drafter's config
    either way, so the engines read them instead of their default.

    Raises :class:`ConfigError` naming the layer count and ``--aux-layers`` for N < 4 (fewer than
    three capturable hidden states).
    """
    if n_layers >= 7:
        return [2, n_layers // 2, n_layers - 3]
    if n_layers >= 5:
        return [2, (n_layers + 1) // 2, n_layers - 1]
    if n_layers == 4:
        return [1, 2, 3]
    lo, hi = aux_id_range(n_layers)
    raise ConfigError(
        f"the verifier has {n_layers} decoder layers: only ids {lo}..{hi} can be captured, "
        f"fewer than the {ENGINE_N_AUX} aux layers vLLM and SGLang load; pass --aux-layers with "
        f"ids in [{lo}, {hi}] (a drafter with another count exports only as --format speculators)")


def check_aux_layer_ids(ids: Sequence[int], n_layers: int, *, source: str) -> list[int]:
    """Validate aux ids against the convention above; return them as a list.

    ``source`` names where the ids came from in the message (``"--aux-layers"``,
    ``"RUN/extract/manifest.json aux_layer_ids"``, ``"drafter config.json aux_layer_ids"``).
    Raises :class:`ConfigError` for an empty list, a non-integer, an id outside
    ``[1, N-1]``, a duplicate or a decreasing order.
    """
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise ConfigError(f"{source}: expected a list of layer ids, got {type(ids).__name__}")
    if not ids:
        raise ConfigError(f"{source}: empty; give at least one layer id")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f"{source} {list(ids)}: layer ids must be integers")
    ids = [int(i) for i in ids]
    spelled = ",".join(map(str, ids))
    lo, hi = aux_id_range(n_layers)
    bad = [i for i in ids if not lo <= i <= hi]
    if bad:
        raise ConfigError(
            f"{source} {spelled}: ids {bad} are outside [{lo}, {hi}] for this {n_layers}-layer "
            f"verifier (id i = HF hidden_states[i], the input to decoder layer i; the engines "
            f"capture no id 0 or {n_layers} that matches HF)")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{source} {spelled}: duplicate ids")
    if ids != sorted(ids):
        raise ConfigError(f"{source} {spelled}: ids must increase (the engines concatenate the "
                          f"captured states in layer order: {','.join(map(str, sorted(ids)))})")
    return ids
