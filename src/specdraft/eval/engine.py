"""``specdraft eval --engine vllm``: the real serving engine measures the exported drafter.

vLLM pins its own ``transformers``, so it runs in a subprocess with the engine's python
(:func:`specdraft.engines.python.vllm_python`) and our worker :mod:`specdraft.eval.engine_worker`.
The engine gets the SAME prompt token ids the offline eval renders, the same k, temperature, max
tokens and stop ids; its spec-decode counters are read before/after generation. The figures:

- τ = 1 + accepted / drafts (vLLM's mean acceptance length, bonus counted);
- acceptance rate = accepted / draft tokens;
- position ``i`` rate = accepted at ``i`` / drafts.

At temperature 0 the offline and engine runs are compared (:func:`agreement`): counts side by
side and, per prompt, whether the committed tokens are identical. In float32 on CPU they are
(tests/engine); a τ gap beyond ``engine_tolerance`` raises :class:`EngineDisagreement`.
At temperature > 0 the two sides draw different random numbers, so they are compared by
per-position acceptance rate within a 99% interval from the number of verify steps
(:func:`sampled_agreement`). The engine is told ``--draft-sample-method`` and its run is labelled
with the rule read back from its resolved config, not with ours.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from specdraft.artifacts.dflash_export import speculative_method
from specdraft.core.errors import SpecdraftError
from specdraft.core.verifier import resolve_dtype
from specdraft.engines.verifier_dir import engine_hf_dir
from specdraft.engines.counters import vllm_figures
from specdraft.core.progress import StageProgress, human_seconds
from specdraft.engines.launcher import launch, log_tail
from specdraft.engines.python import vllm_python
from specdraft.engines.worker import worker_command, worker_env
from specdraft.eval.acceptance import acceptance_rule
from specdraft.eval.engine_worker import CPU_EXPAND_FIX, CPU_GROUPED_RMS_NORM_FIX

WORKER = "specdraft.eval.engine_worker"  # run as a module (specdraft.engines.worker)
#: Two-sided 99% normal quantile of :func:`sampled_agreement`'s interval.
Z99 = 2.5758


class EngineDisagreement(SpecdraftError, RuntimeError):
    """Offline and engine τ differ by more than the tolerance (results are written first)."""


def vllm_job(*, verifier_dir: Path, drafter_dir: Path | None, prompts: Sequence[Sequence[int]],
             k: int, temperature: float, max_tokens: int, stop_ids: Sequence[int], dtype: str,
             seed: int = 0, extra_runs: Sequence[dict[str, Any]] = (),
             draft_sample_method: str | None = None, method: str = "eagle3",
             tensor_parallel_size: int = 1) -> dict[str, Any]:
    """The worker's job (format in :mod:`specdraft.eval.engine_worker`). One run ``spec`` with
    the drafter (none when ``drafter_dir`` is None), served as ``method`` (vLLM's speculative
    method: ``eagle3`` or ``dflash``), and ``draft_sample_method`` (None: vLLM's default), then
    ``extra_runs`` in the same process (each may name its own ``method``).
    ``tensor_parallel_size``: vLLM's, over that many GPUs (its ``mp`` executor when > 1)."""
    longest = max((len(p) for p in prompts), default=0) + max_tokens + k + 8
    runs = [{"name": "spec", "drafter": str(drafter_dir) if drafter_dir else None, "k": k,
             "draft_sample_method": draft_sample_method, "method": method}, *extra_runs]
    tp = {} if tensor_parallel_size == 1 else {"tensor_parallel_size": tensor_parallel_size,
                                              "executor": "mp"}
    return {"verifier": str(verifier_dir), "dtype": dtype, "seed": seed, **tp,
            "max_model_len": max(256, longest), "prompts": [list(map(int, p)) for p in prompts],
            "max_tokens": max_tokens, "temperature": temperature,
            "stop_token_ids": [int(i) for i in stop_ids], "runs": runs}


def run_worker(python: str, job: dict[str, Any], workdir: Path, *,
               timeout_s: float = 3600) -> dict[str, Any]:
    """Run :mod:`specdraft.eval.engine_worker` on ``job`` in ``python``; return its JSON.

    Files ``engine-job.json``, ``engine-out.json`` and ``engine.log`` (the engine's output) go
    to ``workdir``. The worker runs under the one worker import policy
    (:mod:`specdraft.engines.worker`) and the one launcher (:func:`specdraft.engines.launcher.
    launch`), capped at ``timeout_s`` seconds; its process group is always stopped: on
    success, on a timeout, on Ctrl-C or any exception. Raises :class:`EngineError` with the log
    tail.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    job_path, out_path, log_path = (workdir / n for n in
                                    ("engine-job.json", "engine-out.json", "engine.log"))
    job_path.write_text(json.dumps(job))
    out_path.unlink(missing_ok=True)
    env = worker_env(workdir, VLLM_ENABLE_V1_MULTIPROCESSING=os.environ.get(
        "VLLM_ENABLE_V1_MULTIPROCESSING", "0"))
    with launch(worker_command(python, WORKER, str(job_path), str(out_path)), log_path,
                name="the vLLM engine", env=env, deadline_s=timeout_s,
                timeout_flag="--engine-timeout-s") as engine:
        rc = engine.wait()
        if rc != 0 or not out_path.exists():
            raise engine.exited_error(rc)
    return json.loads(out_path.read_text())


#: A short name of each engine fix (:mod:`specdraft.eval.engine_worker`), for the notice.
FIX_NAMES = {CPU_EXPAND_FIX: "the CPU build's expand kernel (the per-token temperature of "
                             "sampling at temperature > 0)",
             CPU_GROUPED_RMS_NORM_FIX: "the CPU build's rms_norm op (a DFlash drafter's "
                                       "per-layer k_norm)"}


def figure_fixes(fixes: Sequence[str], temperature: float) -> list[str]:
    """The engine fixes the worker applied (``engine_fixes`` of its results) that this figure
    depends on: the expand-kernel fix only at ``temperature`` > 0 (greedy verification never
    reads the per-token temperature it repairs), every other fix as applied. Only these are
    said on stderr and recorded as the figure's ``engine_fixes`` (the rest as
    ``engine_fixes_idle``); the same for the expand fix switched off (``OFF …``)."""
    return [f for f in fixes if temperature > 0 or not f.endswith(CPU_EXPAND_FIX)]


def engine_heartbeat(name: str, log: Path) -> StageProgress:
    """A progress line every 30 s while the engine ``name`` runs (the engine reports nothing
    until it is done): its elapsed time and the last line of its ``log``
    (:class:`~specdraft.core.progress.StageProgress`; start it, close it with
    ``final=False``)."""
    def line(elapsed_s: float) -> str:
        tail = log_tail(log, 1)
        last = f"; its log: {tail[0].strip()[:120]}" if tail else ""
        return f"eval: {name} running, elapsed {human_seconds(elapsed_s)}{last}"

    return StageProgress(f"eval: {name}", render=line)


def figures(counters: dict[str, Any]) -> dict[str, Any]:
    """The worker's counters (``{"drafts", "draft_tokens", "accepted", "per_pos": [...]}``) as
    figures (:func:`specdraft.engines.counters.vllm_figures`)."""
    return vllm_figures(counters["drafts"], counters["draft_tokens"], counters["accepted"],
                        counters["per_pos"])


def agreement(offline: dict[str, Any], engine: dict[str, Any],
              offline_tokens: Sequence[Sequence[int]], engine_tokens: Sequence[Sequence[int]],
              ids: Sequence[str]) -> dict[str, Any]:
    """Offline vs engine: τ gap, counts side by side, per prompt identical committed tokens
    (and the first differing index)."""
    counts = {n: {"offline": offline.get(n), "engine": engine.get(n)}
              for n in ("verify_steps", "drafted", "accepted", "per_position_accepted")}
    prompts = []
    for pid, a, b in zip(ids, offline_tokens, engine_tokens):
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                     None if len(a) == len(b) else min(len(a), len(b)))
        prompts.append({"id": pid, "identical": first is None, "first_difference": first})
    return {"tau_offline_minus_engine": offline["tau"] - engine["tau"],
            "counts_identical": all(v["offline"] == v["engine"] for v in counts.values()),
            "counts": counts, "identical_prompts": sum(p["identical"] for p in prompts),
            "prompts": prompts}


def sampled_agreement(offline: dict[str, Any], engine: dict[str, Any], *,
                      z: float = Z99) -> dict[str, Any]:
    """Per-position acceptance offline vs engine at temperature > 0, where the two runs draw
    different random numbers and only their rates can agree.

    Position i's rate is ``a / n`` (``a`` steps accepting draft i, ``n`` verify steps) on each
    side; under "same rule, same drafter" both estimate one probability, and the difference
    lies within ``z * sqrt(r (1 - r) (1/n_off + 1/n_eng))`` (``r`` the pooled rate; normal
    approximation of two binomials, z 2.5758 = 99% two-sided). Steps of one prompt are not
    independent, so read it as a screen, not an exact test. Returns per position the two
    rates, their difference, the half-width and whether it lies within, and ``all_within``.
    """
    n_off, n_eng = offline["verify_steps"], engine["verify_steps"]
    rows = []
    for a_off, a_eng in zip(offline["per_position_accepted"], engine["per_position_accepted"]):
        r = (a_off + a_eng) / (n_off + n_eng)
        half = z * (r * (1 - r) * (1 / n_off + 1 / n_eng)) ** 0.5
        diff = a_off / n_off - a_eng / n_eng
        rows.append({"offline": a_off / n_off, "engine": a_eng / n_eng, "difference": diff,
                     "half_width": half, "within": abs(diff) <= half})
    return {"steps": {"offline": n_off, "engine": n_eng}, "confidence": 0.99,
            "positions": rows, "all_within": all(p["within"] for p in rows)}


def engine_version(out: dict[str, Any]) -> str:
    return f"{out['engine']} {out['version']} (torch {out['torch']}, {out['device']})"


def engine_drafter(config: Any, out: Path) -> Path:
    """The exported directory the engine loads: ``engine_drafter``, else the eval's drafter when
    it is an export, else the run's export of that drafter, else a fresh export of it in its
    kind's engine format (``sglang``; ``vllm`` for DFlash and the MLA layer) into
    ``OUT/engine-drafter`` (validated as ``specdraft export`` validates, against
    ``--run-dir``'s extraction: :mod:`specdraft.artifacts.export`; raises its
    :class:`~specdraft.artifacts.validate.ExportRefused` for a drafter of other aux ids)."""
    from specdraft import kinds
    from specdraft.artifacts.drafter import read_drafter
    from specdraft.artifacts.layout import RunLayout
    from specdraft.core.manifest import read_manifest
    from specdraft.eval.config import drafter_dir

    if config.engine_drafter is not None:
        return Path(config.engine_drafter)
    src = drafter_dir(config)
    if read_drafter(src).format != "specdraft":
        return src
    export = read_manifest(RunLayout(config.run_dir).exports) if config.run_dir else None
    if export and Path(export["out"]).exists() and \
            Path(export.get("source", "")).resolve() == src.resolve():
        return Path(export["out"])
    from specdraft.artifacts.export import ExportRequest, validated_candidate, write_export

    target = out / "engine-drafter"
    # checked as `specdraft export` checks it, against the run's own record (RUN/extract's aux
    # ids, the run's profile and identity); only without a run are the drafter's ids the facts
    drafter = read_drafter(src)
    request = ExportRequest(verifier=config.verifier, speculative_tokens=config.k,
                            run_dir=config.run_dir,
                            format=kinds.of(drafter).hooks().engine_format(drafter.config),
                            aux_layers=None if config.run_dir else
                            tuple(drafter.config.aux_layer_ids))
    with write_export(target, validated_candidate(request, drafter)):
        pass
    return target


def doctor_hints(config: Any, drafter: Path, verifier: Any) -> list[str]:
    """The doctor's failing checks (name: fix) for the engine's drafter, plus the usual causes
    of an offline/engine gap when every check passes."""
    from specdraft import kinds
    from specdraft.artifacts.checks import check_drafter
    from specdraft.artifacts.drafter import read_drafter

    d = read_drafter(drafter)
    home = kinds.of(d).hooks()
    if home.doctor(d) is not None:  # the doctor's checks are not this kind's
        return home.engine_hints()
    report = check_drafter(drafter, config.verifier, verifier=verifier)
    hints = [f"doctor {c['name']}: {c['detail']} -> {c['fix']}" for c in report["checks"]
             if not c["ok"]]
    return hints or home.engine_hints()


def measure_vllm(config: Any, *, prompts: list[dict[str, Any]], prompt_ids: list[list[int]],
                 stop_ids: Sequence[int], out: Path, offline: dict[str, Any],
                 verifier: Any) -> dict[str, Any]:
    """vLLM's figures for ``config`` (an :class:`~specdraft.eval.config.EvalConfig`) on the
    rendered ``prompt_ids``, with the agreement against ``offline`` at temperature 0.

    Raises :class:`EngineDisagreement` (after the caller wrote the results: see
    :func:`check_agreement`), :class:`EngineError` or :class:`ConfigError`.
    """
    python = vllm_python(config.engine_python)
    vdir = engine_hf_dir(config.verifier, config.run_dir or out)
    ddir = engine_drafter(config, out)
    dtype = resolve_dtype(config.dtype, config.device)
    job = vllm_job(verifier_dir=vdir, drafter_dir=ddir, prompts=prompt_ids, k=config.k,
                   temperature=config.temperature, max_tokens=config.max_new_tokens,
                   stop_ids=stop_ids, dtype=dtype, seed=config.seed,
                   draft_sample_method=config.draft_sample_method,
                   method=speculative_method(ddir),
                   tensor_parallel_size=config.engine_tensor_parallel_size)
    t0 = time.perf_counter()
    print(f"eval: starting vLLM ({python}) with {ddir}", file=sys.stderr)
    beat = engine_heartbeat("the vLLM engine", out / "engine.log").start()
    try:
        res = run_worker(python, job, out, timeout_s=config.engine_timeout_s)
    finally:
        beat.close(final=False)
    fixes = figure_fixes(res.get("engine_fixes", []), config.temperature)
    for fix in fixes:
        said = "NOT worked around (switched off)" if fix.startswith("OFF ") else "worked around"
        print(f"eval: vLLM bug {said} for this figure: {FIX_NAMES.get(fix, fix)} "
              f"(results.json engine.engine_fixes)", file=sys.stderr)
    spec = res["runs"][0]
    fig = figures(spec["counters"])
    tokens = spec["tokens"]
    n_new = sum(len(t) for t in tokens)
    method = spec.get("draft_sample_method")  # what the engine ran, from its config
    result = {"name": res["engine"], "version": engine_version(res), "k": config.k,
              "temperature": config.temperature, "draft_sample_method": method,
              "acceptance_rule": acceptance_rule(config.temperature, method) if method else
              "unknown: the engine's config names no draft_sample_method",
              "engine_fixes": fixes, "engine_fixes_idle": [
                  f for f in res.get("engine_fixes", []) if f not in fixes],
              "tensor_parallel_size": config.engine_tensor_parallel_size, "dtype": dtype,
              "verifier_dir": str(vdir), "drafter_dir": str(ddir), **fig,
              "new_tokens": n_new, "start_s": spec["start_s"], "generate_s": spec["generate_s"],
              "tokens_per_s": n_new / spec["generate_s"] if spec["generate_s"] else 0.0,
              "wall_s": round(time.perf_counter() - t0, 2),
              "prompts": [{"id": p["id"], "new_tokens": len(t), "tokens": t}
                          for p, t in zip(prompts, tokens)]}
    if config.temperature <= 0:
        result["agreement"] = agreement(offline, fig, [r["tokens"] for r in offline["prompts"]],
                                        tokens, [p["id"] for p in prompts])
    else:
        result["sampled_agreement"] = sampled_agreement(offline, fig)
        _say_sampled(result, offline)
    return result


def _say_sampled(engine: dict[str, Any], offline: dict[str, Any]) -> None:
    """One stderr line per position of :func:`sampled_agreement`, and a warning when the engine
    ran another rule than the offline eval."""
    if engine["acceptance_rule"] != offline["acceptance_rule"]:
        print(f"eval: warning: the engine ran '{engine['acceptance_rule']}', the offline eval "
              f"'{offline['acceptance_rule']}'", file=sys.stderr)
    for i, p in enumerate(engine["sampled_agreement"]["positions"]):
        print(f"eval: position {i + 1}: offline {p['offline']:.3f}, {engine['name']} "
              f"{p['engine']:.3f}, difference {p['difference']:+.3f} (99% +-{p['half_width']:.3f}"
              f"{'' if p['within'] else ', OUTSIDE'})", file=sys.stderr)


def check_agreement(config: Any, engine: dict[str, Any], verifier: Any) -> None:
    """Raise :class:`EngineDisagreement` with the doctor's hints when the temperature-0 τ gap
    exceeds ``config.engine_tolerance``."""
    agree = engine.get("agreement")
    if agree is None or abs(agree["tau_offline_minus_engine"]) <= config.engine_tolerance:
        return
    gap = agree["tau_offline_minus_engine"]
    hints = doctor_hints(config, Path(engine["drafter_dir"]), verifier)
    raise EngineDisagreement(
        f"offline and {engine['name']} disagree: tau offline - engine = {gap:+.3f} (tolerance "
        f"{config.engine_tolerance}), {agree['identical_prompts']}/{len(agree['prompts'])} "
        f"prompts identical; the figures are in results.json.\n  " + "\n  ".join(hints))
