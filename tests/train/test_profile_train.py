"""Train shapes the drafter from the verifier profile (the extract manifest's when stored, never
the raw HF config), and train/best and train/last carry that profile."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from specdraft.core.profile import VerifierProfile, resolve_profile
from specdraft.train.config import TrainConfig
from specdraft.train.run import build_drafter, run, verifier_profile


def cfg(run_dir, **kw) -> TrainConfig:
    values = dict(run_dir=run_dir, epochs=1, ttt_steps=2, batch_tokens=36 * 4, val_fraction=0.2,
                  eval_every=2, save_every=100, log_every=1, max_steps=2)
    values.update(kw)
    return TrainConfig(**values)


def llama3_profile(verifier) -> VerifierProfile:
    """The verifier's profile with a llama3 rotary: what a stored profile may say that the
    in-memory HF config does not."""
    d = resolve_profile(verifier.config, model=verifier).to_dict()
    d["rotary"] = {**d["rotary"], "rope_type": "llama3",
                   "params": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 256}}
    return VerifierProfile.from_dict(d)


def test_stored_profile_wins_over_the_raw_config(tmp_path, verifier):
    stored = llama3_profile(verifier)
    manifest = SimpleNamespace(profile=stored, verifier={})
    assert verifier_profile(cfg(tmp_path), verifier, manifest) == stored
    # no stored profile (online training, older manifests): resolved from the loaded verifier
    assert verifier_profile(cfg(tmp_path), verifier, SimpleNamespace(profile=None, verifier={})) \
        == resolve_profile(verifier.config, model=verifier)


def test_build_drafter_follows_the_profile(tmp_path, verifier, source):
    profile = llama3_profile(verifier)
    d2t = torch.zeros(64, dtype=torch.long)
    t2d = torch.zeros(verifier.config.vocab_size, dtype=torch.bool)
    t2d[:64] = True
    head = {"embed_tokens.weight": verifier.get_input_embeddings().weight.detach(),
            "lm_head.weight": verifier.get_output_embeddings().weight.detach()}
    m = build_drafter(cfg(tmp_path), profile, source, head, d2t, t2d)
    assert m.config.rope_scaling["rope_type"] == "llama3"
    assert VerifierProfile.from_dict(m.config.verifier_profile) == profile


def test_lm_head_starts_at_the_verifiers_draft_rows(tmp_path, verifier, source):
    """Draft id j's lm_head row is the verifier's row of target id j + d2t[j] (a non-identity
    map: target ids 3, 4, 7, 10, ...); frozen only when asked."""
    V = verifier.config.vocab_size
    target_ids = torch.tensor([3, 4, 7, 10] + list(range(20, 80)))
    K = target_ids.numel()
    d2t = target_ids - torch.arange(K)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[target_ids] = True
    W = torch.randn(V, 64)  # a head unlike any the drafter could draw itself
    head = {"embed_tokens.weight": verifier.get_input_embeddings().weight.detach(),
            "lm_head.weight": W}
    m = build_drafter(cfg(tmp_path), resolve_profile(verifier.config, model=verifier), source,
                      head, d2t, t2d)
    assert torch.equal(m.lm_head.weight[0], W[3]) and torch.equal(m.lm_head.weight[3], W[10])
    assert torch.equal(m.lm_head.weight, W[target_ids]) and m.lm_head.weight.requires_grad
    frozen = build_drafter(cfg(tmp_path, lm_head_init="verifier-frozen"),
                           resolve_profile(verifier.config, model=verifier), source, head, d2t,
                           t2d)
    assert torch.equal(frozen.lm_head.weight, W[target_ids])
    assert not frozen.lm_head.weight.requires_grad
    rand = build_drafter(cfg(tmp_path, lm_head_init="random"),
                         resolve_profile(verifier.config, model=verifier), source, head, d2t, t2d)
    assert rand.lm_head.weight.requires_grad
    assert (rand.lm_head.weight - W[target_ids]).abs().max() > 1.0


def test_frozen_lm_head_is_not_trained(run_dir, verifier, source):
    """--lm-head-init verifier-frozen: after training steps lm_head is still the verifier's
    rows while fc (trained) moved."""
    from safetensors.torch import load_file

    run(cfg(run_dir, lm_head_init="verifier-frozen", max_steps=3), verifier=verifier,
        source=source)
    w = load_file(str(run_dir / "train" / "last" / "drafter.safetensors"))
    target_ids = torch.arange(w["d2t"].numel()) + w["d2t"]
    assert torch.equal(w["lm_head.weight"], verifier.lm_head.weight.detach()[target_ids])
    head = {"embed_tokens.weight": verifier.get_input_embeddings().weight.detach(),
            "lm_head.weight": verifier.lm_head.weight.detach()}
    fresh = build_drafter(cfg(run_dir, lm_head_init="verifier-frozen"),
                          resolve_profile(verifier.config, model=verifier), source, head,
                          w["d2t"], w["t2d"])
    assert not torch.equal(w["fc.weight"], fresh.fc.weight.detach())  # the rest did train


def test_best_and_last_carry_the_profile(run_dir, verifier, source):
    run(cfg(run_dir), verifier=verifier, source=source)
    want = resolve_profile(verifier.config, model=verifier)
    for name in ("best", "last"):
        c = json.loads((run_dir / "train" / name / "drafter_config.json").read_text())
        assert VerifierProfile.from_dict(c["verifier_profile"]) == want


def test_the_drafter_carries_the_extracted_verifier_identity(run_dir, verifier, source):
    """RUN/extract's verifier identity travels into train/best and train/last (export, eval
    and doctor compare the verifier they are given with it)."""
    from stubs import write_stub_manifest

    identity = {"version": 1, "path": "/models/v", "config_sha256": "c" * 64,
                "weights": {"sha256": "w" * 64}}
    write_stub_manifest(run_dir / "extract", "extract", hidden_size=64,
                        vocab_size=verifier.config.vocab_size, storage={"format": "fp32"},
                        verifier_identity=identity)
    run(cfg(run_dir), verifier=verifier, source=source)
    for name in ("best", "last"):
        c = json.loads((run_dir / "train" / name / "drafter_config.json").read_text())
        assert c["verifier_identity"] == identity
