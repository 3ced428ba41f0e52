"""Hidden-state sources: what training reads, from the extract shards or from the verifier online.

Both implementations yield identical :class:`Row` tensors for a row (same capture code, same
storage rounding): :class:`DiskSource` decodes what ``specdraft extract`` stored;
:class:`OnlineSource` runs the verifier on each :meth:`~OnlineSource.get_batch` call (one padded
forward) and rounds through the same codec, so huge datasets need no disk. The convention of the
tensors is :data:`specdraft.core.capture.CONVENTION`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from specdraft.core.conventions import supervised_positions
from specdraft.core.errors import ConfigError, InputError, StageDirError
from specdraft.core.jsonl import iter_jsonl
from specdraft.core.manifest import load_stage_manifest
from specdraft.core.batching import pad_rows
from specdraft.core.capture import capture_packed, check_aux_ids, decoder_parts
from specdraft.core.storage import CODECS, ShardReader, decode
from specdraft.artifacts.layout import HEAD_FILE

INDEX_FILE = "index.jsonl"


@dataclass(frozen=True)
class Row:
    """One training row (all tensors on CPU unless a source says otherwise).

    ``aux_hidden`` holds the aux ids concatenated in the order given (``[T, n_aux·H]``);
    ``final_hidden`` is the verifier's hidden state after its final norm at ``target_positions``
    (so ``final_hidden @ lm_head.weight.T`` = the verifier's logits there).
    """

    key: str                        # f"{sample_id}/{turn_index}"
    input_ids: torch.Tensor         # [T] int64
    loss_mask: torch.Tensor         # [T] uint8
    aux_hidden: torch.Tensor        # [T, n_aux*H] float32
    final_hidden: torch.Tensor      # [n_sup, H] float32
    target_positions: torch.Tensor  # [n_sup] int64, ascending: p with loss_mask[p+1] == 1


def row_key(sample_id: Any, turn_index: Any) -> str:
    """The row key shared by all stages: ``f"{sample_id}/{turn_index}"``."""
    return f"{sample_id}/{int(turn_index)}"


_INDEX_FIELDS = {"key": str, "shard": str, "tok": int, "seq_len": int, "sup": int, "n_sup": int}


def read_index(path: Path) -> list[dict[str, Any]]:
    """The entries of ``index.jsonl``, each checked to hold the fields the shard reader uses
    (:class:`InputError` naming ``path:line`` otherwise: the file was edited or damaged)."""
    entries = []
    for lineno, e in iter_jsonl(path):
        bad = [k for k, t in _INDEX_FIELDS.items()
               if not isinstance(e.get(k), t) or isinstance(e.get(k), bool)]
        if bad:
            raise InputError(f"{path}:{lineno}: index entry lacks {bad} (or mistyped); rerun "
                             f"`specdraft extract --overwrite`")
        entries.append(e)
    return entries


class DiskSource:
    """Rows stored by ``specdraft extract`` in ``extract_dir`` (memory-mapped shards via the
    index). Raises :class:`StageDirError` when the stage is not complete.

    ``get_batch(indices)`` takes positions in :meth:`keys` order (= dataset order).
    """

    def __init__(self, extract_dir: str | os.PathLike) -> None:
        manifest = load_stage_manifest(extract_dir)
        if manifest is None:
            raise StageDirError(f"{extract_dir}/manifest.json not found: run `specdraft "
                                f"extract` to completion first")
        self._setup(extract_dir, manifest.aux_layer_ids, manifest.hidden_size,
                    manifest.storage.format)
        self.manifest = manifest

    @classmethod
    def from_index(cls, extract_dir: str | os.PathLike, aux_layer_ids: Sequence[int],
                   hidden_size: int, storage: str) -> "DiskSource":
        """A source over ``index.jsonl`` before the manifest exists (used by ``--verify``)."""
        self = cls.__new__(cls)
        self._setup(extract_dir, aux_layer_ids, hidden_size, storage)
        self.manifest = None
        return self

    def _setup(self, extract_dir: str | os.PathLike, aux_layer_ids: Sequence[int],
               hidden_size: int, storage: str) -> None:
        self.root = Path(extract_dir)
        self.aux_layer_ids = tuple(int(i) for i in aux_layer_ids)
        self.hidden_size = int(hidden_size)
        self.codec = CODECS[storage]
        self._entries = read_index(self.root / INDEX_FILE)
        self._reader = ShardReader(self.root, self.codec, len(self.aux_layer_ids),
                                   self.hidden_size)

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[str]:
        return [e["key"] for e in self._entries]

    def get_batch(self, indices: Sequence[int]) -> list[Row]:
        """Decode the rows at ``indices`` (fp32, exactly the stored values)."""
        rows = []
        for i in indices:
            entry = self._entries[i]
            r = self._reader.read(entry)
            rows.append(Row(entry["key"], r["input_ids"], r["loss_mask"], r["aux"], r["final"],
                            supervised_positions(r["loss_mask"])))
        return rows


def check_on_device(model: Any, device: str | torch.device | None) -> None:
    """Raise :class:`ConfigError` unless ``model``'s weights are on ``device`` (None: anywhere).
    ``"cuda"`` matches any CUDA device index the model was loaded on."""
    if device is None:
        return
    want, have = torch.device(device), model.get_input_embeddings().weight.device
    if want.type != have.type or (want.index is not None and want.index != have.index):
        raise ConfigError(f"the verifier is on {have}, but this stage runs it on {want}: load "
                          f"it there (--device {want})")


class OnlineSource:
    """Rows computed by the verifier on demand: one padded forward per :meth:`get_batch`.

    ``model``: an HF causal LM (:func:`specdraft.core.verifier.load_verifier`); ``dataset``: the
    prepare dataset (an HF ``Dataset`` or its directory). ``storage`` (a codec name of
    :data:`specdraft.core.storage.CODECS`) rounds values exactly as extraction would store
    them (``"bf16"`` → identical to a bf16 extract); ``"fp32"`` keeps the model's values.
    ``device``, when given, is where the verifier must already be (the model is never moved:
    it may be shared with other stages); rows are returned on ``row_device``.
    """

    def __init__(self, model: Any, dataset: Any, aux_layer_ids: Sequence[int], *,
                 device: str | torch.device | None = None, storage: str = "fp32",
                 row_device: str | torch.device = "cpu") -> None:
        if isinstance(dataset, (str, os.PathLike)):
            from datasets import load_from_disk
            dataset = load_from_disk(str(dataset))
        check_on_device(model, device)
        self.model, self.dataset = model, dataset
        self.aux_layer_ids = check_aux_ids(aux_layer_ids, len(decoder_parts(model)[1]))
        self.hidden_size = int(model.config.hidden_size)
        self.codec = CODECS[storage]
        self.row_device = torch.device(row_device)
        self._keys = [row_key(s, t) for s, t in zip(dataset["sample_id"],
                                                     dataset["turn_index"])]

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> list[str]:
        return list(self._keys)

    def get_batch(self, indices: Sequence[int]) -> list[Row]:
        """Run the verifier on the rows at ``indices`` (one right-padded forward)."""
        data = self.dataset[list(indices)]
        ids, masks = data["input_ids"], data["loss_mask"]
        for i, a, m in zip(indices, ids, masks):
            if len(a) != len(m):
                raise InputError(f"prepare dataset row {self._keys[i]}: input_ids has {len(a)} "
                                 f"tokens but loss_mask {len(m)}")
        padded = pad_rows(ids, masks)
        packed = capture_packed(self.model, padded, self.aux_layer_ids, self.codec)
        aux = decode(packed.aux[0], packed.aux[1], len(self.aux_layer_ids)).to(self.row_device)
        final = decode(packed.final[0], packed.final[1], 1).to(self.row_device)
        rows, t0, s0 = [], 0, 0
        for b, i in enumerate(indices):
            T, n = packed.lengths[b], packed.n_sup[b]
            mask = padded.loss_mask[b, :T].to(self.row_device)
            rows.append(Row(self._keys[i], padded.input_ids[b, :T].to(self.row_device), mask,
                            aux[t0:t0 + T], final[s0:s0 + n], supervised_positions(mask)))
            t0, s0 = t0 + T, s0 + n
        return rows


def load_verifier_head(extract_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """``{"lm_head.weight": [V, H], "embed_tokens.weight": [V, H]}`` of the verifier, in the
    dtype it was loaded in (fp32 or bf16), from ``extract_dir/verifier_head.safetensors``."""
    from safetensors.torch import load_file

    path = Path(extract_dir) / HEAD_FILE
    if not path.exists():
        raise StageDirError(f"{path} not found: run `specdraft extract` first")
    return load_file(str(path))


# --- the hidden-state probe: stored rows against a fresh forward of a verifier ---------------

PROBE_ROWS = 2            # stored extract rows the hidden-state probe recomputes
PROBE_MIN_COSINE = 0.9    # mean cosine(stored, recomputed) each captured layer must reach


def _cosines(stored: Any, ref: Any) -> Any:
    """Mean cosine similarity per captured layer: ``stored``/``ref`` ``[T, L, H]`` → ``[L]``."""
    return torch.nn.functional.cosine_similarity(stored.double(), ref.double(), dim=-1).mean(0)


def probe_hidden_states(model: Any, extract_dir: str | os.PathLike, *, rows: int = PROBE_ROWS,
                        min_cosine: float = PROBE_MIN_COSINE) -> dict[str, Any]:
    """Recompute the first ``rows`` stored rows of ``extract_dir`` with ``model`` and compare
    the aux states (every position) and the final state (supervised positions) with what is
    stored: ``ok`` when every layer's mean cosine similarity is at least ``min_cosine``.

    A change of hidden basis (``h → hQ``, ``Q`` orthogonal) keeps every logit but gives a
    cosine near 0 (about ``1/sqrt(H)`` for a random ``Q``); bf16/fp8 storage rounding and
    weight quantization noise keep it near 1. Returns the per-layer cosines (aux ids, then
    ``final``), the max abs difference and ``ok``."""
    source = DiskSource(extract_dir)
    aux_ids, H = source.aux_layer_ids, source.hidden_size
    picked = list(range(min(rows, len(source))))
    layers = [str(i) for i in aux_ids] + ["final"]
    worst = torch.ones(len(layers), dtype=torch.float64)
    max_abs = 0.0
    for stored in source.get_batch(picked):
        padded = pad_rows([stored.input_ids.tolist()], [stored.loss_mask.tolist()])
        with torch.no_grad():
            ref = capture_packed(model, padded, aux_ids, CODECS["fp32"])
        aux_ref = ref.aux[0].float().cpu().view(-1, len(aux_ids), H)
        aux_st = stored.aux_hidden.float().view(-1, len(aux_ids), H)
        fin_ref, fin_st = ref.final[0].float().cpu().view(-1, 1, H), \
            stored.final_hidden.float().view(-1, 1, H)
        cos = torch.cat([_cosines(aux_st, aux_ref), _cosines(fin_st, fin_ref)
                         if fin_st.numel() else torch.ones(1, dtype=torch.float64)])
        worst = torch.minimum(worst, cos)
        max_abs = max(max_abs, float((aux_st - aux_ref).abs().max()))
    cosines = {name: round(float(c), 6) for name, c in zip(layers, worst)}
    return {"rows": picked, "cosine": cosines, "min_cosine": min_cosine,
            "aux_max_abs_diff": max_abs, "ok": bool((worst >= min_cosine).all()) and bool(picked)}


def probe_line(report: dict[str, Any] | None, why_not: str = "") -> str:
    """The probe's one line (``why_not`` when it did not run)."""
    if report is None:
        return f"hidden-state probe: not run ({why_not})"
    low = min(report["cosine"].values()) if report["cosine"] else 0.0
    verdict = "passed" if report["ok"] else "FAILED: the verifier's hidden states are not the " \
        "ones the drafter was trained on (another model, or its hidden basis changed)"
    return (f"hidden-state probe: {len(report['rows'])} stored rows recomputed, lowest mean "
            f"cosine {low:.4f} (need >= {report['min_cosine']}): {verdict}")


def extract_rows_dir(run_dir: str | os.PathLike | None) -> Path | None:
    """``RUN/extract`` when it holds stored rows (an index and a manifest), else None."""
    if run_dir is None:
        return None
    from specdraft.artifacts.layout import RunLayout

    d = RunLayout(run_dir).extract
    return d if (d / "index.jsonl").exists() and (d / "manifest.json").exists() else None


def probe_or_skip(model: Any, run_dir: str | os.PathLike | None) -> dict[str, Any]:
    """Run the probe on ``RUN/extract`` when it has rows; else record why it did not run."""
    rows = extract_rows_dir(run_dir)
    if rows is None:
        why = "no RUN/extract rows (give --run-dir of the run that extracted them); only the " \
              "recorded identity was compared"
        return {"ran": False, "line": probe_line(None, why)}
    report = probe_hidden_states(model, rows)
    return {"ran": True, **report, "line": probe_line(report)}
