"""The conventions every stage shares, each defined once here and called by every stage.

- **Supervised positions.** The drafter at position ``p`` predicts token ``p + 1``; a position is
  supervised iff the token it predicts is: ``loss_mask[p + 1] == 1``. The last position has no
  next token and is never supervised. EAGLE-3 trains on the verifier's next-token distribution at
  the same positions (arXiv 2503.01840, §3), so ``extract`` stores the final hidden state at
  exactly these positions and ``train`` checks that it did.
- **Draft vocabulary maps.** ``d2t`` ``[K]`` int64 holds offsets: ``target = draft + d2t[draft]``
  (vLLM ``model_executor/models/llama_eagle3.py`` scatters draft logits to
  ``arange(K) + d2t``; SGLang turns it into hot token ids the same way); ``t2d`` ``[V]`` bool
  marks the K target ids (training only; both engines skip it at load).
- **Aux layer ids (EAGLE-3 features).** Id ``i`` = HF ``hidden_states[i]`` = the input to decoder
  layer ``i`` (0 = the embedding output). ``extract``, ``train``, ``export`` and ``doctor`` all
  call :func:`check_aux_layer_ids`; the default comes from :func:`default_aux_layer_ids`. Every
  conversion to another spelling (vLLM, SGLang, the extraction engine's capture ids, DFlash
  ``target_layer_ids``) is in :mod:`specdraft.core.aux_ids`.

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

from typing import Any, Sequence

import numpy as np

from specdraft.core.errors import ConfigError

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index
AUX_CONVENTION = "hf_hidden_states: aux id i = HF hidden_states[i] = input to decoder layer i"


def supervised_mask(loss_mask: Any) -> Any:
    """Bool ``[..., T]``: ``loss_mask[..., p + 1] == 1``; False at the last position.

    ``loss_mask`` ``[..., T]`` (0/1, 0 on padding) as a torch tensor or numpy array; the result
    has the same kind and device.
    """
    if hasattr(loss_mask, "new_zeros"):  # torch
        out = loss_mask.new_zeros(loss_mask.shape).bool()
    else:
        out = np.zeros(loss_mask.shape, dtype=bool)
    out[..., :-1] = loss_mask[..., 1:] == 1
    return out


def supervised_positions(loss_mask: Any) -> Any:
    """``[n_sup]`` int64 torch tensor, ascending: the ``p`` with ``loss_mask[p + 1] == 1`` for a
    ``[T]`` torch mask."""
    import torch

    return torch.nonzero(supervised_mask(loss_mask), as_tuple=False).flatten().to(torch.int64)


def next_token_targets(input_ids: Any, loss_mask: Any, *,
                       ignore_index: int = IGNORE_INDEX) -> tuple[Any, Any]:
    """``(labels, supervised)`` for ``input_ids`` and ``loss_mask`` of shape ``[..., T]``.

    - ``labels`` ``[..., T]``, dtype of ``input_ids``: ``labels[..., p] = input_ids[..., p + 1]``;
      the last position holds ``ignore_index``.
    - ``supervised`` ``[..., T]`` bool: :func:`supervised_mask`.

    Works on torch tensors and numpy arrays alike. Raises ValueError when shapes differ.
    """
    if tuple(input_ids.shape) != tuple(loss_mask.shape):
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and loss_mask "
                         f"{tuple(loss_mask.shape)} differ in shape")
    labels = input_ids.clone() if hasattr(input_ids, "clone") else input_ids.copy()  # [..., T]
    labels[..., :-1] = input_ids[..., 1:]
    labels[..., -1] = ignore_index
    return labels, supervised_mask(loss_mask)


def vocab_map_problems(d2t: Any, t2d: Any, K: int | None = None,
                       V: int | None = None) -> list[str]:
    """What is wrong with a ``(d2t [K], t2d [V])`` pair, empty when nothing is.

    The contract: ``arange(K) + d2t`` strictly increasing inside ``[0, V)`` (distinct, sorted
    target ids) and ``t2d`` True exactly at those ids (``t2d.sum() == K``). ``K``/``V``, when
    given, are the sizes the pair must have (the drafter's ``draft_vocab_size`` and
    ``vocab_size``). Accepts torch tensors or numpy arrays.
    """
    if d2t is None or t2d is None:
        return [f"{'d2t' if d2t is None else 't2d'} absent: the engines cannot map the draft "
                f"ids to the verifier ids (vLLM scatters logits to arange(K) + d2t); train with "
                f"the vocab map of `specdraft vocab` (RUN/vocab/vocab_map.safetensors)"]
    d2t = np.asarray(d2t.cpu() if hasattr(d2t, "cpu") else d2t).astype(np.int64)
    t2d = np.asarray(t2d.cpu() if hasattr(t2d, "cpu") else t2d).astype(bool)
    K = len(d2t) if K is None else K
    V = len(t2d) if V is None else V
    if d2t.shape != (K,) or t2d.shape != (V,):
        return [f"d2t shape {list(d2t.shape)} / t2d shape {list(t2d.shape)}: expected [{K}] "
                f"and [{V}]"]
    problems: list[str] = []
    target = np.arange(K, dtype=np.int64) + d2t  # [K]
    if K > 1 and np.any(np.diff(target) <= 0):
        problems.append("arange(K) + d2t is not strictly increasing (duplicate or unsorted "
                        "target ids)")
    if K and (target.min() < 0 or target.max() >= V):
        problems.append(f"arange(K) + d2t leaves [0, {V}): min {int(target.min())}, "
                        f"max {int(target.max())}")
    if int(t2d.sum()) != K:
        problems.append(f"t2d has {int(t2d.sum())} true entries, expected draft vocab {K}")
    inside = target[(target >= 0) & (target < V)]
    if not t2d[inside].all():
        problems.append("t2d and d2t disagree: some arange(K) + d2t ids are false in t2d")
    return problems

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
    see :func:`specdraft.artifacts.validate.check_aux_ids`). N=4 leaves only ``[1, 2, 3]`` (exports
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
