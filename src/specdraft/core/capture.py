"""Run the verifier once and capture its aux hidden states and its final hidden state.

The convention (the same as vLLM's and SGLang's default EAGLE-3 capture; EAGLE-3 paper,
arXiv 2503.01840, and ``vllm/model_executor/models/llama_eagle3.py``):

- aux id ``i`` is HF ``hidden_states[i]``: the input to decoder layer ``i`` (the output of layer
  ``i-1``). Valid ids and the default: :mod:`specdraft.core.conventions` (``[1, N-1]``,
  increasing). :func:`capture` itself can take id ``N``, HF ``hidden_states[N]``, which
  transformers ties to ``last_hidden_state`` (after the final norm; the engines never capture it).
- the final hidden state is the output of the verifier's final norm (``model.model.norm``), i.e.
  ``last_hidden_state``; ``lm_head(final)`` gives the verifier's logits (tested).

Capture uses forward pre-hooks on the decoder layers, so only the requested layers are kept and
the ``[B, T, V]`` logits are never computed (the base model is called, not the LM head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from specdraft.core.conventions import check_aux_layer_ids, default_aux_layer_ids
from specdraft.core.errors import ConfigError
from specdraft.core.conventions import supervised_mask
from specdraft.core.batching import Padded
from specdraft.core.storage import Codec, encode

CONVENTION = (
    "aux id i = HF hidden_states[i] = the input to decoder layer i (the output of layer i-1); "
    "id 0 (embedding output) is never taken, ids outside [1, N-1] are refused (HF "
    "hidden_states[N] is after the final norm, which the engines never capture). "
    "final_hidden = the output of "
    "the verifier's final norm (HF last_hidden_state), so lm_head(final_hidden) = the verifier's "
    "logits; it is stored at the positions p with loss_mask[p+1] == 1 (it predicts token p+1).")


def decoder_parts(model: Any) -> tuple[torch.nn.Module, torch.nn.ModuleList]:
    """``(base_model, decoder_layers)`` of an HF causal LM (``model.model.layers`` layout).

    Raises :class:`ConfigError` when the model does not have that layout.
    """
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "layers"):
        base = model.get_decoder() if hasattr(model, "get_decoder") else None
    if base is None or not isinstance(getattr(base, "layers", None), torch.nn.ModuleList):
        raise ConfigError(f"--verifier: {type(model).__name__} has no `model.layers` decoder "
                          f"stack; only HF decoder-only causal LMs are supported")
    return base, base.layers


def num_layers(model: Any) -> int:
    """N, the number of decoder layers of the verifier."""
    return len(decoder_parts(model)[1])


def default_aux_ids(n_layers: int) -> tuple[int, ...]:
    """The default aux ids: :func:`specdraft.core.conventions.default_aux_layer_ids` (vLLM's and
    SGLang's ``(2, N//2, N-3)`` when valid, else spread over ``[1, N-1]``)."""
    return tuple(default_aux_layer_ids(n_layers))


def check_aux_ids(ids: Sequence[int], n_layers: int, *, source: str = "--aux-layers"
                  ) -> tuple[int, ...]:
    """Validate aux ids (:func:`specdraft.core.conventions.check_aux_layer_ids`: ``[1, N-1]``,
    distinct, increasing); return them as a tuple. Raises :class:`ConfigError` naming ``source``.
    """
    return tuple(check_aux_layer_ids(list(ids), n_layers, source=source))


def model_device(model: Any) -> torch.device:
    """The device of the input embedding (where input ids must go, also under ``device_map``)."""
    return model.get_input_embeddings().weight.device


@torch.no_grad()
def capture(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            position_ids: torch.Tensor, aux_ids: Sequence[int]
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of the verifier's base model; return ``(aux, final)``.

    Inputs are ``[B, T]`` int64 (right-padded; see :mod:`specdraft.core.batching`).
    Returns ``aux`` ``[B, T, n_aux, H]`` in the model's dtype, aux ids in the order given, and
    ``final`` ``[B, T, H]``: the output of the final norm. Values at padded positions are
    meaningless. Aux ids must already be checked (:func:`check_aux_ids`).
    """
    base, layers = decoder_parts(model)
    n = len(layers)
    grabbed: dict[int, torch.Tensor] = {}

    def grab(i: int):
        def hook(module, args, kwargs):
            grabbed[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    handles = [layers[i].register_forward_pre_hook(grab(i), with_kwargs=True)
               for i in set(aux_ids) if i < n]
    try:
        device = model_device(model)
        out = base(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                   position_ids=position_ids.to(device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    final = out.last_hidden_state  # [B, T, H], after the final norm
    grabbed[n] = final
    aux = torch.stack([grabbed[i].to(final.device) for i in aux_ids], dim=2)  # [B, T, n_aux, H]
    return aux, final


@dataclass
class Packed:
    """A captured batch without padding, rows back to back, encoded by a storage codec.

    ``aux`` = ``(data [ΣT, n_aux·H], scale [ΣT, n_aux] | None)`` for every real position;
    ``final`` = ``(data [Σn_sup, H], scale [Σn_sup, 1] | None)`` at the target positions
    (``loss_mask[p+1] == 1``), ascending within a row. ``lengths`` / ``n_sup`` split them by row.
    """

    lengths: list[int]
    n_sup: list[int]
    aux: tuple[torch.Tensor, torch.Tensor | None]
    final: tuple[torch.Tensor, torch.Tensor | None]


def capture_packed(model: Any, padded: Padded, aux_ids: Sequence[int], codec: Codec) -> Packed:
    """:func:`capture` on a right-padded batch, padding dropped, encoded with ``codec``.

    This is the single code path of extraction, ``--verify`` and the online source, so that all
    three produce the same values for a row.
    """
    aux, final = capture(model, padded.input_ids, padded.attention_mask, padded.position_ids,
                         aux_ids)  # [B, T, n_aux, H], [B, T, H]
    valid = padded.attention_mask.bool().to(aux.device)  # [B, T]
    sup = supervised_mask(padded.loss_mask).to(aux.device) & valid  # [B, T]
    aux_enc = encode(aux[valid], codec)  # [ΣT, n_aux·H]
    final_enc = encode(final[sup][:, None, :], codec)  # [Σn_sup, H]
    return Packed(lengths=padded.lengths.tolist(), n_sup=sup.sum(dim=1).tolist(),
                  aux=aux_enc, final=final_enc)
