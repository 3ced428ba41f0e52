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
# Largest relative error ||stored - round(fresh)|| / ||stored|| of any captured layer, by what
# the probe can expect (:func:`probe_tier`). Measured by `python benchmarks/probe_calibration.py
# [--smollm2]` (bf16 storage; docs/verifier-binding.md has the table): a true bf16 copy run in
# fp32 5.3e-3 (SmolLM2-135M, final state) / 3.7e-3 (tiny Llama); every parameter of the last
# layer x1.01: 3.0e-2 / 1.4e-2; bf16 compute on either side up to 2.7e-2 (8-bit RTN 3.4e-2);
# 4-bit RTN (GPTQ/AWQ's grid, cruder rounding) up to 0.45 / 0.16; another model or a rotated
# basis 1.4 (about sqrt(2): uncorrelated states of equal norm).
PROBE_MAX_REL = {
    "fp32": 0.01,       # both forwards in fp32, storage fp32/bf16: catches last layer x1.01
    "bf16": 0.1,        # a bf16 forward on either side, or fp8 storage: 1 % changes hidden
    "quantized": 0.7,   # a packed quantization against float (or another one): 4-bit passes
}


def probe_tier(model: Any, manifest: Any, quantized: bool) -> str:
    """The tolerance tier of :data:`PROBE_MAX_REL`: ``quantized`` when the given verifier is a
    packed quantization other than the extracted one (``quantized``: from the identity
    comparison), else ``fp32`` when this forward and the extraction's ran in float32 and the
    rows are stored in fp32/bf16, else ``bf16``."""
    if quantized:
        return "quantized"
    extracted = str((manifest.verifier or {}).get("dtype", "")).removeprefix("torch.")
    here = str(getattr(model, "dtype", "")).removeprefix("torch.")
    storage = manifest.storage.format.removesuffix("-zstd")
    fp32 = extracted == here == "float32" and storage in ("fp32", "bf16")
    return "fp32" if fp32 else "bf16"


def _layer_errors(stored: Any, ref: Any) -> tuple[Any, Any]:
    """Per captured layer, for ``stored``/``ref`` ``[T, L, H]``: mean cosine similarity
    ``[L]`` and the squared norms of ``stored - ref`` and of ``stored`` ``[2, L]`` (summed
    over rows by the caller into a relative error)."""
    s, r = stored.double(), ref.double()
    cos = torch.nn.functional.cosine_similarity(s, r, dim=-1).mean(0)
    return cos, torch.stack([(s - r).pow(2).sum((0, 2)), s.pow(2).sum((0, 2))])


def probe_hidden_states(model: Any, extract_dir: str | os.PathLike, *, rows: int = PROBE_ROWS,
                        quantized: bool = False) -> dict[str, Any]:
    """Recompute the first ``rows`` stored rows of ``extract_dir`` with ``model``, round them
    through the rows' storage codec, and compare the aux states (every position) and the
    final state (supervised positions) with what is stored: ``ok`` when every captured
    layer's relative error ``||stored - fresh|| / ||stored||`` is at most
    :data:`PROBE_MAX_REL` of :func:`probe_tier` (``quantized``: the given verifier is a packed
    quantization the rows were not extracted with).

    A change of hidden basis (``h → hQ``, ``Q`` orthogonal) keeps every logit but gives a
    relative error near ``sqrt(2)`` (cosine near 0); so does another model. Returns the tier,
    the per-layer relative errors and mean cosines (aux ids, then ``final``), the max abs
    difference and ``ok``."""
    source = DiskSource(extract_dir)
    aux_ids, H = source.aux_layer_ids, source.hidden_size
    tier = probe_tier(model, source.manifest, quantized)
    picked = list(range(min(rows, len(source))))
    layers = [str(i) for i in aux_ids] + ["final"]
    worst = torch.ones(len(layers), dtype=torch.float64)
    sums = torch.zeros(2, len(layers), dtype=torch.float64)
    max_abs = 0.0
    for stored in source.get_batch(picked):
        padded = pad_rows([stored.input_ids.tolist()], [stored.loss_mask.tolist()])
        with torch.no_grad():
            ref = capture_packed(model, padded, aux_ids, source.codec)
        aux_ref = decode(ref.aux[0], ref.aux[1], len(aux_ids)).cpu().view(-1, len(aux_ids), H)
        aux_st = stored.aux_hidden.float().view(-1, len(aux_ids), H)
        fin_ref = decode(ref.final[0], ref.final[1], 1).cpu().view(-1, 1, H)
        fin_st = stored.final_hidden.float().view(-1, 1, H)
        cos, sq = _layer_errors(aux_st, aux_ref)
        if fin_st.numel():
            fcos, fsq = _layer_errors(fin_st, fin_ref)
        else:
            fcos, fsq = torch.ones(1, dtype=torch.float64), torch.zeros(2, 1,
                                                                       dtype=torch.float64)
        worst = torch.minimum(worst, torch.cat([cos, fcos]))
        sums += torch.cat([sq, fsq], dim=1)
        max_abs = max(max_abs, float((aux_st - aux_ref).abs().max()))
    rel = (sums[0] / sums[1].clamp_min(1e-300)).sqrt()
    limit = PROBE_MAX_REL[tier]
    return {"rows": picked, "tier": tier, "max_rel_error": limit,
            "rel_error": {n: float(f"{float(r):.4g}") for n, r in zip(layers, rel)},
            "cosine": {n: round(float(c), 6) for n, c in zip(layers, worst)},
            "aux_max_abs_diff": max_abs,
            "ok": bool((rel <= limit).all()) and bool(picked)}


def probe_line(report: dict[str, Any] | None, why_not: str = "") -> str:
    """The probe's one line (``why_not`` when it did not run)."""
    if report is None:
        return f"hidden-state probe: not run ({why_not})"
    errors = report["rel_error"]
    layer = max(errors, key=errors.get) if errors else "-"
    verdict = "passed" if report["ok"] else "FAILED: the verifier's hidden states are not the " \
        "ones the drafter was trained on (another model, a changed layer, or its hidden " \
        "basis changed)"
    return (f"hidden-state probe: {len(report['rows'])} stored rows recomputed, largest "
            f"relative error {errors.get(layer, 0.0):.3g} at layer {layer} (at most "
            f"{report['max_rel_error']:g}, {report['tier']} tier), lowest mean cosine "
            f"{min(report['cosine'].values(), default=0.0):.4f}: {verdict}")


def extract_rows_dir(run_dir: str | os.PathLike | None) -> Path | None:
    """``RUN/extract`` when it holds stored rows (an index and a manifest), else None."""
    if run_dir is None:
        return None
    from specdraft.artifacts.layout import RunLayout

    d = RunLayout(run_dir).extract
    return d if (d / "index.jsonl").exists() and (d / "manifest.json").exists() else None


def probe_or_skip(model: Any, run_dir: str | os.PathLike | None, *,
                  quantized: bool = False) -> dict[str, Any]:
    """Run the probe on ``RUN/extract`` when it has rows; else record why it did not run.
    ``quantized``: the verifier's quantization differs from the extracted one's
    (:attr:`specdraft.core.verifier_identity.Comparison.requantized`)."""
    rows = extract_rows_dir(run_dir)
    if rows is None:
        why = "no RUN/extract rows (give --run-dir of the run that extracted them); only the " \
              "recorded identity was compared"
        return {"ran": False, "line": probe_line(None, why)}
    report = probe_hidden_states(model, rows, quantized=quantized)
    return {"ran": True, **report, "line": probe_line(report)}
