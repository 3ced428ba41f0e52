"""The vLLM side of ``specdraft extract --backend vllm``: feed prepared rows to an engine.

Run as ``ENGINE_PYTHON -m specdraft.extract.vllm_worker JOB_DIR`` by
:mod:`specdraft.extract.vllm_backend`, in the vLLM venv (its own transformers), under the one
worker import policy (:mod:`specdraft.engines.worker`), so this module imports only stdlib,
torch, safetensors, vllm and :mod:`specdraft.engines.vllm_cpu` (what vLLM's CPU build needs
told).

``JOB_DIR/job.json`` holds the engine settings and the row keys; ``JOB_DIR/rows.safetensors``
the token ids (``ids`` int32 ``[ΣT]``, ``offsets`` int64 ``[n+1]``, ``rows`` int64 ``[n]`` =
dataset row numbers). Every row becomes one request with ``request_id`` = its row key, its token
ids as the prompt and ``max_tokens=1``; its hidden states are written by
:class:`specdraft.extract.vllm_connector.SpecdraftHiddenStatesConnector` to
``SPOOL/row{r:09d}.safetensors`` (path given per request, so identity, never arrival order,
decides which row a file belongs to). The engine uses vLLM 0.32's ``extract_hidden_states``
speculative method (``vllm/v1/spec_decode/extract_hidden_states.py``): one forward per request,
no drafting. Exit status 0 once every row's file exists; the engine's own error otherwise.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from specdraft.engines.capture import CONNECTOR, CONNECTOR_MODULE, kv_transfer_config, \
    speculative_config
from specdraft.engines.vllm_cpu import attention_kwargs

__all__ = ["CONNECTOR", "CONNECTOR_MODULE", "engine_kwargs", "spool_path", "done_path"]


def spool_path(spool: str | os.PathLike, row: int) -> Path:
    """Where the connector writes dataset row ``row``'s hidden states."""
    return Path(spool) / f"row{row:09d}.safetensors"


def done_path(spool: str | os.PathLike, row: int) -> Path:
    """The empty marker the parent leaves once it has taken (and deleted) a row's file."""
    return Path(spool) / f"row{row:09d}.done"


def _written(path: Path) -> bool:
    return path.exists() or path.with_suffix(".done").exists()


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the specdraft parent dies (kill -9 leaves no engine)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def engine_kwargs(job: dict[str, Any]) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments: extraction method, our connector, parallelism, overrides.

    ``job["engine_ids"]``: vLLM layer ids to capture (ascending; id k = HF ``hidden_states[k]``
    for k < N, id N = the last layer's output before the final norm). ``job["engine_args"]``
    override or extend everything else (e.g. ``{"max_num_seqs": 64}``).
    """
    kwargs = {
        "model": job["model"], "dtype": job["dtype"], "seed": 0, "enforce_eager": True,
        "skip_tokenizer_init": True, "max_model_len": job["max_model_len"],
        "tensor_parallel_size": job["tensor_parallel_size"],
        "pipeline_parallel_size": job["pipeline_parallel_size"],
        "enable_prefix_caching": False,
        "speculative_config": speculative_config(job["engine_ids"]),
        "kv_transfer_config": kv_transfer_config(job["spool"]),
    }
    kwargs.update(attention_kwargs(job["dtype"]))  # an MLA verifier in float32 on an AMX CPU
    kwargs.update(job.get("engine_args") or {})
    return kwargs


def _load_rows(job_dir: Path) -> tuple[list[int], list[list[int]]]:
    from safetensors.torch import load_file

    t = load_file(str(job_dir / "rows.safetensors"))
    ids, off = t["ids"].tolist(), t["offsets"].tolist()
    return t["rows"].tolist(), [ids[off[i]:off[i + 1]] for i in range(len(off) - 1)]


def _order(n: int, order: str) -> list[int]:
    """Submission order: ``plan`` (as given) or ``reverse`` (tests: identity, not order)."""
    return list(range(n))[::-1] if order == "reverse" else list(range(n))


def run_engine(job_dir: Path) -> None:
    """Feed every row of the job to one engine and wait until all its files exist."""
    from vllm import LLM, SamplingParams

    job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
    rows, ids = _load_rows(job_dir)
    keys = job["keys"]
    t0 = time.monotonic()
    llm = LLM(**engine_kwargs(job))
    engine = llm.llm_engine
    t1 = time.monotonic()
    todo = _order(len(rows), job.get("order", "plan"))
    print(f"specdraft-worker: {len(todo)} requests, submission order "
          f"{[keys[i] for i in todo[:3]]}...", flush=True)
    in_flight, limit = 0, int(job.get("max_in_flight", 256))
    expected = [spool_path(job["spool"], r) for r in rows]
    while todo or in_flight:
        while todo and in_flight < limit:
            i = todo.pop(0)
            params = SamplingParams(max_tokens=1, detokenize=False, extra_args={
                "kv_transfer_params": {"hidden_states_path": str(expected[i])}})
            engine.add_request(keys[i], {"prompt_token_ids": ids[i]}, params)
            in_flight += 1
        for out in engine.step():
            if out.finished:
                in_flight -= 1
    _wait_for_files(engine, expected, float(job.get("flush_timeout_s", 120)))
    tokens, seconds = sum(len(r) for r in ids), time.monotonic() - t1
    print(f"specdraft-worker: engine start {t1 - t0:.1f} s; {len(rows)} rows, {tokens} tokens "
          f"in {seconds:.2f} s", flush=True)
    stats = {"engine_init_s": round(t1 - t0, 3), "engine_seconds": round(seconds, 3),
             "engine_tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None}
    (job_dir / "engine_stats.json").write_text(json.dumps(stats), encoding="utf-8")


def _wait_for_files(engine: Any, expected: list[Path], timeout_s: float) -> None:
    """Step the engine until the connector wrote every file (writes follow request finish)."""
    deadline = time.monotonic() + timeout_s
    missing = [p for p in expected if not _written(p)]
    while missing:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the engine finished but wrote no hidden states for "
                               f"{len(missing)} rows (first {missing[0].name})")
        engine.step()
        time.sleep(0.01)
        missing = [p for p in missing if not _written(p)]


def main() -> None:
    _die_with_parent()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    run_engine(Path(sys.argv[1]))
    sys.stdout.flush()
    os._exit(0)  # every file is fsynced and renamed: skip the engine's slow teardown


if __name__ == "__main__":
    main()
