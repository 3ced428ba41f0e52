"""The teacher check: is the stored teacher the verifier's own distribution? Run before training.

A drafter trained on a wrong teacher reaches a good loss and then does not accept when served
(issue #12). The faults behind it are silent in the loss: the final state stored *before* the
final norm (vLLM's id ``N``) instead of after it, a ``(1 + w)`` norm gain applied as ``w``,
all-zero states from a broken extraction path. This module catches them on a few stored rows:

1. **Bands** (no verifier needed): for up to ``band_rows`` seeded rows, every token's rms per
   aux layer and of the final state. Refused: a non-finite value; a token whose rms is 0
   (below ``1e-6`` of its layer's median); a row whose median token rms for a layer lies
   outside ``[1/BAND_FACTOR, BAND_FACTOR]`` × that layer's median over the sampled rows (needs
   3 rows or more).
2. **Teacher** (needs the verifier in transformers): for ``teacher_rows`` of those rows, the
   teacher is rebuilt exactly as training builds it
   (:func:`specdraft.artifacts.batches.verifier_targets` on the stored final state with the
   trainer's ``lm_head`` and draft vocabulary, the tensors of :class:`specdraft.train.data.
   Collator`) and compared with a fresh verifier forward on the same tokens (its own
   ``logits`` at the supervised positions, restricted to the draft vocabulary the same way):
   ``KL(fresh || stored)`` in nats, mean over the supervised positions of the checked rows, and
   top-1 agreement (the training label: the draft id of the full-vocabulary argmax, -1 outside).

Tolerance (:data:`TOLERANCE`, per storage format of ``RUN/extract``; set from measurements with
a wide margin, docs/stages.md "train"): mean KL at most ``max_kl`` and top-1 agreement at least
``min_top1``; the measured natural gaps (``benchmarks/teacher_gap.py``) are in
:data:`TOLERANCE`'s comments, the planted faults' figures in tests/train/test_teacher_check.py.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from specdraft.artifacts.batches import verifier_targets

BAND_FACTOR = 8.0  # a row's median rms for a layer may differ from the others' median by 8x
ZERO_REL = 1e-6  # a token rms below this fraction of its layer's median counts as zero

# storage format (without "-zstd") -> (max mean KL nats, min top-1 agreement).
# Natural gaps measured by `python benchmarks/teacher_gap.py --rows 8` (SmolLM2-135M fp32, 8 GSM8K
# rows, 820 supervised positions, full vocabulary): fp32 storage mean KL 1.4e-9 / top-1 1.000;
# bf16 1.1e-5 / 0.996; fp8 2.5e-3 / 0.983; a bf16 fresh forward against fp32 storage (a GPU run
# checking an fp32 extract) 1.2e-3 / 0.978. Tolerances: 16x the worst fp32/bf16 gap, 20x fp8's.
TOLERANCE: dict[str, tuple[float, float]] = {
    "fp32": (0.02, 0.90),
    "bf16": (0.02, 0.90),
    "fp8": (0.05, 0.85),
}


@dataclass
class RowTeacher:
    """One checked row: supervised positions, mean and max KL(fresh || stored), top-1 agreement."""

    key: str
    positions: int
    kl_mean: float
    kl_max: float
    top1: float


@dataclass
class TeacherReport:
    """Outcome of :func:`check_teacher`; ``status`` is ``passed``, ``failed`` or ``skipped``
    (``reason`` says why). ``problems`` name rows and layers. Stored in the train manifest."""

    status: str
    reason: str = ""
    storage: str = ""
    tolerance: dict[str, float] = field(default_factory=dict)
    band_rows: list[str] = field(default_factory=list)
    teacher_rows: list[RowTeacher] = field(default_factory=list)
    kl_mean: float | None = None
    top1: float | None = None
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for logs and the doctor."""
        if self.status == "skipped":
            bands = f" (hidden-state bands of {len(self.band_rows)} rows passed)" \
                if self.band_rows else ""
            return f"teacher check skipped: {self.reason}{bands}"
        figures = (f"mean KL(fresh || stored) {self.kl_mean:.2e} nats, top-1 agreement "
                   f"{self.top1:.3f} over {len(self.teacher_rows)} rows"
                   if self.kl_mean is not None else f"{len(self.band_rows)} rows band-checked")
        tail = "; ".join(self.problems)
        return f"teacher check {self.status}: {figures}" + (f"; {tail}" if tail else "")


def sample_rows(n: int, k: int, seed: int) -> list[int]:
    """``min(k, n)`` distinct row indices out of ``n``, seeded, ascending."""
    return sorted(random.Random(seed).sample(range(n), min(k, n)))


def token_rms(row: Any, n_aux: int) -> dict[str, torch.Tensor]:
    """``{"aux id j": [T], "final": [n_sup]}`` float32 rms of every token's state of ``row``
    (``aux_hidden`` [T, n_aux·H] split into layers in order); keys name layers for messages."""
    T = row.aux_hidden.shape[0]
    aux = row.aux_hidden.float().reshape(T, n_aux, -1)  # [T, n_aux, H]
    rms = aux.pow(2).mean(-1).sqrt()  # [T, n_aux]
    out = {f"aux {j}": rms[:, j] for j in range(n_aux)}
    out["final"] = row.final_hidden.float().pow(2).mean(-1).sqrt()  # [n_sup]
    return out


def band_problems(rows: Sequence[Any], aux_ids: Sequence[int]) -> list[str]:
    """Non-finite, zero and out-of-band states of ``rows`` (see the module docstring), each one
    string naming the row key and the layer (``aux id 15`` or ``final``)."""
    return rms_problems({r.key: token_rms(r, len(aux_ids)) for r in rows}, aux_ids)


def rms_problems(rms: dict[str, dict[str, torch.Tensor]], aux_ids: Sequence[int]) -> list[str]:
    """:func:`band_problems` from the :func:`token_rms` of each row key (rows in order)."""
    names = [f"aux id {a}" for a in aux_ids] + ["final"]
    per_row = [list(layers.values()) for layers in rms.values()]
    medians = torch.tensor([[float(t.median()) if t.numel() else float("nan") for t in layers]
                            for layers in per_row])  # [rows, layers]
    ref = medians.nanmedian(dim=0).values  # [layers]
    problems = []
    for key, layers in zip(rms, per_row):
        for j, values in enumerate(layers):
            problems += _layer_problems(key, names[j], values, float(ref[j]), len(rms))
    return problems


def _layer_problems(key: str, layer: str, rms: torch.Tensor, ref: float, n_rows: int
                    ) -> list[str]:
    if rms.numel() == 0:
        return []
    bad = ~torch.isfinite(rms)
    if bad.any():
        return [f"row {key} {layer}: {int(bad.sum())} of {rms.numel()} tokens not finite"]
    zero = rms <= ZERO_REL * ref if ref > 0 else rms == 0
    if zero.any():
        return [f"row {key} {layer}: {int(zero.sum())} of {rms.numel()} tokens all-zero "
                f"(first at token {int(zero.nonzero()[0])})"]
    med = float(rms.median())
    if n_rows >= 3 and ref > 0 and not ref / BAND_FACTOR <= med <= ref * BAND_FACTOR:
        return [f"row {key} {layer}: median token rms {med:.3g} outside the band of the other "
                f"rows ({ref:.3g} x [1/{BAND_FACTOR:g}, {BAND_FACTOR:g}])"]
    return []


@torch.no_grad()
def fresh_logits(model: Any, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The verifier's own logits ``[n, V]`` float32 at ``positions`` of one row (``input_ids``
    [T] int64), from one plain forward (``logits_to_keep`` keeps only those positions)."""
    device = model.get_input_embeddings().weight.device
    out = model(input_ids=input_ids[None].to(device), use_cache=False,
                logits_to_keep=positions.to(device))
    return out.logits[0].float()


@torch.no_grad()
def compare_row(row: Any, model: Any, collator: Any) -> RowTeacher:
    """KL(fresh || stored) and top-1 agreement of one row; ``collator`` is the trainer's
    :class:`specdraft.artifacts.batches.Collator` (its fp32 ``lm_head``, ``draft_ids`` [K] and
    ``t2d_index`` [V], on its device)."""
    device = collator.device
    pos = row.target_positions.long()
    probs, label = verifier_targets(row.final_hidden.to(device), collator.lm_head,
                                    collator.draft_ids, collator.t2d_index)  # [n, K], [n]
    logits = fresh_logits(model, row.input_ids.long(), pos).to(device)  # [n, V]
    logp_fresh = torch.log_softmax(logits[:, collator.draft_ids], dim=-1)  # [n, K]
    logp_stored = probs.clamp_min(torch.finfo(torch.float32).tiny).log()
    kl = (logp_fresh.exp() * (logp_fresh - logp_stored)).sum(-1)  # [n]
    top1 = (collator.t2d_index[logits.argmax(-1)] == label).float()
    if kl.numel() == 0:
        return RowTeacher(row.key, 0, 0.0, 0.0, 1.0)
    return RowTeacher(row.key, int(kl.numel()), float(kl.mean()), float(kl.max()),
                      float(top1.mean()))


def tolerance_for(storage: str) -> tuple[float, float]:
    """``(max mean KL, min top-1)`` of a storage format (``bf16-zstd`` reads as ``bf16``)."""
    return TOLERANCE[storage.removesuffix("-zstd")]


def check_teacher(source: Any, collator: Any, verifier: Any, *, storage: str,
                  teacher_rows: int = 4, band_rows: int = 64, seed: int = 0,
                  skip_reason: str = "") -> TeacherReport:
    """Band-check ``band_rows`` seeded rows of ``source``; compare the teacher of the first
    ``teacher_rows`` of them with ``verifier`` (an HF causal LM; None: that part is skipped
    with ``skip_reason``, the bands still run). Returns the report; raises nothing itself —
    the caller refuses a ``failed`` report (:func:`refusal`)."""
    max_kl, min_top1 = tolerance_for(storage)
    picked = sample_rows(len(source), band_rows, seed)
    rms, checked = {}, []
    for start in range(0, len(picked), 8):  # 8 rows in memory at a time
        for r in source.get_batch(picked[start:start + 8]):
            rms[r.key] = token_rms(r, len(source.aux_layer_ids))
            if verifier is not None and r.target_positions.numel() and \
                    len(checked) < teacher_rows:
                checked.append(r)
    report = TeacherReport("passed", storage=storage,
                           tolerance={"max_kl_mean": max_kl, "min_top1": min_top1},
                           band_rows=list(rms), problems=rms_problems(rms, source.aux_layer_ids))
    if verifier is not None:
        report.teacher_rows = [compare_row(r, verifier, collator) for r in checked]
        _judge(report, max_kl, min_top1)
    report.status = "failed" if report.problems else ("skipped" if verifier is None
                                                      else "passed")
    if report.status == "skipped":
        report.reason = skip_reason
    return report


def _judge(report: TeacherReport, max_kl: float, min_top1: float) -> None:
    rows = report.teacher_rows
    n = sum(r.positions for r in rows)
    if not n:
        return
    report.kl_mean = sum(r.kl_mean * r.positions for r in rows) / n
    report.top1 = sum(r.top1 * r.positions for r in rows) / n
    if not (report.kl_mean <= max_kl and report.top1 >= min_top1):  # NaN fails too
        worst = sorted(rows, key=lambda r: -r.kl_mean)
        named = ", ".join(f"{r.key} (KL {r.kl_mean:.3g}, top-1 {r.top1:.2f})" for r in worst)
        report.problems.append(
            f"stored teacher differs from a fresh verifier forward: mean KL "
            f"{report.kl_mean:.3g} nats (tolerance {max_kl:g}), top-1 agreement "
            f"{report.top1:.3f} (at least {min_top1:g}) on rows {named}: the final state was "
            f"not stored as the output of the verifier's own final norm (pre-norm state, a "
            f"(1 + w) gain applied as w, another model's head?)")


def refusal(report: TeacherReport, where: str) -> str:
    """The one-line error of a failed report, naming ``where`` the rows came from."""
    return (f"{where}: {'; '.join(report.problems)} — re-run `specdraft extract` "
            f"(or pass --no-teacher-check to train anyway)")
