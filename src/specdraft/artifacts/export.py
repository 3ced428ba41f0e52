"""An engine export of a drafter, validated before a byte is written: the facts it is checked
against, the candidate ``config.json`` + tensors, every problem, and the atomic write.

Used by ``specdraft export`` (which adds its manifest and provenance) and by eval, which exports
a specdraft drafter for the engine it runs. Order: read the upstream facts (extraction aux ids,
verifier embedding and layer count, profile, identity), build the candidate in memory, collect
every problem (:func:`specdraft.artifacts.validate.check_export` and the binding checks here);
:class:`ExportRefused` lists them all and nothing is written.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors.torch import load_file, save_file

from specdraft import kinds
from specdraft.artifacts.drafter import EXPORT_CONFIG, EXPORT_WEIGHTS, DrafterOnDisk
from specdraft.artifacts.formats import FORMAT_SPECS, rename
from specdraft.artifacts.layout import RunLayout
from specdraft.artifacts.verifier_contract import run_verifier
from specdraft.core.atomic import atomic_dir, atomic_write_json
from specdraft.core.errors import ConfigError
from specdraft.core.manifest import MANIFEST, input_hash, load_stage_manifest
from specdraft.core.profile import VerifierProfile


@dataclass(frozen=True)
class ExportRequest:
    """What to export and against which facts; the fields (and defaults) of
    :class:`specdraft.export.config.ExportConfig`, which is passed as is by ``specdraft export``."""

    format: str = "sglang"
    run_dir: Path | None = None
    verifier: str | None = None
    verifier_name: str | None = None
    embed: str = "auto"
    speculative_tokens: int = 3
    dtype: str = "auto"
    aux_layers: tuple[int, ...] | None = None
    allow_other_verifier: bool = False
    trust_remote_code: bool = False


@dataclass
class Candidate:
    """A validated export in memory: ``config`` (config.json), ``tensors`` (under the format's
    names), the facts it was checked against, the drafter's verifier profile and identity, the
    binding to ``--verifier``, and where ``config.json`` tells an engine which verifier layers to
    capture (``engine_aux_ids``: key -> ids, as the kind writes them; the export manifest's)."""

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    facts: dict[str, Any]
    profile: VerifierProfile | None
    identity: dict[str, Any] | None
    binding: dict[str, Any] | None
    engine_aux_ids: dict[str, Any] = field(default_factory=dict)


def upstream_facts(config: ExportRequest) -> dict[str, Any]:
    """Extraction aux ids and layer count, verifier embedding / name / architectures, and the
    hashes of the upstream manifests read. Missing upstream pieces are None (refused later by
    :func:`missing_facts`); a manifest key of the wrong type raises :class:`InputError`."""
    facts: dict[str, Any] = {"extract_ids": None, "n_layers": None, "embed": None,
                             "verifier_name": config.verifier_name or config.verifier,
                             "architectures": [], "inputs": {}, "ids_missing_in": None,
                             "extract_profile": None, "verifier_profile": None,
                             "extract_identity": None, "record": "RUN/extract/manifest.json"}
    if config.run_dir is not None:
        layout = RunLayout(config.run_dir)
        for stage in (layout.extract, layout.train):
            if (stage / MANIFEST).exists():
                facts["inputs"][stage.name] = input_hash(stage)
        ex = load_stage_manifest(layout.extract)
        if ex is not None:
            facts["extract_ids"] = [int(i) for i in ex.aux_layer_ids] or None
            facts["ids_missing_in"] = None if facts["extract_ids"] else \
                layout.extract / MANIFEST
            facts["n_layers"] = ex.n_layers
            record = run_verifier(config.run_dir)  # the run's profile and identity
            facts["extract_profile"], facts["extract_identity"] = record.profile, record.identity
            facts["record"] = record.source
            facts["verifier_name"] = facts["verifier_name"] or ex.config.get("verifier")
        else:
            facts["extract_ids"] = _online_ids(config.run_dir)
        head = RunLayout(config.run_dir).verifier_head
        if head.exists():
            tables = load_file(str(head))
            facts["embed"] = tables.get("embed_tokens.weight")
            facts["head"] = tables.get("lm_head.weight")
    if facts["extract_ids"] is None and config.aux_layers:
        facts["extract_ids"] = list(config.aux_layers)
    elif facts["extract_ids"] and config.aux_layers and \
            list(config.aux_layers) != facts["extract_ids"]:
        raise ConfigError(f"--aux-layers {','.join(map(str, config.aux_layers))} differ from "
                          f"RUN/extract/manifest.json aux_layer_ids {facts['extract_ids']}; drop "
                          f"--aux-layers (the manifest records what was extracted)")
    if config.verifier is not None:
        _verifier_facts(config.verifier, facts, config.trust_remote_code)
    return facts


def _online_ids(run_dir: Path) -> list[int] | None:
    """The aux ids an online training run (no ``RUN/extract``) captured, from
    ``RUN/train/manifest.json`` (``config.online`` and ``drafter_config.aux_layer_ids``)."""
    train = load_stage_manifest(RunLayout(run_dir).train)
    if train is None or not train.config.get("online"):
        return None
    return [int(i) for i in train.drafter_config.get("aux_layer_ids") or []] or None


def missing_facts(config: ExportRequest, trained: dict[str, torch.Tensor], c: Any,
                  facts: dict[str, Any]) -> list[str]:
    """The facts an export must be checked against and that are unknown, each with how to
    supply it: the aux ids used at extraction, the verifier's layer count, and the verifier's
    embedding when the trained state holds one. An export is refused, never guessed."""
    problems = []
    ids = list(c.aux_layer_ids)
    if facts["extract_ids"] is None:
        where = facts["ids_missing_in"]
        problems.append(
            (f"{where} has no aux_layer_ids (missing or empty)" if where else
             "no record of the aux ids the features were extracted with (no "
             "RUN/extract/manifest.json)") +
            f": the drafter's aux ids {ids} cannot be checked; re-run `specdraft extract`, or "
            f"pass --aux-layers {','.join(map(str, ids))} if those are the ids used at extraction")
    if facts["n_layers"] is None:
        problems.append("the verifier's layer count is unknown (no n_layers in "
                        "RUN/extract/manifest.json): the aux ids' range cannot be checked; pass "
                        "--verifier")
    if facts["embed"] is None and "embed_tokens.weight" in trained:
        problems.append("the verifier's embedding is unknown (no "
                        "RUN/extract/verifier_head.safetensors): the trained embed_tokens.weight "
                        "cannot be checked to be the verifier's; pass --verifier")
    return problems


def _verifier_facts(verifier: str, facts: dict[str, Any], trust_remote_code: bool = False
                    ) -> None:
    """Layer count, architectures and profile from the verifier's config; its embedding when
    the extraction head did not provide it (loads the model). A verifier with its own code is
    refused unless ``trust_remote_code`` (:func:`specdraft.core.verifier.require_trust`)."""
    from specdraft.core.profile import resolve_profile
    from specdraft.core.verifier import load_verifier

    model = (load_verifier(verifier, trust_remote_code=trust_remote_code)
             if facts["embed"] is None else None)
    if model is not None:
        facts["verifier_model"] = model  # the hidden-state probe reuses it
        facts["embed"] = model.get_input_embeddings().weight.detach().cpu()
        hf = model.config
    else:
        from specdraft.core.profile import load_hf_config

        hf = load_hf_config(verifier, trust_remote_code=trust_remote_code)
    facts["verifier_profile"] = resolve_profile(hf, model=model)
    hf = getattr(hf, "text_config", None) or hf
    facts["n_layers"] = facts["n_layers"] or facts["verifier_profile"].n_layers
    facts["architectures"] = list(getattr(hf, "architectures", None) or [])


def drafter_profile(c: Any, facts: dict[str, Any]) -> VerifierProfile | None:
    """The verifier profile the drafter was built from (its config's, else the extraction's)."""
    if c.verifier_profile is not None:
        return VerifierProfile.from_dict(c.verifier_profile, source="drafter config "
                                         "verifier_profile")
    return facts["extract_profile"]


def profile_problems(config: ExportRequest, profile: VerifierProfile | None,
                     facts: dict[str, Any]) -> list[str]:
    """The drafter's verifier profile against RUN/extract's and against ``--verifier``'s: a
    mismatch means the drafter was shaped or trained for another verifier; each field named."""
    problems = []
    checks = [(f"{facts['record']} profile", facts["extract_profile"]),
              (f"--verifier {config.verifier}", facts["verifier_profile"])]
    for where, other in checks:
        if profile is None or other is None:
            continue
        diff = profile.mismatches(other)
        if diff:
            problems.append(f"the drafter's verifier profile differs from {where}: "
                            f"{'; '.join(diff)} (mine != theirs); the drafter was built for "
                            f"another verifier: retrain it for this one")
    return problems


def identity_problems(config: ExportRequest, identity: dict[str, Any] | None,
                      facts: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
    """``(problems, binding)``: the drafter's recorded verifier identity
    (:mod:`specdraft.core.verifier_identity`) against RUN/extract's and against ``--verifier``'s.
    Another model is a problem naming what differs (``--allow-other-verifier`` lets
    ``--verifier`` through, recorded in ``binding``); a quantized variant passes with a line."""
    from specdraft.core.verifier_identity import bind, compare

    problems = []
    if identity and facts["extract_identity"]:
        c = compare(identity, facts["extract_identity"])
        if c.kind == "other":
            problems.append(f"the drafter was trained on another verifier than the one "
                            f"{facts['record']} recorded: {'; '.join(c.differences)}; "
                            f"export the drafter of this run")
    if config.verifier is None:
        return problems, None
    binding = bind(identity, config.verifier, allow_other=config.allow_other_verifier,
                   flag="--allow-other-verifier", trust_remote_code=config.trust_remote_code)
    if binding["refusal"]:
        problems.append(binding["refusal"])
        return problems, binding
    binding["probe"] = export_probe(config, facts, quantized=binding.get("requantized", False))
    if binding["probe"]["ran"] and not binding["probe"]["ok"]:
        if config.allow_other_verifier:
            binding["allowed_by_flag"] = True
        else:
            problems.append(f"--verifier {config.verifier}: {binding['probe']['line']}; use "
                            f"the verifier the drafter was trained on, or pass "
                            f"--allow-other-verifier to go on anyway")
    return problems, binding


def export_probe(config: ExportRequest, facts: dict[str, Any], *, quantized: bool
                 ) -> dict[str, Any]:
    """The hidden-state probe (:func:`specdraft.artifacts.hidden_states.probe_or_skip`) of
    ``--verifier`` on the run's ``RUN/extract`` rows, the same as eval and doctor run; its line
    on stderr. Loads the verifier (float32 on CPU) only when the rows exist and it fits in half
    of this machine's memory; otherwise the record says "not run" and why."""
    import sys

    from specdraft.artifacts.hidden_states import extract_rows_dir, probe_line, probe_or_skip

    too_big = None if facts.get("verifier_model") is not None else _too_big(config.verifier)
    if extract_rows_dir(config.run_dir) is None:
        probe = {"ran": False, "line": probe_line(None, "no RUN/extract rows (export "
                                                        "--run-dir of the run that extracted "
                                                        "them); only the recorded identity "
                                                        "was compared")}
    elif too_big:
        probe = {"ran": False, "line": probe_line(None, too_big)}
    else:
        model = facts.get("verifier_model") or _load_verifier(config)
        probe = probe_or_skip(model, config.run_dir, quantized=quantized)
    print(f"export: {probe['line']}", file=sys.stderr)
    return probe


def _too_big(verifier: str) -> str | None:
    """Why export does not load ``verifier`` for the probe: its weights, in float32, would
    take more than half of this machine's memory (a 1T-parameter checkpoint); None when it
    fits or its size is unknown."""
    import os

    from specdraft.core.verifier import resolve_verifier

    try:
        directory, gguf_file = resolve_verifier(verifier)
        files = [Path(directory) / gguf_file] if gguf_file else \
            list(Path(directory).glob("*.safetensors"))
        size = sum(f.stat().st_size for f in files)
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ConfigError, OSError, ValueError):
        return None
    if 2 * size <= memory // 2:  # bf16 on disk doubles in float32
        return None
    return (f"--verifier's {size / 2**30:.0f} GiB of weights would be loaded in float32 on a "
            f"machine of {memory / 2**30:.0f} GiB; run eval --run-dir or doctor where it "
            f"fits: they run the same probe")


def _load_verifier(config: ExportRequest) -> Any:
    from specdraft.core.verifier import load_verifier

    return load_verifier(config.verifier, dtype="float32",
                         trust_remote_code=config.trust_remote_code)


def export_tensors(fmt: str, trained: dict[str, torch.Tensor], embed: torch.Tensor | None,
                   dtype: str) -> dict[str, torch.Tensor]:
    """The tensors to write, under ``fmt``'s names: the trained state minus its own embedding,
    plus ``embed`` (the verifier's) when given; floats cast to ``dtype`` unless ``auto``."""
    state = {k: v for k, v in trained.items() if k != "embed_tokens.weight"}
    if embed is not None:
        state["embed_tokens.weight"] = embed
    if dtype != "auto":
        to = getattr(torch, dtype)
        state = {k: v.to(to) if v.is_floating_point() else v for k, v in state.items()}
    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    return rename(state, FORMAT_SPECS[fmt].rename)


def embed_problems(config: ExportRequest, trained: dict[str, torch.Tensor],
                   verifier_embed: torch.Tensor | None) -> list[str]:
    """A trained embedding that is not the verifier's means the drafter was trained on the wrong
    inputs; ``--embed copy`` needs the verifier's embedding."""
    problems = []
    own = trained.get("embed_tokens.weight")
    if own is not None and verifier_embed is not None and (
            own.shape != verifier_embed.shape or
            not torch.equal(own, verifier_embed.to(own.dtype))):
        problems.append("the trained state's embed_tokens.weight is not the verifier's embedding "
                        "(random init or another model): the drafter was trained on inputs the "
                        "engines will not give it; retrain with the verifier's embedding")
    if config.embed == "copy" and verifier_embed is None:
        problems.append("--embed copy: the verifier's embedding is unknown (no "
                        "RUN/extract/verifier_head.safetensors); pass --verifier")
    return problems


def validated_candidate(config: ExportRequest, src: DrafterOnDisk) -> Candidate:
    """The export of ``src`` as ``config`` asks, with every check run: the upstream facts
    (:func:`upstream_facts`), then the candidate and its checks by ``src``'s kind (its home's
    ``export_candidate``: :mod:`specdraft.kinds`).

    Raises :class:`~specdraft.artifacts.validate.ExportRefused` listing every problem (nothing
    is written by this function), :class:`ConfigError` for ``--aux-layers`` contradicting the
    extraction, :class:`InputError` for a malformed upstream manifest."""
    return kinds.of(src).hooks().export_candidate(config, src, upstream_facts(config))


@contextmanager
def write_export(out: Path, c: Candidate) -> Iterator[Path]:
    """Write ``c`` into ``out`` atomically (temp dir + rename): ``config.json`` and
    ``model.safetensors``. Yields the temp directory so the caller can add files (provenance)
    before the rename; an exception leaves ``out`` as it was."""
    with atomic_dir(out) as tmp:
        atomic_write_json(tmp / EXPORT_CONFIG, c.config)
        save_file(c.tensors, str(tmp / EXPORT_WEIGHTS), metadata={"format": "pt"})
        yield tmp
