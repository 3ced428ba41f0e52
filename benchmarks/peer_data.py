"""specdraft rows -> the offline-data directory vllm-project/speculators 0.9.0 trains from.

Runs in specdraft's venv (no speculators import). The peer's format (facts in
``../shared/reference/peer-speculators-cpu.md``; its reader is ``speculators/train/data.py``
``ArrowDataset`` + ``hs_connectors`` ``FileTransfer``):

- ``DIR/`` a ``datasets.save_to_disk`` dataset, columns ``input_ids`` [T] int64, ``loss_mask``
  [T] int64 0/1, ``seq_len`` int, torch format (as its ``prepare_data`` saves it);
- ``DIR/hidden_states/hs_{i}.safetensors`` for row ``i``: ``hidden_states`` [T, n_aux+1, H]
  (slots ``0..n_aux-1`` the aux layers in id order, slot ``n_aux`` the last decoder layer's
  output *before* the final norm) and ``token_ids`` [T] (= the row's ``input_ids``);
- ``DIR/d2t.npy`` [K] int64, ``DIR/t2d.npy`` [V] bool: specdraft's own vocab map
  (``--d2t-path/--t2d-path``; same ``target = draft + d2t[draft]`` rule,
  ``speculators/model.py`` ``load_vocab_mappings``).

What is converted exactly, and how (the two trainers align the same way otherwise; worked out
from ``speculators/models/eagle3/data.py`` ``shift_batch`` and ``metrics.py``
``align_for_step``):

1. **Supervised positions.** The peer's column ``t`` of TTT step ``k`` reads the target from
   slot ``n_aux`` at position ``t+k+1`` and is supervised iff ``loss_mask[t+k+1] == 1``;
   specdraft's is supervised iff ``loss_mask[t+k+2] == 1`` (the predicted token is a completion
   token, :func:`specdraft.core.conventions.supervised_positions`). The converted mask is
   therefore ``peer_mask[q] = loss_mask[q+1]`` (``0`` at ``q = T-1``): both trainers then train
   on exactly the same (position, target) pairs, and the peer reads slot ``n_aux`` only at the
   positions specdraft stored a final state for. Everywhere else that slot is 0 (never read
   into a loss or a metric: masked).
2. **The final norm.** specdraft stores ``f = g * y / rms(y)`` (after the verifier's norm, gain
   ``g``); the peer applies the verifier norm itself. Slot ``n_aux`` holds ``z = f / g`` and the
   peer's verifier directory gets ``model.norm.weight = g``, so the peer computes
   ``g * z / sqrt(mean(z**2) + eps) = f / sqrt(ms / (ms + eps) + eps)`` with ``ms = mean(y**2)``:
   ``f`` up to a factor ``1 + O(eps)`` (≈ 1e-5 relative for eps 1e-5), far below one bf16
   rounding step. A gain with a zero entry cannot be inverted and is refused.
3. **Aux features** are copied as stored (``[T, n_aux*H]`` reshaped to ``[T, n_aux, H]``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from specdraft.core.conventions import supervised_positions
from specdraft.core.errors import InputError

HS_DIR = "hidden_states"


def peer_loss_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """[T] int64: ``loss_mask`` shifted left by one (``peer[q] = loss_mask[q+1]``, 0 at the end),
    so the peer supervises exactly specdraft's positions (module docstring, point 1)."""
    out = torch.zeros(loss_mask.numel(), dtype=torch.long)
    out[:-1] = loss_mask[1:].long()
    return out


def peer_read_positions(peer_mask: torch.Tensor) -> torch.Tensor:
    """[n] int64: the positions ``q`` whose slot ``n_aux`` the peer reads into a loss or metric
    (its column ``t`` of step ``k`` reads ``q = t+k+1 >= 1`` when ``peer_mask[q] == 1``;
    ``shift_batch`` drops position 0). The conversion is exact iff these are exactly
    specdraft's ``target_positions``."""
    q = torch.nonzero(peer_mask.long() == 1).flatten()
    return q[q >= 1]


def peer_hidden(row: Any, gain: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``hidden_states`` [T, n_aux+1, H] of one :class:`specdraft.artifacts.hidden_states.Row`.

    row.aux_hidden [T, n_aux*H], row.final_hidden [n_sup, H] (after the norm) at
    row.target_positions; gain [H] (the verifier final norm's effective gain). Raises
    :class:`InputError` naming the row when a gain entry is 0 or the positions are wrong.
    """
    T, H = row.input_ids.numel(), gain.numel()
    if bool((gain == 0).any()):
        raise InputError(f"row {row.key}: the verifier's final-norm gain has zero entries; "
                         f"the post-norm state cannot be converted to the peer's pre-norm slot")
    pos = row.target_positions.long()
    if not torch.equal(pos, supervised_positions(row.loss_mask)):
        raise InputError(f"row {row.key}: target_positions are not the p with "
                         f"loss_mask[p+1] == 1")
    aux = row.aux_hidden.float().reshape(T, -1, H)  # [T, n_aux, H]
    last = torch.zeros(T, 1, H, dtype=torch.float32)
    last[pos, 0] = row.final_hidden.float() / gain.float()
    return torch.cat([aux, last], dim=1).to(dtype)  # [T, n_aux+1, H]


def write_offline(out_dir: Path, rows: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                  ) -> int:
    """Write ``(input_ids [T], peer_mask [T], hidden [T, n_aux+1, H])`` rows into ``out_dir``
    (the dataset and ``hidden_states/hs_{i}.safetensors``). Returns the row count."""
    import datasets
    from safetensors.torch import save_file

    (out_dir / HS_DIR).mkdir(parents=True, exist_ok=True)
    cols: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for i, (ids, mask, hidden) in enumerate(rows):
        save_file({"hidden_states": hidden.contiguous(), "token_ids": ids.long().contiguous()},
                  str(out_dir / HS_DIR / f"hs_{i}.safetensors"))
        cols["input_ids"].append(ids.long().tolist())
        cols["loss_mask"].append(mask.long().tolist())
        cols["seq_len"].append(int(ids.numel()))
    ds = datasets.Dataset.from_dict(cols)
    ds.set_format(type="torch")
    ds.save_to_disk(str(out_dir))
    return len(cols["seq_len"])


def write_vocab(out_dir: Path, d2t: torch.Tensor, t2d: torch.Tensor) -> tuple[Path, Path]:
    """``d2t.npy`` [K] int64 and ``t2d.npy`` [V] bool in ``out_dir``; returns their paths."""
    d2t_path, t2d_path = out_dir / "d2t.npy", out_dir / "t2d.npy"
    np.save(d2t_path, d2t.long().numpy())
    np.save(t2d_path, t2d.bool().numpy())
    return d2t_path, t2d_path


def write_verifier_dir(out_dir: Path, hf_config: Any, embed: torch.Tensor, lm_head: torch.Tensor,
                       gain: torch.Tensor) -> Path:
    """A verifier directory holding only what the peer reads from it (``config.json``, and
    ``model.embed_tokens.weight``, ``lm_head.weight``, ``model.norm.weight`` = ``gain`` in
    ``model.safetensors``; ``speculators/model.py`` ``_load_verifier_weights``)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = hf_config.to_dict()
    cfg.pop("quantization_config", None)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file({"model.embed_tokens.weight": embed.float().contiguous(),
               "lm_head.weight": lm_head.float().clone(),
               "model.norm.weight": gain.float().contiguous()},
              str(out_dir / "model.safetensors"))
    return out_dir


def effective_gain(norm_weight: torch.Tensor, model_type: str) -> torch.Tensor:
    """[H] the factor the verifier's final RMSNorm multiplies by (``w`` or ``1 + w``,
    :func:`specdraft.core.profile.norm_gain`)."""
    from specdraft.core.profile import norm_gain

    w = norm_weight.detach().float()
    return w if norm_gain(model_type) == "w" else 1.0 + w


def convert_source(source: Any, indices: Sequence[int], out_dir: Path, gain: torch.Tensor,
                   dtype: torch.dtype = torch.float32, batch: int = 16) -> int:
    """Convert rows ``indices`` of a hidden-state source (e.g. ``DiskSource(RUN/extract)``), in
    that order, into ``out_dir``; returns the row count."""
    def rows():
        for start in range(0, len(indices), batch):
            for r in source.get_batch(list(indices[start:start + batch])):
                yield r.input_ids, peer_loss_mask(r.loss_mask), peer_hidden(r, gain, dtype)
    os.makedirs(out_dir, exist_ok=True)
    return write_offline(Path(out_dir), rows())


def peer_python(repo: Path) -> Path:
    """Python of ``REPO/.venv-speculators`` (speculators 0.9.0 and its real needs, installed
    ``--no-deps`` per ``../shared/reference/peer-speculators-cpu.md``: its pins pull CUDA
    torchvision/torchaudio that break ``import transformers`` here). Built when missing (needs
    PyPI), then cached; raises ``RuntimeError`` naming the failed step."""
    import subprocess
    import sys

    venv = Path(repo) / ".venv-speculators"
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import speculators, hs_connectors"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    pip = [str(py), "-m", "pip", "install", "-q"]
    steps = [[sys.executable, "-m", "venv", str(venv)],
             pip + ["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"],
             pip + ["--no-deps", "speculators==0.9.0", "hs-connectors==0.9.0"],
             pip + ["transformers<=5.19.0,>=5.0.0", "datasets<=5.1.0,>=4.0.0", "loguru",
                    "pydantic-settings", "typer", "rich", "openai", "httpx", "aiohttp",
                    "safetensors", "protobuf", "psutil"],
             check]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building {venv}: `{' '.join(step[:5])}` failed: "
                               f"{done.stderr.strip()[-400:]}")
    return py
