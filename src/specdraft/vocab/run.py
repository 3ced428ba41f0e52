"""``specdraft vocab``: count supervised tokens of ``RUN/prepare/dataset/``, pick the draft
vocabulary, write ``RUN/vocab/vocab_map.safetensors`` (``d2t`` int64 [K], ``t2d`` bool [V])."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specdraft.artifacts.vocab_map import VOCAB_FILE, save_vocab_map
from specdraft.core.context import StageContext, single_process
from specdraft.core.manifest import PrepareManifest, StageClock, VocabManifest, input_hash, \
    write_manifest
from specdraft.core.rundir import open_stage_dir, require_stage
from specdraft.vocab import mapping
from specdraft.vocab.config import VocabConfig
from specdraft.artifacts.layout import RunLayout

STAGE = "vocab"
FILL_RULE = ("forced tokens, then by supervised count (desc, ties by lower id), then the lowest "
             "unused ids when fewer than K distinct ids were seen")


def supervised_counts(dataset_dir: Path, vocab_size: int) -> np.ndarray:
    """Counts [V] of supervised ids in a prepare dataset, one Arrow chunk at a time."""
    import datasets

    ds = datasets.load_from_disk(str(dataset_dir))
    counts = np.zeros(vocab_size, dtype=np.int64)                      # [V]
    ids_col, mask_col = ds.data.column("input_ids"), ds.data.column("loss_mask")
    for ids, mask in zip(ids_col.chunks, mask_col.chunks):
        counts += mapping.count_supervised(ids.flatten().to_numpy(),
                                           mask.flatten().to_numpy(), vocab_size)
    return counts


def forced_ids(prepare_manifest: PrepareManifest, include_byte_fallback: bool) -> list[int]:
    """Ids always kept: eos, end-of-turn, think and template/tool tags recorded by prepare,
    plus byte-fallback tokens when asked."""
    f = prepare_manifest.forced_token_ids
    groups = [f.eos, f.stop, f.think, f.template_special]
    groups += [f.byte_fallback] if include_byte_fallback else []
    return sorted({int(i) for g in groups for i in g})


def token_strings(prepare_manifest: PrepareManifest, ids: list[int]) -> list[str | None]:
    """Token strings for ``ids`` when prepare's tokenizer is an HF directory (fast to load)."""
    path = Path(str(prepare_manifest.tokenizer.get("path", "")))
    if not ids or not path.is_dir():
        return [None] * len(ids)
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
        return list(tok.convert_ids_to_tokens(ids))
    except (OSError, ValueError):
        return [None] * len(ids)


def run(config: VocabConfig, ctx: StageContext | None = None) -> VocabManifest:
    """Run the vocab stage; return its manifest (typed). Raises StageDirError when prepare has not
    completed, ValueError for ids outside the vocabulary or too many forced ids.

    ``ctx``: this process (:mod:`specdraft.core.context`), else read from the environment; the
    stage runs in one process (:func:`specdraft.core.context.single_process`)."""
    clock = StageClock()
    single_process(STAGE, ctx, "cpu")
    out = open_stage_dir(config.run_dir, STAGE, resume=config.resume, overwrite=config.overwrite)
    prep = require_stage(config.run_dir, "prepare")
    prep_dir = RunLayout(config.run_dir).prepare
    v = int(config.verifier_vocab_size or prep.verifier_vocab_size)
    counts = supervised_counts(RunLayout(config.run_dir).dataset, v)                # [V]
    forced = forced_ids(prep, config.include_byte_fallback)
    selected = mapping.select_ids(counts, config.draft_vocab_size, forced)
    d2t, t2d = mapping.build_maps(selected, v)
    save_vocab_map(out / VOCAB_FILE, d2t, t2d)
    left = mapping.top_left_out(counts, t2d, config.report_left_out)
    names = token_strings(prep, [i for i, _ in left])
    report = {
        "draft_vocab_size": len(selected), "verifier_vocab_size": v,
        "coverage": round(mapping.coverage(counts, t2d), 6),
        "supervised_tokens": int(counts.sum()), "distinct_supervised": int((counts > 0).sum()),
        "forced": len(forced),
        "filled_unseen": int(np.sum((counts[selected] == 0) & ~np.isin(selected, forced))),
        "fill_rule": FILL_RULE,
        "top_left_out": [{"id": i, "count": c, "token": n} for (i, c), n in zip(left, names)],
    }
    return write_manifest(out, stage=STAGE, config=config, clock=clock,
                          inputs={"prepare": input_hash(prep_dir)},
                          counts={"in": report["supervised_tokens"], "out": len(selected),
                                  "rejected": {}},
                          extra={"vocab": report})
