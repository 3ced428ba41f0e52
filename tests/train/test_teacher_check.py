"""The teacher check catches each planted fault (pre-norm final state, a (1 + w) norm applied as
w through the vLLM backend's conversion, all-zero / NaN / out-of-band rows) and passes a
correct extract; train refuses a failed check before any step and records a skipped one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from memsource import MemorySource
from specdraft.core.errors import InputError
from specdraft.train.config import TrainConfig
from specdraft.artifacts.batches import Collator
from specdraft.train.run import run
from specdraft.artifacts.teacher_check import TOLERANCE, band_problems, check_teacher


class Planted:
    """``source`` with ``edit(row) -> row`` applied to the rows whose index is in ``which``."""

    def __init__(self, source, edit, which):
        self.source, self.edit, self.which = source, edit, set(which)
        self.aux_layer_ids, self.hidden_size = source.aux_layer_ids, source.hidden_size

    def __len__(self):
        return len(self.source)

    def keys(self):
        return self.source.keys()

    def get_batch(self, indices):
        rows = self.source.get_batch(indices)
        return [self.edit(r) if i in self.which else r for i, r in zip(indices, rows)]


def collator(verifier, n_draft=None):
    V = verifier.config.vocab_size
    return Collator(verifier.lm_head.weight.detach(), torch.zeros(n_draft or V, dtype=torch.long),
                    torch.device("cpu"))


def test_correct_rows_pass_with_zero_gap(verifier, source):
    report = check_teacher(source, collator(verifier), verifier, storage="fp32")
    assert report.status == "passed" and not report.problems
    assert len(report.teacher_rows) == 4 and len(report.band_rows) == len(source) == 24
    assert report.kl_mean < 1e-6 and report.top1 == 1.0
    assert all(r.positions == 30 for r in report.teacher_rows)  # p = 5..34 predict the answer


@torch.no_grad()
def prenorm_final(model, row):
    """The row's final state taken before the final norm (what vLLM's id N is)."""
    hs = model(row.input_ids[None], output_hidden_states=True).hidden_states
    pre = model.model.layers[-1](hs[-2], position_embeddings=model.model.rotary_emb(
        hs[-2], torch.arange(row.input_ids.numel())[None]))
    pre = pre[0] if isinstance(pre, tuple) else pre
    return dataclasses.replace(row, final_hidden=pre[0, row.target_positions].float())


def test_prenorm_final_state_is_refused(verifier, source):
    """The stored state is the last layer's output without the final norm: the teacher's
    temperature is wrong (rms of the random residual stream is far from 1), KL is large."""
    row = source.get_batch([0])[0]
    pre = prenorm_final(verifier, row)
    post = verifier.model.norm(pre.final_hidden)
    assert torch.allclose(post, row.final_hidden, atol=1e-5)  # it is the pre-norm state indeed
    planted = Planted(source, lambda r: prenorm_final(verifier, r), range(len(source)))
    report = check_teacher(planted, collator(verifier), verifier, storage="bf16")
    assert report.status == "failed"
    assert report.kl_mean > 30 * TOLERANCE["bf16"][0]
    (problem,) = report.problems
    assert "mean KL" in problem and all(r.key in problem for r in report.teacher_rows)


def test_zero_nan_and_out_of_band_rows_are_named(source):
    rows = source.get_batch(range(12))

    def zero_aux1(r):  # an extraction path that wrote zeros for one layer
        aux = r.aux_hidden.clone()
        aux[:, 64:128] = 0
        return dataclasses.replace(r, aux_hidden=aux)

    def nan_final(r):
        final = r.final_hidden.clone()
        final[3, 7] = float("nan")
        return dataclasses.replace(r, final_hidden=final)

    def scaled(r):
        return dataclasses.replace(r, aux_hidden=r.aux_hidden * 100)

    rows[2], rows[5], rows[7] = zero_aux1(rows[2]), nan_final(rows[5]), scaled(rows[7])
    problems = band_problems(rows, source.aux_layer_ids)
    assert problems[0] == f"row {rows[2].key} aux id 2: 36 of 36 tokens all-zero (first at token 0)"
    assert problems[1] == f"row {rows[5].key} final: 1 of 30 tokens not finite"
    assert len(problems) == 5  # row 7: each of its 3 aux layers out of band
    assert all(p.startswith(f"row {rows[7].key} aux id ") and "outside the band" in p
               for p in problems[2:])
    assert band_problems(source.get_batch(range(12)), source.aux_layer_ids) == []


def test_train_refuses_zero_rows_before_any_step(run_dir, verifier, source):
    def zero(r):
        return dataclasses.replace(r, aux_hidden=torch.zeros_like(r.aux_hidden),
                                   final_hidden=torch.zeros_like(r.final_hidden))

    planted = Planted(source, zero, [3])
    cfg = TrainConfig(run_dir=run_dir, max_steps=2, ttt_steps=1, warmup_steps=0,
                      batch_tokens=144, val_fraction=0.2)
    with pytest.raises(InputError, match=r"row s3/0 aux id 1: 36 of 36 tokens all-zero"):
        run(cfg, verifier=verifier, source=planted)
    assert not (run_dir / "train" / "manifest.json").exists()
    assert not (run_dir / "train" / "checkpoints").exists()


def _files(directory: Path) -> dict:
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_refused_overwrite_keeps_the_trained_drafter(run_dir, verifier, source):
    """``--overwrite`` empties RUN/train only once the checks pass: a failed teacher check
    leaves the drafter it would have replaced byte for byte."""
    def zero(r):
        return dataclasses.replace(r, aux_hidden=torch.zeros_like(r.aux_hidden))

    cfg = TrainConfig(run_dir=run_dir, max_steps=1, ttt_steps=1, warmup_steps=0,
                      batch_tokens=144, val_fraction=0.2)
    run(cfg, verifier=verifier, source=source)
    before = _files(run_dir / "train")
    assert Path("manifest.json") in before and len(before) > 3
    with pytest.raises(InputError, match=r"row s3/0 aux id 1: 36 of 36 tokens all-zero"):
        run(cfg.model_copy(update={"overwrite": True}), verifier=verifier,
            source=Planted(source, zero, [3]))
    assert _files(run_dir / "train") == before


def test_skipped_check_is_recorded(run_dir, verifier, source, tmp_path):
    """A verifier directory transformers cannot load (config but no weights, as for a model
    only an engine serves): the comparison is skipped, the reason lands in the manifest."""
    from safetensors.torch import save_file

    only_config = tmp_path / "engine-only"
    verifier.config.save_pretrained(only_config)
    (run_dir / "extract").mkdir()
    save_file({"lm_head.weight": verifier.lm_head.weight.detach().contiguous(),
               "embed_tokens.weight": verifier.model.embed_tokens.weight.detach().contiguous()},
              str(run_dir / "extract" / "verifier_head.safetensors"))
    cfg = TrainConfig(run_dir=run_dir, max_steps=1, ttt_steps=1, warmup_steps=0,
                      batch_tokens=144, val_fraction=0.2, verifier=str(only_config))
    m = run(cfg, source=source)
    check = m["teacher_check"]
    assert check["status"] == "skipped" and check["teacher_rows"] == []
    assert check["reason"].startswith(f"the verifier {only_config} does not load in "
                                      f"transformers (OSError")
    assert len(check["band_rows"]) == 24 and check["problems"] == []
    m = run(cfg.model_copy(update={"teacher_check": False, "overwrite": True}), source=source)
    assert m["teacher_check"]["status"] == "skipped"
    assert m["teacher_check"]["reason"] == "--no-teacher-check"


# ---------------------------------------------------------------- Gemma: (1 + w) through vLLM's path


class Rows:
    """A source over ready rows."""

    def __init__(self, rows, aux_layer_ids, hidden_size):
        self.rows, self.aux_layer_ids, self.hidden_size = rows, tuple(aux_layer_ids), hidden_size

    def __len__(self):
        return len(self.rows)

    def keys(self):
        return [r.key for r in self.rows]

    def get_batch(self, indices):
        return [self.rows[i] for i in indices]


@torch.no_grad()
def engine_rows(model, verifier, n_rows, aux=(1, 2, 3)):
    """Rows made by the vLLM backend's conversion (:func:`to_packed`) from engine-like states:
    aux ids as HF hidden_states, id N the last layer's output *before* the final norm."""
    from specdraft.core.conventions import supervised_positions
    from specdraft.artifacts.hidden_states import Row
    from specdraft.core.storage import CODECS, decode
    from specdraft.core.aux_ids import extraction_capture_ids
    from specdraft.extract.vllm_backend import to_packed

    g = torch.Generator().manual_seed(1)
    N, rows = verifier.n_layers, []
    for i in range(n_rows):
        ids = torch.randint(0, model.config.vocab_size, (24,), generator=g)
        mask = torch.tensor([0] * 8 + [1] * 16, dtype=torch.uint8)
        grabbed = {}
        hook = model.model.layers[-1].register_forward_hook(
            lambda m, a, out: grabbed.update(pre=out[0] if isinstance(out, tuple) else out))
        try:
            hs = model(ids[None], output_hidden_states=True).hidden_states
        finally:
            hook.remove()
        engine_ids = extraction_capture_ids(aux, N)
        states = {k: hs[k][0] for k in engine_ids if k < N} | {N: grabbed["pre"][0]}
        hidden = torch.stack([states[k] for k in engine_ids], dim=1)  # [T, n_ids, H]
        p = to_packed(hidden, mask.tolist(), aux, engine_ids, verifier, CODECS["fp32"])
        rows.append(Row(f"g{i}/0", ids, mask, decode(p.aux[0], p.aux[1], len(aux)),
                        decode(p.final[0], p.final[1], 1), supervised_positions(mask)))
    return Rows(rows, aux, model.config.hidden_size), hs[-1][0]


def test_gemma_gain_applied_as_w_is_refused(tmp_path):
    """A Gemma-style verifier through the vLLM backend's final norm: with its (1 + w) gain the
    stored final state is HF's last_hidden_state and the check passes; the same states with
    the gain taken as w (the convention bug) are refused."""
    from family_configs import tiny_model

    from specdraft.extract.vllm_backend import load_engine_verifier

    model = tiny_model("gemma3", 1024, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model.save_pretrained(tmp_path / "gemma")
    v = load_engine_verifier(tmp_path / "gemma", torch.float32)
    assert v.norm_gain == "1+w"
    good, last = engine_rows(model, v, 4)
    sup = good.rows[-1].target_positions
    assert torch.allclose(good.rows[-1].final_hidden, last[sup], atol=1e-5)
    report = check_teacher(good, collator(model), model, storage="fp32")
    assert report.status == "passed" and report.kl_mean < 1e-6 and report.top1 == 1.0
    bad, _ = engine_rows(model, dataclasses.replace(v, norm_gain="w"), 4)
    report = check_teacher(bad, collator(model), model, storage="fp32")
    assert report.status == "failed" and report.kl_mean > 10 * TOLERANCE["fp32"][0]
    assert report.top1 < 0.5, report.top1
