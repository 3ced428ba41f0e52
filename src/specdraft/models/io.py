"""Save a trained drafter as a directory: ``drafter_config.json`` + ``drafter.safetensors``.

This is specdraft's own format (``RUN/train/best/``, ``RUN/train/checkpoints/step-N/``); engine
formats are written by :mod:`specdraft.export`. The config declares the drafter's kind
(``"kind"``, :mod:`specdraft.kinds`); the safetensors file holds the model's
``checkpoint_state`` with ``embed_tokens.weight`` (the frozen copy of the verifier's embedding,
for the kinds that have one), so a drafter directory is self-contained. It is read back by
:func:`specdraft.artifacts.drafter.load_drafter` (which dispatches on the declared kind).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save_file

from specdraft.core.atomic import atomic_dir

CONFIG_FILE = "drafter_config.json"
WEIGHTS_FILE = "drafter.safetensors"


class DrafterConfig(Protocol):
    """What every drafter kind's config has: its declared ``kind``, the HF ``hidden_states``
    indices it reads (``aux_layer_ids``), the verifier's vocabulary size and ``to_dict``."""

    kind: str
    aux_layer_ids: tuple[int, ...]
    vocab_size: int

    def to_dict(self) -> dict[str, Any]: ...


class Drafter(Protocol):
    """A drafter model of any kind (an ``nn.Module``): its config and its checkpoint tensors
    under the checkpoint's own names."""

    config: Any

    def checkpoint_state(self, *, include_embed: bool = False
                         ) -> dict[str, torch.Tensor]: ...


def save_drafter(model: Drafter, out_dir: str | Path) -> Path:
    """Write ``out_dir`` atomically (temp dir + rename); tensors saved contiguous, on CPU."""
    state = {k: v.detach().cpu().contiguous() for k, v in
             model.checkpoint_state(include_embed=True).items()}
    with atomic_dir(out_dir) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
        save_file(state, str(tmp / WEIGHTS_FILE))
    return Path(out_dir)
