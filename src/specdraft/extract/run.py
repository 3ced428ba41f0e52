"""``specdraft extract``: run the verifier over the prepared rows and store its hidden states.

Data-parallel under ``torchrun`` (the process group and this process's rank: the stage context,
:mod:`specdraft.core.context`); rank ``r`` computes batches ``r, r+W, r+2W, …`` of the
deterministic plan
(:mod:`specdraft.core.batching`), writes its own shards and index part, and rank 0 merges the
index, writes the verifier head and the manifest after a barrier.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from specdraft.core.atomic import atomic_write_json, atomic_write_text
from specdraft.core.errors import ConfigError, InputError, StageDirError
from specdraft.core.jsonl import iter_jsonl, read_json
from specdraft.core.progress import StageProgress
from specdraft.core.manifest import ExtractManifest, StageClock, input_hash, \
    load_stage_manifest, write_manifest
from specdraft.core.profile import VerifierProfile, resolve_profile
from specdraft.core.resume import record_settings
from specdraft.core.rundir import check_stage_dir, open_stage_dir, require_stage
from specdraft.core.batching import pad_rows, plan_batches, plan_shards, rank_batches
from specdraft.core.capture import (CONVENTION, capture_packed, check_aux_ids,
                                       default_aux_ids, num_layers)
from specdraft.extract.config import ExtractConfig
from specdraft.artifacts.hidden_states import HEAD_FILE, INDEX_FILE, DiskSource, row_key
from specdraft.core.storage import CODECS, Codec, row_bytes
from specdraft.extract.writer import RankWriter, part_path, progress_fields, recover
from specdraft.artifacts.layout import RunLayout
from specdraft.artifacts.verifier_contract import bind_model_stage
from specdraft.core.context import StageContext, stage_context

STAGE = "extract"
PLAN_FILE = "plan.json"
TARGET_DOC = (
    "final hidden state (after the final norm) at the supervised positions, stored with the "
    "aux codec; with verifier_head.safetensors it gives the exact full-vocabulary teacher "
    "(any draft vocabulary, no top-k truncation) at H values per supervised token")


# ---------------------------------------------------------------- distributed helpers


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist
        dist.barrier()


def _on_rank0(fn: Callable[[], Any], rank: int, world: int) -> Any:
    """Run ``fn`` on rank 0 only; every rank raises if it failed (no rank hangs at a barrier)."""
    result, error = None, None
    if rank == 0:
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001 - re-raised below on every rank
            error = err
    if world > 1:
        import torch.distributed as dist
        box = [None if error is None else f"{type(error).__name__}: {error}"]
        dist.broadcast_object_list(box, src=0)
        if box[0] is not None and error is None:
            raise StageDirError(f"rank 0 failed: {box[0]}")
    if error is not None:
        raise error
    return result


# ---------------------------------------------------------------- inputs


def _load_dataset(run_dir: Path) -> Any:
    from datasets import load_from_disk

    path = RunLayout(run_dir).dataset
    try:
        ds = load_from_disk(str(path))
    except Exception as err:  # datasets/pyarrow raise many types for a damaged directory
        raise InputError(f"{path}: not a readable prepared dataset ({type(err).__name__}: "
                         f"{' '.join(str(err).split())[:200]}); rerun `specdraft prepare "
                         f"--overwrite`") from None
    missing = {"input_ids", "loss_mask", "sample_id", "turn_index", "seq_len"} - set(
        ds.column_names)
    if missing:
        raise InputError(f"{path}: columns {sorted(missing)} missing (see docs/run-dir.md)")
    return ds


def _row_table(ds: Any) -> tuple[list[str], list[int]]:
    """Row keys and lengths in dataset order; raise :class:`InputError` on a duplicate key."""
    keys = [row_key(s, t) for s, t in zip(ds["sample_id"], ds["turn_index"])]
    seen: set[str] = set()
    for k in keys:
        if k in seen:
            raise InputError(f"prepare dataset: row key {k} appears twice")
        seen.add(k)
    return keys, [int(n) for n in ds["seq_len"]]


def _load_rows(ds: Any, rows: Sequence[int], keys: Sequence[str], seq_lens: Sequence[int]
               ) -> tuple[list[list[int]], list[list[int]]]:
    """``input_ids`` and ``loss_mask`` of ``rows``; :class:`InputError` names a bad row."""
    data = ds[list(rows)]
    for r, ids, mask in zip(rows, data["input_ids"], data["loss_mask"]):
        if not len(ids) == len(mask) == seq_lens[r] or not ids:
            raise InputError(f"prepare dataset row {keys[r]}: input_ids {len(ids)}, loss_mask "
                             f"{len(mask)} and seq_len {seq_lens[r]} must be equal and > 0")
    return data["input_ids"], data["loss_mask"]


def _n_sup(ds: Any) -> list[int]:
    """Supervised positions per row (``loss_mask[p+1] == 1``), for the plan and size estimate.

    Computed on the Arrow column (prefix sums), without materialising Python lists.
    """
    import numpy as np
    import pyarrow as pa

    column = ds.with_format("arrow")["loss_mask"]
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out: list[int] = []
    for chunk in chunks:
        offsets = chunk.offsets.to_numpy()
        values = chunk.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
        csum = np.concatenate([[0], np.cumsum(values)])
        starts = np.minimum(offsets[:-1] - offsets[0] + 1, offsets[1:] - offsets[0])
        out.extend((csum[offsets[1:] - offsets[0]] - csum[starts]).tolist())
    return out


# ---------------------------------------------------------------- plan, disk, resume


def _plan(config: ExtractConfig, seq_lens: list[int], n_sup: list[int], groups: int,
          hidden: int, rank: int, world: int) -> tuple[list, list[list[int]]]:
    """This rank's batches and shard plan (deterministic; see :mod:`.batching`)."""
    codec = CODECS[config.storage]
    batches = rank_batches(plan_batches(seq_lens, config.batch_tokens), rank, world)
    rows = [r for b in batches for r in b.rows]
    sizes = [row_bytes(seq_lens[r], n_sup[r], groups, hidden, codec) for r in rows]
    return batches, plan_shards(rows, sizes, int(config.shard_mb * 2**20))


def _check_plan(out: Path, plan: dict[str, Any], resume: bool) -> None:
    """Write ``plan.json``; on resume refuse settings that would change the shards."""
    path = out / PLAN_FILE
    if resume and path.exists():
        old = read_json(path, what="extract plan")
        old = old if isinstance(old, dict) else {}
        changed = sorted(k for k in plan if old.get(k) != plan[k])
        if changed:
            raise StageDirError(f"{path}: --resume with changed settings {changed} (was "
                                f"{ {k: old.get(k) for k in changed} }); use the same settings "
                                f"or --overwrite")
    atomic_write_json(path, plan)


def _check_disk(out: Path, estimate: int) -> None:
    """Print the estimated size; refuse when the free space (plus shards kept) is smaller."""
    kept = sum(f.stat().st_size for f in (out / "shards").glob("*.safetensors"))
    free = shutil.disk_usage(out).free
    print(f"extract: estimated size {estimate / 2**30:.3f} GiB, free {free / 2**30:.1f} GiB",
          file=sys.stderr)
    if estimate - kept > free:
        raise StageDirError(f"{out}: needs about {(estimate - kept) / 2**30:.2f} GiB but only "
                            f"{free / 2**30:.2f} GiB are free")


# ---------------------------------------------------------------- the extraction loop


def extract_progress(total_tokens: int, rank: int) -> StageProgress:
    """The extract progress (:class:`specdraft.core.progress.StageProgress`, rank 0 only):
    ``total_tokens`` real tokens to capture (the rows' unpadded lengths), counted as each
    batch's real tokens are captured; :func:`~specdraft.extract.writer.progress_fields` gives
    its postfix."""
    return StageProgress("extract", total=total_tokens, unit="tokens", enabled=rank == 0)


def _extract_rank(model: Any, ds: Any, config: ExtractConfig, out: Path, ctx: ExtractPlan,
                  rank: int) -> dict[str, Any]:
    """Capture this rank's batches and write its shards; return its throughput stats."""
    codec, keys, seq_lens = ctx.codec, ctx.keys, ctx.seq_lens
    batches, shards = ctx.batches, ctx.shards
    done = recover(out, rank, shards, codec)
    done_rows = {r for s in done for r in shards[s]}
    todo = [b for b in batches if any(r not in done_rows for r in b.rows)]
    writer = RankWriter(out, rank, shards, done, keys, codec, ctx.metadata,
                        zstd_level=config.zstd_level)
    bar = extract_progress(sum(seq_lens[r] for b in todo for r in b.rows), rank).start()
    t0, tokens, samples = time.monotonic(), 0, 0
    try:
        for batch in todo:
            ids, masks = _load_rows(ds, batch.rows, keys, seq_lens)
            packed = capture_packed(model, pad_rows(ids, masks), ctx.aux_ids, codec)
            writer.submit(batch.rows, ids, masks, packed)
            tokens += sum(packed.lengths)
            samples += len(batch.rows)
            bar.update(sum(packed.lengths), **progress_fields(samples, writer))
    except BaseException:
        writer.close(strict=False)
        bar.close(final=False)
        raise
    writer.close()
    bar.update(0, emit=False, **progress_fields(samples, writer))  # the last shards, on disk
    bar.close()
    elapsed = time.monotonic() - t0
    return {"rank": rank, "samples": samples, "tokens": tokens, "seconds": round(elapsed, 3),
            "tokens_per_s": round(tokens / elapsed, 1) if elapsed > 0 else None,
            "shards_written": writer.shards_written, "shards_resumed": len(done)}


def _extract_rank_rows(ds: Any, config: ExtractConfig, out: Path, ctx: ExtractPlan,
                       rank: int, capture: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """:func:`_extract_rank` for a backend that takes this rank's rows at once (an engine, the
    servers): the same plan, recovery, writer and stats. ``capture(rows, ids, masks, writer,
    progress)`` submits every row to the writer, counts each row's real tokens on ``progress``
    and returns its own figures (merged into the stats)."""
    codec, keys, seq_lens, shards = ctx.codec, ctx.keys, ctx.seq_lens, ctx.shards
    done = recover(out, rank, shards, codec)
    done_rows = {r for s in done for r in shards[s]}
    rows = [r for b in ctx.batches for r in b.rows if r not in done_rows]
    writer = RankWriter(out, rank, shards, done, keys, codec, ctx.metadata,
                        zstd_level=config.zstd_level)
    t0, figures = time.monotonic(), {}
    bar = extract_progress(sum(seq_lens[r] for r in rows), rank).start()
    try:
        if rows:
            ids, masks = _load_rows(ds, rows, keys, seq_lens)
            figures = capture(rows, ids, masks, writer, bar)
    except BaseException:
        writer.close(strict=False)
        bar.close(final=False)
        raise
    writer.close()
    bar.update(0, emit=False, **progress_fields(len(rows), writer))
    bar.close()
    elapsed = time.monotonic() - t0
    tokens = sum(seq_lens[r] for r in rows)
    return {"rank": rank, "samples": len(rows), "tokens": tokens, "seconds": round(elapsed, 3),
            "tokens_per_s": round(tokens / elapsed, 1) if elapsed > 0 else None,
            "shards_written": writer.shards_written, "shards_resumed": len(done), **figures}


def _extract_rank_vllm(verifier: Any, ds: Any, config: ExtractConfig, out: Path,
                       ctx: ExtractPlan, rank: int, world: int) -> dict[str, Any]:
    """:func:`_extract_rank` with a vLLM engine (:func:`_extract_rank_rows`)."""
    from specdraft.extract.vllm_backend import extract_rows

    return _extract_rank_rows(ds, config, out, ctx, rank, lambda rows, ids, masks, writer, bar:
                              extract_rows(verifier, config, out, ctx, rank, world, rows, ids,
                                           masks, writer, progress=bar))


def _open_servers(config: ExtractConfig, verifier: Any, ds: Any, ctx: ExtractPlan, out: Path,
                  rank: int) -> tuple:
    """``--endpoint``: the servers, checked and probed before any row is captured
    (:func:`specdraft.extract.endpoint.open_servers`) with the dataset's shortest row, or on
    ``--resume`` with a row this rank stored (compared with what was stored)."""
    from specdraft.extract.endpoint import open_servers, stored_row

    row = min(range(len(ctx.seq_lens)), key=ctx.seq_lens.__getitem__)
    ids, _ = _load_rows(ds, [row], ctx.keys, ctx.seq_lens)
    stored = stored_row(out, rank, ctx.codec, len(ctx.aux_ids), ctx.hidden) \
        if config.resume else None
    return open_servers(config, verifier, ctx.aux_ids, (ctx.keys[row], row, ids[0]),
                        rank=rank, codec=ctx.codec, stored=stored)


def _extract_rank_live(live: tuple, verifier: Any, ds: Any, config: ExtractConfig, out: Path,
                       ctx: ExtractPlan, rank: int) -> dict[str, Any]:
    """:func:`_extract_rank` through running servers (:func:`_extract_rank_rows`,
    :func:`specdraft.extract.endpoint.extract_rows_live`)."""
    from specdraft.extract.endpoint import extract_rows_live

    return _extract_rank_rows(ds, config, out, ctx, rank, lambda rows, ids, masks, writer, bar:
                              extract_rows_live(live[0], verifier, config, ctx, rows, ids,
                                                masks, writer, rank=rank, progress=bar))


# ---------------------------------------------------------------- rank 0: merge, head, verify


def _merge_index(out: Path, world: int, n_rows: int) -> list[dict[str, Any]]:
    """Merge the ranks' index parts into ``index.jsonl`` in dataset order; check coverage."""
    entries = [e for r in range(world) for _, e in iter_jsonl(part_path(out, r))]
    entries.sort(key=lambda e: e["row"])
    if [e["row"] for e in entries] != list(range(n_rows)):
        raise StageDirError(f"{out}: the index parts do not cover rows 0..{n_rows - 1} exactly "
                            f"once; rerun with --resume")
    atomic_write_text(out / INDEX_FILE, "".join(json.dumps(e) + "\n" for e in entries))
    return entries


def _write_head(model: Any, out: Path) -> dict[str, Any]:
    """Save the verifier's ``lm_head.weight`` and ``embed_tokens.weight`` ``[V, H]``."""
    from specdraft.core.atomic import atomic_save_safetensors

    head = getattr(model, "head", None) or {
        "lm_head.weight": model.get_output_embeddings().weight,
        "embed_tokens.weight": model.get_input_embeddings().weight}
    head = {k: v.detach().to("cpu").clone().contiguous() for k, v in head.items()}
    atomic_save_safetensors(head, out / HEAD_FILE)
    return {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in head.items()}


_REL_TOL = {torch.float32: 0.0, torch.bfloat16: 2**-7, torch.float8_e4m3fn: 2**-3}


def _compare(stored: torch.Tensor, ref: torch.Tensor, rel: float, floor: float
             ) -> tuple[float, float]:
    """``(max |stored - ref|, max err / bound)``; bound = rel·|ref| + floor·max|ref|."""
    if ref.numel() == 0:
        return 0.0, 0.0
    err = (stored - ref).abs()
    bound = rel * ref.abs() + floor * ref.abs().max().clamp_min(1e-30)
    return float(err.max()), float((err / bound).max())


def verify(model: Any, ds: Any, out: Path, aux_ids: Sequence[int], n: int, seed: int
           ) -> dict[str, Any]:
    """Recompute ``n`` random rows one at a time (no padding) and compare with what is stored.

    Each element must satisfy ``|stored - ref| <= rel·|ref| + floor·max|ref|`` where ``rel`` is
    one unit in the last place of the storage dtype (bf16 2^-7, fp8 2^-3, fp32 0) and ``floor``
    the model's numeric noise between batch shapes (1e-4 for an fp32 verifier, 2e-2 for bf16).
    Returns the max abs differences, the max error/bound ratio and ``ok``.
    """
    storage = json.loads((out / PLAN_FILE).read_text(encoding="utf-8"))["storage"]
    source = DiskSource.from_index(out, aux_ids, int(model.config.hidden_size), storage)
    codec = source.codec
    rows = sorted(random.Random(seed).sample(range(len(source)), min(n, len(source))))
    raw = CODECS["fp32"]
    floor = 1e-4 if model.dtype == torch.float32 else 2e-2
    worst = {"aux_max_abs_diff": 0.0, "final_max_abs_diff": 0.0, "max_err_over_bound": 0.0}
    for row, stored in zip(rows, source.get_batch(rows)):
        padded = pad_rows([stored.input_ids.tolist()], [stored.loss_mask.tolist()])
        ref = capture_packed(model, padded, aux_ids, raw)
        for name, s, r in (("aux", stored.aux_hidden, ref.aux[0]),
                           ("final", stored.final_hidden, ref.final[0])):
            diff, ratio = _compare(s, r.float().cpu(), _REL_TOL[codec.dtype], floor)
            worst[f"{name}_max_abs_diff"] = max(worst[f"{name}_max_abs_diff"], diff)
            worst["max_err_over_bound"] = max(worst["max_err_over_bound"], ratio)
    return {"rows": rows, "n": len(rows), **worst, "ok": worst["max_err_over_bound"] <= 1.0}


# ---------------------------------------------------------------- entry point


def run(config: ExtractConfig, ctx: StageContext | None = None, *,
        verifier: Any = None) -> ExtractManifest:
    """Run the extract stage; return its manifest (typed, on every rank).

    ``ctx``: this process, from a caller that started the process group itself (else
    :func:`specdraft.core.context.stage_context` reads torchrun's environment and starts it).

    ``verifier``: an already-loaded HF causal LM (so that ``specdraft run`` loads it once);
    otherwise ``config.verifier`` is loaded with :func:`specdraft.core.verifier.load_verifier`.
    Raises :class:`StageDirError` (prepare missing, output present without --resume/--overwrite,
    disk too small, resume with changed settings), :class:`InputError` (bad dataset row) and
    :class:`ConfigError` (aux ids outside ``[1, N]``).
    """
    if ctx is not None:
        return _run(config, verifier, ctx)
    # the vLLM backend's ranks exchange small objects only: gloo, whatever the device
    backend = "gloo" if config.backend == "vllm" or config.endpoint else None
    with stage_context(config.device, backend=backend) as stage:
        return _run(config, verifier, stage)


def _load_model(config: ExtractConfig, verifier: Any, out: Path, device: str) -> Any:
    """The HF verifier (transformers backend) or its config, head and norm (vLLM backend; an
    HF model passed by ``specdraft run`` is then not used)."""
    if config.backend == "vllm" or config.endpoint:
        from specdraft.extract import vllm_backend as vb

        if config.verify:
            raise ConfigError("--verify needs --backend transformers (the vLLM and --endpoint "
                              "backends are checked against it by tests/extract/"
                              "test_vllm_equivalence.py and tests/engine/test_live_capture.py)")
        return vb.load_engine_verifier(vb.verifier_hf_dir(config), vb.engine_dtype(config))
    if verifier is not None:
        return verifier
    from specdraft.core.verifier import load_verifier

    return load_verifier(config.verifier, dtype=config.dtype, device=device,
                         device_map=config.device_map,
                         trust_remote_code=config.trust_remote_code)


def _shape(model: Any) -> tuple[int, int]:
    """``(N layers, hidden size)`` of an HF verifier or an engine-served one."""
    if hasattr(model, "n_layers"):
        return model.n_layers, model.hidden_size
    return num_layers(model), int(model.config.hidden_size)


@dataclass
class ExtractPlan:
    """Everything the ranks share: the aux ids (HF convention) and the verifier's layer count
    and hidden size, its profile, the storage codec, the row keys and lengths (tokens,
    supervised positions), this rank's batches and shards, the estimated bytes, the shard
    metadata; ``resume_changes`` and ``identity`` are filled once the stage has checked them."""

    aux_ids: list[int]
    n_layers: int
    hidden: int
    codec: Codec
    profile: VerifierProfile
    keys: list[str]
    seq_lens: list[int]
    n_sup: list[int]
    batches: list[Any]
    shards: Any
    estimate: int
    metadata: dict[str, str]
    resume_changes: dict[str, list[Any]] = field(default_factory=dict)
    identity: dict[str, Any] | None = None
    servers: dict[str, Any] | None = None


def _context(config: ExtractConfig, model: Any, ds: Any, rank: int, world: int
             ) -> ExtractPlan:
    """Everything the ranks share (:class:`ExtractPlan`)."""
    n_layers, hidden = _shape(model)
    profile = verifier_profile(config, model)  # refuses a config it does not understand, first
    aux_ids = (check_aux_ids(config.aux_layers, n_layers) if config.aux_layers
               else default_aux_ids(n_layers))
    keys, seq_lens = _row_table(ds)
    n_sup = _n_sup(ds)
    codec: Codec = CODECS[config.storage]
    batches, shards = _plan(config, seq_lens, n_sup, len(aux_ids), hidden, rank, world)
    estimate = sum(row_bytes(t, s, len(aux_ids), hidden, codec) for t, s in zip(seq_lens, n_sup))
    metadata = {"format": codec.name, "aux_layer_ids": ",".join(map(str, aux_ids)),
                "hidden_size": str(hidden), "convention": CONVENTION}
    return ExtractPlan(aux_ids=aux_ids, n_layers=n_layers, hidden=hidden, codec=codec,
                       profile=profile, keys=keys, seq_lens=seq_lens, n_sup=n_sup,
                       batches=batches, shards=shards, estimate=estimate, metadata=metadata)


def _run(config: ExtractConfig, verifier: Any, stage: StageContext) -> dict[str, Any]:
    rank, world = stage.rank, stage.world_size
    clock = StageClock()
    require_stage(config.run_dir, "prepare")
    out = RunLayout(config.run_dir).extract

    def open_and_compare() -> dict[str, list[Any]]:
        open_stage_dir(config.run_dir, STAGE, resume=config.resume, overwrite=config.overwrite)
        return record_settings(out, config, stage=STAGE, resume=config.resume)

    # refused now if it would be; RUN/extract is emptied (--overwrite) only once the verifier's
    # binding, its layers and the aux ids have passed, so a refused command deletes nothing
    _on_rank0(lambda: check_stage_dir(config.run_dir, STAGE, resume=config.resume,
                                      overwrite=config.overwrite), rank, world)
    ds = _load_dataset(config.run_dir)
    if config.backend == "vllm" or config.endpoint:  # a GGUF is converted once, by rank 0
        from specdraft.extract.vllm_backend import verifier_hf_dir
        _on_rank0(lambda: verifier_hf_dir(config), rank, world)
        _barrier(world)
    # the config checks above are cheaper still; the model is loaded only for the run's verifier
    _on_rank0(lambda: bind_model_stage(config.run_dir, STAGE, config.verifier,
                                       trust_remote_code=config.trust_remote_code,
                                       in_memory=verifier is not None), rank, world)
    model = _load_model(config, verifier, out, str(stage.device))
    ctx = _context(config, model, ds, rank, world)
    ctx.resume_changes = _on_rank0(open_and_compare, rank, world) or {}
    live = _open_servers(config, model, ds, ctx, out, rank) if config.endpoint else None
    model = live[2] if live else model  # in the servers' dtype
    in_memory = verifier is not None
    ctx.identity = _on_rank0(lambda: verifier_identity(config, in_memory=in_memory), rank,
                                world)
    plan = {"world_size": world, "batch_tokens": config.batch_tokens, "storage": config.storage,
            "shard_mb": config.shard_mb, "aux_layer_ids": list(ctx.aux_ids),
            "prepare": input_hash(RunLayout(config.run_dir).prepare),
            "zstd_level": config.zstd_level, "model_dtype": str(model.dtype),
            "backend": "endpoint" if config.endpoint else config.backend}

    def prologue() -> None:
        (out / "shards").mkdir(exist_ok=True)
        _check_plan(out, plan, config.resume)
        _check_disk(out, ctx.estimate)

    _on_rank0(prologue, rank, world)
    if live:
        stats = _extract_rank_live(live, model, ds, config, out, ctx, rank)
    elif config.backend == "vllm":
        stats = _extract_rank_vllm(model, ds, config, out, ctx, rank, world)
    else:
        stats = _extract_rank(model, ds, config, out, ctx, rank)
    atomic_write_json(out / f"stats.rank{rank:05d}.json", stats)
    _barrier(world)
    ctx.servers = live[1] if live else None
    _on_rank0(lambda: _finish(config, model, ds, out, ctx, clock, world), rank, world)
    _barrier(world)
    return load_stage_manifest(out)


def _profile(config: ExtractConfig, model: Any, head: dict[str, Any],
             servers: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest's verifier record: what ran it and how its final state was normalised."""
    if config.endpoint:
        from specdraft.extract.vllm_backend import FINAL_STATE

        return {"path": config.verifier, "class": model.architecture, "dtype": str(model.dtype),
                "head": head, "backend": "endpoint", "hf_dir": str(model.hf_dir),
                "final_state": FINAL_STATE, "endpoint": servers}
    if config.backend == "vllm":
        from specdraft.extract.vllm_backend import FINAL_STATE

        return {"path": config.verifier, "class": model.architecture, "dtype": str(model.dtype),
                "head": head, "backend": "vllm", "hf_dir": str(model.hf_dir),
                "final_state": FINAL_STATE,
                "engine": {"tensor_parallel_size": config.tensor_parallel_size,
                           "pipeline_parallel_size": config.pipeline_parallel_size,
                           "engine_args": dict(config.engine_args)}}
    return {"path": config.verifier, "class": type(model).__name__, "dtype": str(model.dtype),
            "head": head, "backend": "transformers",
            "final_state": "post_norm (the verifier's own last_hidden_state)"}


def verifier_profile(config: ExtractConfig, model: Any) -> VerifierProfile:
    """The verifier's profile (:mod:`specdraft.core.profile`): from the loaded HF model and its
    config (transformers backend), or from the engine's HF directory's config (vLLM backend,
    whose stored final state is the engine's pre-norm state normalised here). Raises
    :class:`ConfigError` naming a config field specdraft does not understand."""
    if hasattr(model, "hf_dir"):  # an EngineVerifier: the weights stay with the engine
        from specdraft.core.profile import load_hf_config

        return resolve_profile(load_hf_config(model.hf_dir,
                                              trust_remote_code=config.trust_remote_code),
                               backend="vllm")  # an engine's pre-norm id N, normalised here
    return resolve_profile(model.config, model=model, backend=config.backend)


def verifier_identity(config: ExtractConfig, *, in_memory: bool) -> dict[str, Any] | None:
    """The verifier's identity record (:func:`specdraft.core.verifier_identity.identify`: config
    hash, quantization, weight fingerprint of ``--verifier-fingerprint``'s scheme, tokenizer and
    template hashes), read from ``--verifier``'s files without loading the weights, for either
    backend. None (said on
    stderr) only when the model was handed over in memory and ``--verifier`` names no files."""
    from specdraft.core.verifier_identity import identify

    try:
        return identify(config.verifier, trust_remote_code=config.trust_remote_code,
                        scheme=config.verifier_fingerprint)
    except ConfigError as err:
        if not in_memory:
            raise
        print(f"extract: verifier identity not recorded ({err})", file=sys.stderr)
        return None


def _finish(config: ExtractConfig, model: Any, ds: Any, out: Path, ctx: ExtractPlan,
            clock: StageClock, world: int) -> dict[str, Any]:
    """Rank 0: merge the index, write the verifier head, verify, write the manifest."""
    entries = _merge_index(out, world, len(ctx.keys))
    head = _write_head(model, out)
    checked = verify(model, ds, out, ctx.aux_ids, config.verify, config.seed) \
        if config.verify else None
    if checked is not None and not checked["ok"]:
        print(f"extract: --verify found differences beyond tolerance: {checked}",
              file=sys.stderr)
    stats = [json.loads((out / f"stats.rank{r:05d}.json").read_text()) for r in range(world)]
    tokens = sum(e["seq_len"] for e in entries)
    n_sup = sum(e["n_sup"] for e in entries)
    total = sum(f.stat().st_size for f in (out / "shards").glob("*.safetensors"))
    H, V = ctx.hidden, head["lm_head.weight"]["shape"][0]
    extra = {
        "convention": CONVENTION, "aux_layer_ids": list(ctx.aux_ids),
        "n_layers": ctx.n_layers, "hidden_size": H, "vocab_size": V,
        "final_hidden": "output of the verifier's final norm (HF last_hidden_state = "
                        "hidden_states[N]); lm_head(final_hidden) = logits",
        "target_representation": TARGET_DOC,
        "verifier": _profile(config, model, head, ctx.servers),
        "profile": ctx.profile.to_dict(),
        "verifier_identity": ctx.identity,
        "storage": {"format": config.storage, "shard_mb": config.shard_mb,
                    "zstd_level": config.zstd_level if CODECS[config.storage].zstd else None,
                    "shards": len({e["shard"] for e in entries}), "bytes_total": total,
                    "estimated_bytes": ctx.estimate,
                    "bytes_per_token": round(total / max(tokens, 1), 2),
                    "bytes_per_token_over_8H": round(total / max(tokens, 1) / (8 * H), 4)},
        "world_size": world, "throughput": stats, "verify": checked,
        "resume_changes": ctx.resume_changes,
        "files": {"index": INDEX_FILE, "head": HEAD_FILE, "shards": "shards/"},
    }
    counts = {"rows_in": len(ctx.keys), "rows_out": len(entries), "tokens": tokens,
              "supervised_tokens": n_sup,
              "rows_without_targets": sum(1 for e in entries if e["n_sup"] == 0),
              "rejected": {}}
    return write_manifest(out, stage=STAGE, config=config, clock=clock,
                          inputs={"prepare": input_hash(RunLayout(config.run_dir).prepare)},
                          counts=counts, extra=extra)
