"""``specdraft extract --backend vllm``: the verifier runs in a vLLM engine, in a subprocess.

vLLM lives in its own venv (its own transformers), so the engine runs in
``ENGINE_PYTHON -m specdraft.extract.vllm_worker`` (:mod:`.vllm_worker`, which imports only
stdlib, torch, safetensors and vllm). This process (the specdraft venv) never loads the
verifier's weights: it reads the verifier's config, its ``lm_head`` / ``embed_tokens`` (for the
head file) and its final norm weight, hands the rows to the engine, and turns the engine's
per-request files into the very shards, index and manifest of the transformers backend
(:class:`specdraft.extract.writer.RankWriter`, same codecs), so later stages cannot tell.

Conventions (vLLM 0.32; tested in ``tests/extract/test_vllm_equivalence.py``): vLLM layer id
``k`` = HF ``hidden_states[k]`` for ``k < N``; id ``N`` is the last decoder layer's output
*before* the final norm (``vllm/model_executor/models/llama.py`` appends it before
``self.norm``). specdraft's aux id ``N`` and the final hidden state are defined after the final
norm, so :func:`final_norm` (the verifier's own RMSNorm weight, eps and gain convention,
:func:`specdraft.core.profile.norm_gain`: ``(1 + w)`` for Gemma) is applied here, exactly once, to
the engine's id-``N`` state.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from specdraft.core.aux_ids import extraction_capture_ids
from specdraft.core.conventions import supervised_mask
from specdraft.core.errors import ConfigError, InputError
from specdraft.core.profile import NormGain, config_json, norm_gain
from specdraft.core.context import context_from_env
from specdraft.core.verifier import resolve_device, resolve_dtype
from specdraft.engines.launcher import failure_message, launch
from specdraft.engines.process import EngineError
from specdraft.engines.python import vllm_python
from specdraft.engines.worker import worker_command, worker_env
from specdraft.extract.writer import progress_fields
from specdraft.core.capture import Packed
from specdraft.core.storage import Codec, encode
from specdraft.extract.vllm_worker import done_path, spool_path

FINAL_STATE = ("post_norm (applied by specdraft to the engine's pre-norm state, with the "
               "verifier's norm gain convention: vLLM layer id N is the last layer's output "
               "before the final norm)")
#: The worker module and the name every engine error starts with.
WORKER = "specdraft.extract.vllm_worker"
ENGINE = "the vLLM engine"
#: The setting that bounds a stall (:class:`specdraft.extract.config.ExtractConfig`).
NO_PROGRESS_FLAG = "--engine-no-progress-s"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---------------------------------------------------------------- the verifier, without weights


@dataclass
class EngineVerifier:
    """What this process needs of a verifier served by vLLM (its weights stay on disk).

    ``head``: ``lm_head.weight`` and ``embed_tokens.weight`` ``[V, H]`` in ``dtype``;
    ``norm_weight`` ``[H]``, ``eps`` and ``norm_gain`` (``"w"`` or ``"1+w"``): the final RMSNorm;
    ``hf_dir``: what the engine loads.
    """

    hf_dir: Path
    n_layers: int
    hidden_size: int
    dtype: torch.dtype
    architecture: str
    head: dict[str, torch.Tensor]
    norm_weight: torch.Tensor
    eps: float
    norm_gain: NormGain = "w"


def _tensor_files(hf_dir: Path) -> list[Path]:
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"--verifier {hf_dir}: no *.safetensors weights (vLLM backend)")
    return files


def _read_tensors(hf_dir: Path, wanted: dict[str, str]) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` for each ``name: key suffix`` in ``wanted`` (unique match per file
    set, e.g. ``model.norm.weight``), read lazily with ``safe_open`` (no full load)."""
    from safetensors import safe_open

    found: dict[str, torch.Tensor] = {}
    for path in _tensor_files(hf_dir):
        with safe_open(str(path), framework="pt") as f:
            for name, suffix in wanted.items():
                keys = [k for k in f.keys() if k == suffix or k.endswith("." + suffix)]
                if len(keys) > 1:
                    raise ConfigError(f"--verifier {hf_dir}: several tensors end in {suffix}: "
                                      f"{keys[:3]}")
                if keys and name not in found:
                    found[name] = f.get_tensor(keys[0])
    return found


def load_engine_verifier(hf_dir: Path, dtype: torch.dtype) -> EngineVerifier:
    """Read the verifier's config, head and final norm from an HF directory.

    The final norm's gain convention comes from ``model_type``
    (:func:`specdraft.core.profile.norm_gain`). Raises :class:`ConfigError` for a ``model_type``
    whose convention is unknown or whose head/norm tensors are missing.
    """
    config = config_json(hf_dir)
    if config is None:
        raise ConfigError(f"--verifier {hf_dir}: no config.json (vLLM backend)")
    model_type = str(config.get("model_type", ""))
    gain = norm_gain(model_type)
    t = _read_tensors(hf_dir, {"embed": "embed_tokens.weight", "lm_head": "lm_head.weight",
                               "norm": "model.norm.weight"})
    if "lm_head" not in t and config.get("tie_word_embeddings", False):
        t["lm_head"] = t.get("embed")
    missing = [k for k in ("embed", "lm_head", "norm") if t.get(k) is None]
    if missing:
        raise ConfigError(f"--verifier {hf_dir}: tensors {missing} not found")
    head = {"lm_head.weight": t["lm_head"].to(dtype).contiguous(),
            "embed_tokens.weight": t["embed"].to(dtype).contiguous()}
    return EngineVerifier(hf_dir=hf_dir, n_layers=int(config["num_hidden_layers"]),
                          hidden_size=int(config["hidden_size"]), dtype=dtype,
                          architecture=(config.get("architectures") or [model_type])[0],
                          head=head, norm_weight=t["norm"].to(dtype),
                          eps=float(config.get("rms_norm_eps", 1e-6)), norm_gain=gain)


def engine_dtype(config: Any) -> torch.dtype:
    """``--dtype`` as a torch dtype; ``auto`` by :func:`specdraft.core.verifier.resolve_dtype` on
    ``--device`` (``auto``: CUDA when this machine has it)."""
    return _DTYPES[resolve_dtype(config.dtype, resolve_device(getattr(config, "device", None)))]


def verifier_hf_dir(config: Any) -> Path:
    """The HF directory vLLM loads: ``--verifier`` itself, or a GGUF converted once under
    ``RUN/verifier-hf`` (:func:`specdraft.engines.verifier_dir.engine_hf_dir`, shared with
    eval)."""
    from specdraft.engines.verifier_dir import engine_hf_dir

    return engine_hf_dir(config.verifier, config.run_dir)


def final_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gain: NormGain = "w"
               ) -> torch.Tensor:
    """The verifier's final RMSNorm on ``x`` ``[..., H]``: ``g * (x / sqrt(mean(x²) + eps))``
    with ``g = w`` (``gain="w"``) or ``g = 1 + w`` (``"1+w"``, Gemma: the checkpoint stores the
    gain as an offset from 1).

    In the rounding order of the HF verifier, so that fp32 and bf16 results match it: ``"w"`` as
    transformers' ``LlamaRMSNorm`` (normalise in fp32, cast to ``x``'s dtype, then multiply by
    the weight); ``"1+w"`` as ``Gemma3RMSNorm`` (multiply by ``1 + w`` in fp32, then cast).
    Raises :class:`ConfigError` for another ``gain``.
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if gain == "w":
        return weight.to(x.dtype) * xf.to(x.dtype)
    if gain == "1+w":
        return (xf * (1.0 + weight.float())).to(x.dtype)
    raise ConfigError(f"final norm gain {gain!r}: expected 'w' or '1+w'")


# ---------------------------------------------------------------- engine ids and conversion


def to_packed(hidden: torch.Tensor, loss_mask: Sequence[int], aux_ids: Sequence[int],
              ids: Sequence[int], verifier: EngineVerifier, codec: Codec) -> Packed:
    """One row's engine states ``hidden`` ``[T, len(ids), H]`` (ids ascending) → :class:`Packed`
    exactly as :func:`specdraft.core.capture.capture_packed` makes it for the same row.

    Aux id ``N`` and the final state get :func:`final_norm`; every other id is taken as is.
    """
    N = verifier.n_layers
    col = {k: j for j, k in enumerate(ids)}
    normed = final_norm(hidden[:, col[N]], verifier.norm_weight, verifier.eps,
                        verifier.norm_gain)  # [T, H]
    aux = torch.stack([normed if a == N else hidden[:, col[a]] for a in aux_ids], dim=1)
    mask = torch.as_tensor(list(loss_mask), dtype=torch.uint8)
    sup = supervised_mask(mask)  # [T]
    return Packed(lengths=[int(hidden.shape[0])], n_sup=[int(sup.sum())],
                  aux=encode(aux, codec), final=encode(normed[sup][:, None, :], codec))


def read_row(path: Path, key: str, input_ids: Sequence[int]) -> torch.Tensor:
    """The engine's file for a row: its ``hidden_states`` ``[T, n_ids, H]``, after checking that
    the engine saw exactly the prepared token ids. Raises :class:`InputError` naming the row."""
    from safetensors.torch import load_file

    t = load_file(str(path))
    seen = t["token_ids"].tolist()
    if seen != list(input_ids):
        first = next((i for i, (a, b) in enumerate(zip(seen, input_ids)) if a != b),
                     min(len(seen), len(input_ids)))
        raise InputError(f"row {key}: the engine saw {len(seen)} token ids, the prepared row "
                         f"has {len(input_ids)}; first difference at position {first}")
    if t["hidden_states"].shape[0] != len(seen):
        raise EngineError(f"row {key}: engine wrote {t['hidden_states'].shape[0]} states for "
                          f"{len(seen)} tokens")
    return t["hidden_states"]


# ---------------------------------------------------------------- the engine subprocess


def replica_devices(local_rank: int, per_replica: int, visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` of engine replica ``local_rank`` (``per_replica`` = TP·PP GPUs):
    the ``local_rank``-th block of the visible devices (``visible`` or ``0..``)."""
    devices = visible.split(",") if visible else [str(i) for i in range(
        (local_rank + 1) * per_replica)]
    block = devices[local_rank * per_replica:(local_rank + 1) * per_replica]
    if len(block) < per_replica:
        raise ConfigError(f"engine replica {local_rank} needs {per_replica} GPUs "
                          f"(--tensor-parallel-size x --pipeline-parallel-size) but only "
                          f"{devices} are visible")
    return ",".join(block)


def _write_job(job_dir: Path, config: Any, verifier: EngineVerifier, rows: Sequence[int],
               keys: Sequence[str], ids: Sequence[Sequence[int]], engine_ids: Sequence[int]
               ) -> None:
    from safetensors.torch import save_file

    from specdraft.core.atomic import atomic_write_json

    lengths = torch.tensor([len(r) for r in ids], dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    flat = torch.tensor([t for r in ids for t in r], dtype=torch.int32)
    save_file({"ids": flat, "offsets": offsets, "rows": torch.tensor(list(rows),
                                                                      dtype=torch.int64)},
              str(job_dir / "rows.safetensors"))
    dtype = str(verifier.dtype).removeprefix("torch.")
    atomic_write_json(job_dir / "job.json", {
        "model": str(verifier.hf_dir), "dtype": dtype, "engine_ids": list(engine_ids),
        "spool": str(job_dir / "spool"), "keys": [keys[r] for r in rows],
        "max_model_len": int(lengths.max()) + 1 if len(rows) else 2,
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        "engine_args": dict(config.engine_args),
        "order": os.environ.get("SPECDRAFT_VLLM_ORDER", "plan")})


def _engine_process(job_dir: Path, config: Any, world: int) -> tuple[list[str], dict[str, str]]:
    """The worker's command and environment (:mod:`specdraft.engines.worker`): replica
    ``local_rank``'s block of GPUs under torchrun."""
    env = worker_env(job_dir)
    if world > 1 and torch.cuda.is_available():
        env["CUDA_VISIBLE_DEVICES"] = replica_devices(
            context_from_env().local_rank,
            config.tensor_parallel_size * config.pipeline_parallel_size,
            os.environ.get("CUDA_VISIBLE_DEVICES"))
    return worker_command(vllm_python(config.engine_python), WORKER, str(job_dir)), env


def engine_failure(log: Path, rc: int) -> str:
    """The account of a failed engine (:func:`specdraft.engines.launcher.failure_message`): its
    last exception line, a known cause said first (:data:`KNOWN_ENGINE_ERRORS`), the log's path
    and last lines."""
    return failure_message(ENGINE, f"exited with status {rc}", log, causes=KNOWN_ENGINE_ERRORS)


#: Engine error lines that have a cause a user can act on -> that cause, said first.
KNOWN_ENGINE_ERRORS = {
    # vLLM 0.32 example_hidden_states_connector.py ``_find_cache_kv_group_id``: the capture reads
    # the hidden states out of their own KV-cache group; when the engine merges that group with
    # the verifier's attention layers (a cache layout it cannot isolate), it stops here.
    "Could not uniquely identify the extract-hidden-states KV cache group": (
        "the verifier's KV-cache layout is one vLLM's hidden-state capture cannot read: the "
        "engine did not give the captured states a KV-cache group of their own; extract this "
        "verifier with --backend transformers"),
}


def _ready_rows(spool: Path) -> list[int]:
    """Rows whose file the connector has renamed into place (temp files are skipped)."""
    if not spool.exists():
        return []
    return [int(n[3:12]) for n in os.listdir(spool)
            if n.startswith("row") and n.endswith(".safetensors") and len(n) == 24]


def extract_rows(verifier: EngineVerifier, config: Any, out: Path, ctx: Any,
                 rank: int, world: int, rows: Sequence[int], ids: Sequence[Sequence[int]],
                 masks: Sequence[Sequence[int]], writer: Any, progress: Any = None
                 ) -> dict[str, float]:
    """Run one engine over ``rows`` (plan order) and submit each row's states to ``writer``.

    Files are matched to rows by the row number in their name, never by arrival order; each is
    checked against the prepared token ids (:func:`read_row`), converted (:func:`to_packed`) and
    deleted; rows reach ``writer`` in plan order (held back while an earlier one is missing), so
    the shards are laid out exactly as the transformers backend lays them out. The engine runs
    under the one launcher (:func:`specdraft.engines.launcher.launch`): no row arriving and no
    log line for ``config.engine_no_progress_s`` seconds stops it. ``progress``: the stage's
    :class:`~specdraft.core.progress.StageProgress`, given each row's real tokens as the row
    reaches the writer. Raises :class:`EngineError`
    with the engine's own error (or the stall) and its log's last lines.
    """
    job_dir = out / "vllm" / f"rank{rank:05d}"
    shutil.rmtree(job_dir, ignore_errors=True)
    (job_dir / "spool").mkdir(parents=True)
    engine_ids = extraction_capture_ids(ctx.aux_ids, verifier.n_layers)
    _write_job(job_dir, config, verifier, rows, ctx.keys, ids, engine_ids)
    where = {r: i for i, r in enumerate(rows)}
    held: dict[int, Packed] = {}  # converted rows waiting for an earlier row of the plan
    nxt = 0
    t0, first = time.monotonic(), None
    cmd, env = _engine_process(job_dir, config, world)
    log = job_dir / "engine.log"
    with launch(cmd, log, name=ENGINE, env=env, no_progress_s=config.engine_no_progress_s,
                progress=[lambda: len(where)], timeout_flag=NO_PROGRESS_FLAG,
                causes=KNOWN_ENGINE_ERRORS) as engine:
        while where:
            ready = sorted((r for r in _ready_rows(job_dir / "spool") if r in where),
                           key=where.__getitem__)
            exited = engine.poll() if not ready else None
            for r in ready:
                i = where.pop(r)
                path = spool_path(job_dir / "spool", r)
                hidden = read_row(path, ctx.keys[r], ids[i])
                held[i] = to_packed(hidden, masks[i], ctx.aux_ids, engine_ids, verifier,
                                    ctx.codec)
                done_path(job_dir / "spool", r).touch()
                path.unlink()
                first = first or time.monotonic()
            while nxt in held:  # to the writer in plan order: shard bytes never depend on
                writer.submit([rows[nxt]], [ids[nxt]], [masks[nxt]], held.pop(nxt))  # arrival
                nxt += 1
                if progress is not None:
                    progress.update(len(ids[nxt - 1]), **progress_fields(nxt, writer))
            if exited is not None and where and not _ready_rows(job_dir / "spool"):
                raise (engine.exited_error(exited) if exited else
                       engine.error(f"exited without the states of {len(where)} rows"))
            if not ready:
                engine.check()  # no row and no log line for --engine-no-progress-s: stopped
                time.sleep(0.05)
        rc = engine.wait()
        if rc != 0:
            raise engine.exited_error(rc)
    end = time.monotonic()
    shutil.rmtree(job_dir / "spool", ignore_errors=True)  # engine.log stays, for the record
    (job_dir / "rows.safetensors").unlink(missing_ok=True)
    stats = json.loads((job_dir / "engine_stats.json").read_text(encoding="utf-8"))
    # engine_init_s: building vllm.LLM; engine_seconds / engine_tokens_per_s: from then on
    return {"first_row_s": round((first or end) - t0, 3), **stats}
