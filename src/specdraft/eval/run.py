"""``specdraft eval``: τ, acceptance rate and per-position acceptance of a drafter.

Offline (default): each prompt is rendered with the verifier's chat template and decoded with
:func:`specdraft.eval.specdec.generate` (both models KV-cached), or ``--batch-size`` prompts
at a time with :func:`specdraft.eval.batch.generate_batch` (same tokens and counts). With
``--server URL`` the prompts go to a running engine and its own counters are read
(:mod:`specdraft.eval.server`).
With ``--engine vllm|sglang|auto`` a real engine is also started on the same prompt token ids
(:mod:`specdraft.eval.engine`, :mod:`specdraft.eval.sglang`) and its figures are written beside
the offline ones; at temperature 0 a vLLM gap beyond ``--engine-tolerance`` fails the eval
after the results are written.
Writes ``results.json`` and ``acceptance.png`` to ``RUN/eval/`` (or ``--out``), then the manifest.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

from specdraft.core.atomic import atomic_write_json
from specdraft.core.chat import generation_stop_ids
from specdraft.core.assets import resolve_path
from specdraft.core.context import StageContext, single_process
from specdraft.core.manifest import EvalManifest, StageClock, file_sha256, input_hash, \
    read_manifest, write_manifest
from specdraft.artifacts.layout import RunLayout
from specdraft.core.progress import StageProgress
from specdraft.core.rundir import open_stage_dir
from specdraft.eval.config import EvalConfig, drafter_dir
from specdraft.eval.plot import plot_acceptance
from specdraft.eval.prompts import eval_chat_format, load_prompts, render
from specdraft.eval.acceptance import AcceptanceStats, acceptance_rule

STAGE = "eval"


def output_dir(config: EvalConfig) -> Path:
    """``RUN/eval`` (refused when non-empty unless --overwrite) or ``--out``."""
    if config.out is not None:
        out = Path(config.out)
        if out.exists() and any(out.iterdir()) and not config.overwrite:
            from specdraft.core.errors import StageDirError

            raise StageDirError(f"{out} is not empty; pass --overwrite")
        out.mkdir(parents=True, exist_ok=True)
        return out
    return open_stage_dir(config.run_dir, STAGE, overwrite=config.overwrite, resumable=False)


def load_drafter_model(config: EvalConfig, verifier: Any) -> Any:
    """The drafter (any on-disk format) on the verifier's device, float32 on CPU. Raises
    :class:`ConfigError` for aux ids outside ``[1, N-1]`` of the verifier
    (:func:`specdraft.artifacts.rules.aux_id_problems`), :class:`InputError` for tensors its
    config does not describe (:func:`specdraft.artifacts.rules.tensor_problems`)."""
    from specdraft.artifacts.drafter import build_model, read_drafter

    from specdraft.artifacts.rules import aux_id_problems
    from specdraft.core.errors import ConfigError

    d = read_drafter(drafter_dir(config))
    vcfg = getattr(verifier.config, "text_config", None) or verifier.config
    problems = aux_id_problems(d.config.aux_layer_ids, vcfg.num_hidden_layers,
                               source=f"{d.path} aux ids")
    if problems:  # the rule export and doctor apply (specdraft.artifacts.rules)
        raise ConfigError("; ".join(problems))
    embed = verifier.get_input_embeddings().weight.detach()
    head = verifier.get_output_embeddings().weight.detach()
    dtype = torch.float32 if config.dtype in ("auto", "float32") else torch.bfloat16
    return build_model(d, verifier_embed=embed, verifier_head=head, device=str(embed.device),
                       dtype=dtype)


def offline_eval(config: EvalConfig, verifier: Any, prompts: list[dict[str, Any]],
                 eos: list[int]) -> dict[str, Any]:
    """Speculative decoding over ``prompts`` (each with its rendered ``prompt_ids``), stopping
    at ``eos`` ids; aggregate and per-prompt figures (with the committed token ids)."""
    model = load_drafter_model(config, verifier)
    rule = acceptance_rule(config.temperature, config.draft_sample_method)
    print(f"eval: acceptance rule: {rule}", file=sys.stderr)
    t0 = time.perf_counter()
    gens = decode(config, verifier, model, [p["prompt_ids"] for p in prompts], eos)
    seconds = time.perf_counter() - t0
    stats, rows, tokens = AcceptanceStats(), [], 0
    for p, g in zip(prompts, gens):
        stats.extend(g.stats)
        tokens += len(g.tokens)
        rows.append({"id": p["id"], **g.summary(), "tokens": list(g.tokens)})
        print(f"eval: {p['id']}: tau {g.stats.tau:.2f}, {len(g.tokens)} tokens", file=sys.stderr)
    return {**stats.summary(), "new_tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "batch_size": config.batch_size, "prompts": rows,
            "draft_sample_method": config.draft_sample_method,
            "acceptance_rule": rule,
            "aux_layer_ids": list(model.config.aux_layer_ids),
            "draft_vocab_size": getattr(model.config, "draft_vocab_size",
                                        model.config.vocab_size),
            **_tree_figures(config, gens),
            **_serve_plan(config, verifier, model, prompts, eos)}


def _tree_figures(config: EvalConfig, gens: list[Any]) -> dict[str, Any]:
    """With --topk/--num-draft-tokens: the SGLang shape and SGLang's own accept length
    (:mod:`specdraft.eval.tree`)."""
    if not config.tree:
        return {}
    from specdraft.eval.tree import sglang_accept_length

    return {"tree": {"steps": config.k, "topk": config.topk,
                     "num_draft_tokens": config.num_draft_tokens or config.k + 1,
                     "draft_attention": "lane (SGLang's draft KV layout)"},
            "sglang_accept_length": sglang_accept_length(gens)}


def _serve_plan(config: EvalConfig, verifier: Any, model: Any, prompts: list[dict[str, Any]],
                eos: list[int]) -> dict[str, Any]:
    """With --sweep: :func:`specdraft.eval.plan.run_plan` on the same prompts, one line per
    setting on stderr."""
    if config.sweep is None:
        return {}
    from specdraft.eval.plan import run_plan

    plan = run_plan(config, verifier, model, [p["prompt_ids"] for p in prompts], eos)
    for row in plan["settings"]:
        print(f"eval: plan: {row['setting']:<16} tau {row['tau']:.3f}, verify "
              f"{row['num_draft_tokens']} tokens, predicted speedup "
              f"{row['predicted_speedup']:.2f}x", file=sys.stderr)
    print(f"eval: plan: best {plan['best']}", file=sys.stderr)
    return {"serve_plan": plan}


#: Prompts per call of the kind's decoder, in batches of ``--batch-size``: the unit the offline
#: decode's progress line counts (a heartbeat prints it every 30 s in between).
DECODE_CHUNK_BATCHES = 8


def decode(config: EvalConfig, verifier: Any, model: Any, prompt_ids: list[list[int]],
           eos: list[int]) -> list[Any]:
    """One :class:`~specdraft.eval.specdec.Generation` per prompt: the batch-1 loop
    (:func:`~specdraft.eval.specdec.generate`) or, with ``--batch-size`` > 1,
    :func:`~specdraft.eval.batch.generate_batch` (same tokens and counts). Prompt i samples
    with its own generator seeded ``seed + i``, so the batch size does not change the draws.

    The kind's decoder is called on :data:`DECODE_CHUNK_BATCHES` batches of prompts at a time
    (prompt i still seeded ``seed + i``: each chunk's config carries ``seed + start``), so the
    progress line (:class:`~specdraft.core.progress.StageProgress`) counts decoded prompts and
    committed tokens as they finish."""
    from specdraft import kinds

    decoder = kinds.resolve(kinds.of(model).decoder)
    chunk = max(1, getattr(config, "batch_size", 1)) * DECODE_CHUNK_BATCHES
    bar = StageProgress("eval: offline decode", total=len(prompt_ids), unit="prompts").start()
    gens: list[Any] = []
    try:
        for start in range(0, len(prompt_ids), chunk):
            part = decoder(_seeded(config, config.seed + start), verifier, model,
                           prompt_ids[start:start + chunk], eos)
            gens += part
            bar.update(len(part), tokens=f"{sum(len(g.tokens) for g in gens):,} committed")
    except BaseException:
        bar.close(final=False)
        raise
    bar.close()
    return gens


def _seeded(config: Any, seed: int) -> Any:
    """``config`` with ``seed`` (a stage config is frozen: a copy)."""
    if hasattr(config, "model_copy"):
        return config.model_copy(update={"seed": seed})
    import copy

    out = copy.copy(config)
    out.seed = seed
    return out


def decode_eagle3(config: EvalConfig, verifier: Any, model: Any, prompt_ids: list[list[int]],
                  eos: list[int]) -> list[Any]:
    """:func:`decode` for an EAGLE-3 drafter (the kind's offline decoder,
    :mod:`specdraft.kinds`): a tree with ``--topk``/``--num-draft-tokens``
    (:func:`specdraft.eval.plan.decode_setting`), else the chain of ``k`` drafts per step."""
    from specdraft.eval.batch import BatchEagleDrafter, BatchVerifier, generate_batch
    from specdraft.eval.specdec import EagleDrafter, VerifierSession, generate

    aux = model.config.aux_layer_ids
    if config.tree:
        from specdraft.eval.plan import decode_setting
        from specdraft.eval.shapes import Setting

        return decode_setting(verifier, model, prompt_ids,
                              Setting(config.k, config.topk, config.num_draft_tokens),
                              max_new_tokens=config.max_new_tokens, eos=eos)
    gens = [torch.Generator().manual_seed(config.seed + i) for i in range(len(prompt_ids))]
    common = {"k": config.k, "max_new_tokens": config.max_new_tokens,
              "temperature": config.temperature, "eos_ids": eos,
              "draft_sample_method": config.draft_sample_method}
    if config.batch_size > 1:
        return generate_batch(BatchVerifier(verifier, aux), BatchEagleDrafter(model),
                              prompt_ids, batch_size=config.batch_size, generators=gens,
                              **common)
    return [generate(VerifierSession(verifier, aux), EagleDrafter(model), ids, generator=g,
                     **common) for ids, g in zip(prompt_ids, gens)]


def run(config: EvalConfig, ctx: StageContext | None = None, *,
        verifier: Any | None = None) -> EvalManifest:
    """Evaluate; return the manifest (typed). ``verifier``: an already loaded HF model (so that
    ``specdraft run`` loads it once); else it is loaded from ``config.verifier`` on
    ``ctx.device``.

    ``ctx``: this process (:mod:`specdraft.core.context`), else read from the environment; the
    stage runs in one process (:func:`specdraft.core.context.single_process`)."""
    clock = StageClock()
    ctx = single_process("eval", ctx, config.device)
    prompts = load_prompts(config.prompts, config.limit)
    out = output_dir(config)
    if config.server is not None:
        import httpx

        from specdraft.eval.served import check_served
        from specdraft.eval.server import server_eval

        client = httpx.Client(base_url=config.server, timeout=600)
        served = check_served(config, client)
        results = server_eval(config.server, prompts, max_tokens=config.max_new_tokens,
                              temperature=config.temperature, client=client)
        results["served_model"] = served
        # which engine answered ("vllm"/"sglang"): not the --engine figures "engine" holds
        results["server_engine"] = results.pop("engine")
    else:
        from specdraft.core.verifier import load_tokenizer, load_verifier

        tokenizer = load_tokenizer(config.verifier)
        if verifier is None:
            verifier = load_verifier(config.verifier, dtype=config.dtype, device=str(ctx.device))
        binding = verifier_binding(config, verifier, tokenizer)
        fmt = eval_chat_format(config, tokenizer)
        for p in prompts:
            p["prompt_ids"] = render(tokenizer, p["messages"], fmt)
        eos = generation_stop_ids(verifier, tokenizer, fmt)
        engine = resolve_engine(config)
        if engine == "vllm":
            refuse_unservable(config, verifier)
        results = offline_eval(config, verifier, prompts, eos)
        results["verifier_binding"] = binding
        results["chat_format"] = {"template_sha256": fmt.template_sha256, "kwargs": fmt.kwargs}
        if engine != "none":
            results["engine"] = measure_engine(config, engine, prompts, out, results, verifier,
                                               eos)
    results = {"mode": "server" if config.server else "offline", "k": config.k,
               "temperature": config.temperature, "verifier": config.verifier,
               "drafter": None if config.server else str(drafter_dir(config)), **results}
    atomic_write_json(out / "results.json", results)
    write_plot(results, out, config)
    manifest = write_manifest(out, stage=STAGE, config=config, clock=clock,
                              inputs=_inputs(config),
                              counts={"prompts": len(prompts),
                                      "new_tokens": results["new_tokens"]},
                              extra={**{k: results.get(k) for k in
                                        ("tau", "acceptance_rate", "per_position",
                                         "tokens_per_s", "verify_steps", "mode", "by_context",
                                         "tree", "sglang_accept_length", "acceptance_rule")},
                                     "serve_plan": _plan_extract(results.get("serve_plan")),
                                     "engine": engine_extract(results.get("engine")),
                                     "verifier_binding": results.get("verifier_binding"),
                                     "served_model": results.get("served_model")})
    if results.get("engine") and results["engine"]["name"] == "vllm":
        from specdraft.eval.engine import check_agreement

        check_agreement(config, results["engine"], verifier)
    _refresh_card(config)
    return manifest


def _refresh_card(config: EvalConfig) -> None:
    """Rewrite the model card of the run's export with this eval's figures, when this eval
    measured that export's drafter (``RUN/train/best`` or the export itself)."""
    if config.run_dir is None or config.server:
        return
    from specdraft import kinds
    from specdraft.artifacts.drafter import read_drafter
    from specdraft.engines.serve import write_export_card

    export = read_manifest(RunLayout(config.run_dir).exports)
    if not export or not Path(export["out"]).is_dir():
        return
    measured = drafter_dir(config).resolve()
    if measured not in (Path(export["out"]).resolve(), Path(export.get("source", "")).resolve()):
        return
    write_export_card(config.run_dir, export["out"],
                      kind=kinds.of(read_drafter(export["out"])).name, fmt=export["format"],
                      verifier=config.verifier, k=config.k)


def verifier_binding(config: EvalConfig, verifier: Any, tokenizer: Any) -> dict[str, Any]:
    """Check that ``--verifier`` is the model the drafter was trained on, before decoding
    (:mod:`specdraft.core.verifier_identity`): its identity against the drafter's (else the
    run's, :func:`specdraft.artifacts.verifier_contract.run_verifier`) record, then the
    hidden-state probe on a few ``RUN/extract`` rows when the run has them (without them only
    the identity is compared, said in the line). Returns the record for results.json; raises
    :class:`ConfigError` for another model or a failed probe unless ``--allow-other-verifier``.
    """
    from specdraft.core.errors import ConfigError
    from specdraft.artifacts.hidden_states import probe_or_skip
    from specdraft.artifacts.verifier_contract import run_verifier
    from specdraft.core.verifier_identity import bind, drafter_identity

    recorded = drafter_identity(drafter_dir(config))
    if recorded is None:
        recorded = run_verifier(config.run_dir).identity
    flag = "--allow-other-verifier"
    binding = bind(recorded, config.verifier, allow_other=config.allow_other_verifier,
                   flag=flag, tokenizer=tokenizer)
    if binding["refusal"]:
        raise ConfigError(binding["refusal"])
    probe = probe_or_skip(verifier, config.run_dir, quantized=binding.get("requantized", False))
    print(probe["line"], file=sys.stderr)
    if probe["ran"] and not probe["ok"]:
        if not config.allow_other_verifier:
            raise ConfigError(f"--verifier {config.verifier}: {probe['line']}; use the verifier "
                              f"the drafter was trained on, or pass {flag} to go on anyway")
        binding["allowed_by_flag"] = True
    return {**binding, "probe": probe}


def refuse_unservable(config: EvalConfig, verifier: Any) -> None:
    """Before any decode: refuse a drafter/verifier combination vLLM cannot serve
    (:data:`specdraft.engines.vllm_cpu.VLLM_REFUSALS`, the table ``specdraft run`` checks too),
    naming it and the alternative. Raises :class:`ConfigError`."""
    from specdraft import kinds
    from specdraft.artifacts.drafter import read_drafter
    from specdraft.core.errors import ConfigError
    from specdraft.core.profile import resolve_profile
    from specdraft.engines.vllm_cpu import combination, tensor_parallel_refusal, vllm_refusals

    tp = tensor_parallel_refusal(config.engine_tensor_parallel_size,
                                 cpu=not torch.cuda.is_available())
    if tp:
        raise ConfigError(tp)
    drafter = read_drafter(config.engine_drafter or drafter_dir(config))
    layer = getattr(drafter.config, "draft_layer", None)
    refusals = vllm_refusals(combination(kinds.of(drafter).name, layer,
                                         resolve_profile(verifier.config, model=verifier)))
    if refusals:
        raise ConfigError(f"eval --engine {config.engine}: " + " ".join(refusals) +
                          " (or --engine none)")


def resolve_engine(config: EvalConfig) -> str:
    """``config.engine``, with ``auto`` = ``vllm`` when a python with vLLM is found, else
    ``none`` (said on stderr)."""
    if config.engine != "auto":
        return config.engine
    from specdraft.core.errors import ConfigError
    from specdraft.engines.python import vllm_python

    try:
        vllm_python(config.engine_python)
    except ConfigError:
        print("eval: engine auto: no python with vLLM found (make install-vllm): offline only",
              file=sys.stderr)
        return "none"
    return "vllm"


def measure_engine(config: EvalConfig, engine: str, prompts: list[dict[str, Any]], out: Path,
                   offline: dict[str, Any], verifier: Any, stop_ids: list[int]
                   ) -> dict[str, Any]:
    """The engine's figures (:mod:`specdraft.eval.engine`, :mod:`specdraft.eval.sglang`)."""
    if engine == "vllm":
        from specdraft.eval.engine import measure_vllm

        return measure_vllm(config, prompts=prompts,
                            prompt_ids=[p["prompt_ids"] for p in prompts], stop_ids=stop_ids,
                            out=out, offline=offline, verifier=verifier)
    from specdraft.eval.sglang import measure_sglang

    return measure_sglang(config, prompts=prompts, stop_ids=stop_ids, out=out)


def _plan_extract(plan: dict[str, Any] | None) -> dict[str, Any] | None:
    """The serve plan for the manifest: best setting, each setting's τ and speedup."""
    if not plan:
        return None
    return {"best": plan["best"], "best_setting": plan["best_setting"],
            "cost_model": plan["cost_model"],
            "settings": {r["setting"]: {"tau": r["tau"], "predicted_speedup":
                                        r["predicted_speedup"]} for r in plan["settings"]}}


def engine_extract(engine: dict[str, Any] | None) -> dict[str, Any] | None:
    """The engine's figures for the manifest (no per-prompt tokens)."""
    if not engine:
        return None
    keep = ("name", "version", "k", "temperature", "acceptance_rule", "draft_sample_method",
            "sampled_agreement", "dtype", "tau",
            "acceptance_rate", "per_position", "verify_steps", "drafted", "accepted",
            "tokens_per_s", "verifier_dir", "drafter_dir", "engine_fixes",
            "tensor_parallel_size")
    out = {k: engine.get(k) for k in keep}
    agree = engine.get("agreement")
    if agree:
        out["tau_offline_minus_engine"] = agree["tau_offline_minus_engine"]
        out["counts_identical"] = agree["counts_identical"]
        out["identical_prompts"] = f"{agree['identical_prompts']}/{len(agree['prompts'])}"
    return out


def write_plot(results: dict[str, Any], out: Path, config: EvalConfig) -> None:
    """acceptance.png: offline per-position bars, and the engine's beside them."""
    if not results.get("per_position"):
        return
    engine = results.get("engine") or {}
    title = f"tau {results['tau']:.2f}, k={config.k}, T={config.temperature}"
    if engine.get("per_position"):
        title += f"; {engine['name']} tau {engine['tau']:.2f}"
    plot_acceptance(results["per_position"], out / "acceptance.png", title=title,
                    engine=engine.get("per_position") or None,
                    engine_label=engine.get("name", "engine"),
                    by_context=results.get("by_context"))


def _inputs(config: EvalConfig) -> dict[str, str]:
    inputs = {"prompts": file_sha256(resolve_path(config.prompts))}
    if config.run_dir is None:
        return inputs
    drafter = drafter_dir(config).resolve()
    for upstream in ("train", "export"):
        up = RunLayout(config.run_dir).stage(upstream)
        if read_manifest(up) and drafter.is_relative_to(up.resolve()):
            inputs[upstream] = input_hash(up)
    return inputs
