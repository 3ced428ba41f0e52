"""The converter of specdraft rows into speculators' offline format (benchmarks/peer_data.py):
exact values on a hand-sized row, and (slow) the peer's own dataset class reading it back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import peer_data  # noqa: E402
from specdraft.core.errors import InputError  # noqa: E402
from specdraft.artifacts.hidden_states import Row  # noqa: E402

T, H, N_AUX, EPS = 6, 4, 3, 1e-5
MASK = torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.uint8)  # prompt x0..x2, completion x3..x5
SUP = torch.tensor([2, 3, 4])  # p with MASK[p+1] == 1


def rms_norm(y: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return gain * y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + EPS)


def make_row(seed: int = 0) -> tuple[Row, torch.Tensor, torch.Tensor]:
    """A row as DiskSource returns it, its gain and the verifier's pre-norm states [T, H]."""
    g = torch.Generator().manual_seed(seed)
    gain = 0.5 + torch.rand(H, generator=g)
    pre = torch.randn(T, H, generator=g) * 3
    row = Row("s/0", torch.arange(10, 10 + T), MASK, torch.randn(T, N_AUX * H, generator=g),
              rms_norm(pre, gain)[SUP], SUP)
    return row, gain, pre


def test_mask_shift_by_hand():
    assert peer_data.peer_loss_mask(MASK).tolist() == [0, 0, 1, 1, 1, 0]


def test_peer_reads_exactly_our_target_positions():
    shifted = peer_data.peer_read_positions(peer_data.peer_loss_mask(MASK))
    assert shifted.tolist() == SUP.tolist() == [2, 3, 4]
    # the planted fault: the peer's own convention applied to our mask unshifted would read
    # slot 3 at position 5, where specdraft stored no final state (it would read zeros)
    assert peer_data.peer_read_positions(MASK.long()).tolist() == [3, 4, 5]


def test_hidden_slots_exact_values():
    row, gain, pre = make_row()
    hs = peer_data.peer_hidden(row, gain)
    assert hs.shape == (T, N_AUX + 1, H) and hs.dtype == torch.float32
    for j in range(N_AUX):  # aux layers in id order, bit for bit
        assert torch.equal(hs[:, j], row.aux_hidden[:, j * H:(j + 1) * H])
    assert torch.equal(hs[SUP, N_AUX], row.final_hidden / gain)
    assert torch.equal(hs[[0, 1, 5], N_AUX], torch.zeros(3, H))
    # the peer applies the verifier norm to slot 3: it gets our post-norm state back
    back = rms_norm(hs[SUP, N_AUX], gain)
    assert torch.allclose(back, row.final_hidden, rtol=2e-5, atol=0)
    assert torch.allclose(back, rms_norm(pre, gain)[SUP], rtol=2e-5, atol=0)


def test_zero_gain_refused():
    row, gain, _ = make_row()
    gain[1] = 0.0
    with pytest.raises(InputError, match="s/0.*zero entries"):
        peer_data.peer_hidden(row, gain)


def test_wrong_positions_refused():
    row, gain, _ = make_row()
    bad = Row(row.key, row.input_ids, row.loss_mask, row.aux_hidden, row.final_hidden,
              torch.tensor([3, 4, 5]))
    with pytest.raises(InputError, match="s/0"):
        peer_data.peer_hidden(bad, gain)


def peer_python_or_skip() -> Path:
    """The speculators venv (tests/conftest.py: skipped when it cannot be built, a failure
    under CI)."""
    from prerequisites import speculators_python_or_skip

    return speculators_python_or_skip()


@pytest.mark.slow
def test_speculators_reads_converted_row_as_our_teacher(tmp_path):
    """speculators' ArrowDataset + shift_batch + its teacher (norm with the gain, draft head)
    see exactly our aux features and ids, our supervised columns, and our Collator's teacher
    distribution at each of them."""
    from safetensors.torch import load_file, save_file

    from specdraft.artifacts.batches import Collator

    py = peer_python_or_skip()
    row, gain, _ = make_row(1)
    V, K = 32, 8
    lm_head = torch.randn(V, H, generator=torch.Generator().manual_seed(2)) * 2
    draft = torch.tensor([0, 3, 4, 9, 10, 11, 20, 31])
    d2t = draft - torch.arange(K)
    peer_data.write_offline(tmp_path / "data", [(row.input_ids, peer_data.peer_loss_mask(
        row.loss_mask), peer_data.peer_hidden(row, gain))])
    save_file({"lm_head_draft": lm_head[draft].contiguous(), "gain": gain,
               "eps": torch.tensor([EPS])}, str(tmp_path / "head.safetensors"))
    done = subprocess.run([str(py), str(Path(__file__).parent / "peer_read.py"),
                           str(tmp_path / "data"), str(tmp_path / "head.safetensors"),
                           str(tmp_path / "seen.safetensors")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = load_file(str(tmp_path / "seen.safetensors"))
    assert torch.equal(seen["input_ids"], row.input_ids[1:])
    assert torch.equal(seen["hidden_states"], row.aux_hidden[:-1])
    assert seen["loss_mask"].tolist() == [0, 1, 1, 1, 0]  # columns t = 1, 2, 3 supervised
    ours = Collator(lm_head, d2t, torch.device("cpu"))([row])
    cols = torch.nonzero(seen["loss_mask"]).flatten()
    assert cols.tolist() == (SUP - 1).tolist()
    assert torch.allclose(seen["target_probs"][cols], ours.dense_probs()[0, cols + 1],
                          rtol=1e-4, atol=1e-6)


def tiny_peer_inputs(tmp_path: Path, seed: int) -> tuple:
    """A 6-layer random Llama verifier (hidden 64, vocab 128) and 6 converted rows of 24 tokens
    (completion from position 8, aux ids [1, 3, 4]) in speculators' offline format: returns
    (cfg, embed, lm_head, data dir, verifier dir, generator)."""
    from transformers import LlamaConfig

    g = torch.Generator().manual_seed(seed)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=256, rope_theta=5000.0, tie_word_embeddings=False)
    V, Hs, T = cfg.vocab_size, cfg.hidden_size, 24
    embed, lm_head, gain = torch.randn(V, Hs, generator=g), torch.randn(V, Hs, generator=g), \
        0.5 + torch.rand(Hs, generator=g)
    mask = torch.zeros(T, dtype=torch.uint8)
    mask[8:] = 1
    pos = torch.nonzero(mask[1:] == 1).flatten()
    rows = [Row(f"r{i}/0", torch.randint(0, V, (T,), generator=g), mask,
                torch.randn(T, 3 * Hs, generator=g), torch.randn(len(pos), Hs, generator=g), pos)
            for i in range(6)]
    data = tmp_path / "data"
    peer_data.write_offline(data, [(r.input_ids, peer_data.peer_loss_mask(r.loss_mask),
                                    peer_data.peer_hidden(r, gain)) for r in rows])
    vdir = peer_data.write_verifier_dir(tmp_path / "verifier", cfg, embed, lm_head, gain)
    return cfg, embed, lm_head, data, vdir, g


@pytest.mark.slow
@pytest.mark.parametrize("norms", [False, True], ids=["specdraft-arch", "its-default-norms"])
def test_speculators_trains_on_converted_rows_and_specdraft_reads_its_checkpoint(tmp_path,
                                                                                 norms):
    """peer_speculators.py runs speculators' own trainer on CPU (2 steps) over converted rows;
    its checkpoint loads through specdraft's export reader with our vocab map, our aux ids,
    the verifier's rotary base and its embedding (stored in bf16 by its checkpointer).
    ``norms``: its own default EAGLE-3 (norm before the residual, before fc, on the output),
    read by specdraft as those three fields on."""
    from bench_train_peer import child_env, peer_args
    from peer_quality import eval_ready
    from specdraft.artifacts.drafter import build_model, read_drafter

    py = peer_python_or_skip()
    cfg, embed, _, data, vdir, g = tiny_peer_inputs(tmp_path, 4)
    Hs, V, K, T = cfg.hidden_size, cfg.vocab_size, 32, 24
    draft = torch.randperm(V, generator=g)[:K].sort().values
    d2t, t2d = draft - torch.arange(K), torch.zeros(V, dtype=torch.bool)
    t2d[draft] = True
    peer_data.write_vocab(data, d2t, t2d)
    save = tmp_path / "save"
    cmd = [str(py), str(REPO / "benchmarks" / "peer_speculators.py"), "--threads", "1", "--",
           *peer_args(vdir, data, save, aux=[1, 3, 4], draft_vocab=K, seq=2 * T, ttt=2,
                      epochs=1, lr=1e-3, max_steps=2, norms=norms), "--train-data-ratio", "0.7"]
    done = subprocess.run(cmd, env=child_env(1, None), capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    d = read_drafter(eval_ready(save / "0", tmp_path / "drafter"))
    assert d.format == "speculators"
    assert d.config.aux_layer_ids == (1, 3, 4) and d.config.rope_theta == 5000.0
    assert (d.config.hidden_size, d.config.draft_vocab_size, d.config.vocab_size) == (Hs, K, V)
    assert (d.config.norm_before_residual, d.config.norm_before_fc, d.config.norm_output,
            d.config.fc_norm) == (norms, norms, norms, False)
    assert torch.equal(d.state["d2t"].long(), d2t) and torch.equal(d.state["t2d"].bool(), t2d)
    assert torch.equal(d.state["embed_tokens.weight"], embed.to(torch.bfloat16))
    model = build_model(d)
    assert model.lm_head.weight.shape == (K, Hs)


@pytest.mark.slow
def test_speculators_dflash_trains_on_converted_rows_and_converts_to_vllms_format(tmp_path):
    """speculators' own DFlash trainer (peer_quality.dflash_args: full attention, our block,
    layers and mask token) runs 2 steps on CPU over converted rows; dflash_eval_ready writes its
    checkpoint in vLLM's native DFlash format: target_layer_ids = its capture ids - 1, the same
    mask token and block, bidirectional, every tensor equal to its checkpoint's (bf16 widened).
    A sliding layer in its config is refused (what vLLM's speculators loader would run causal)."""
    import json

    from safetensors.torch import load_file

    from bench_train_peer import child_env
    from peer_quality import dflash_args, dflash_eval_ready
    from specdraft.artifacts.dflash_export import read_dflash

    py = peer_python_or_skip()
    cfg, _, _, data, vdir, _ = tiny_peer_inputs(tmp_path, 5)
    Hs, V, T = cfg.hidden_size, cfg.vocab_size, 24
    save = tmp_path / "save"
    cmd = [str(py), str(REPO / "benchmarks" / "peer_speculators.py"), "--threads", "1", "--",
           *dflash_args(vdir, data, save, aux=[1, 3, 4], seq=2 * T, epochs=1, lr=1e-3,
                        layers=2, block=3, mask_token_id=V - 1),
           "--max-steps", "2", "--train-data-ratio", "0.7"]
    done = subprocess.run(cmd, env=child_env(1, None), capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    c, tensors = read_dflash(dflash_eval_ready(save / "0", tmp_path / "vllm", 6))
    assert c.target_layer_ids == (0, 2, 3) and c.target_num_layers == 6
    assert (c.mask_token_id, c.block_size, c.num_hidden_layers, c.causal) == (V - 1, 3, 2, False)
    assert (c.hidden_size, c.vocab_size, c.rope_theta) == (Hs, V, 5000.0)
    theirs = load_file(str(save / "0" / "model.safetensors"))
    assert set(tensors) == set(theirs)
    assert all(torch.equal(tensors[k], theirs[k].float()) for k in theirs)
    cfg_json = json.loads((save / "0" / "config.json").read_text())
    cfg_json["transformer_layer_config"]["layer_types"] = ["sliding_attention", "full_attention"]
    bad = tmp_path / "sliding"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(cfg_json))
    with pytest.raises(ValueError, match="layer_types"):
        dflash_eval_ready(bad, tmp_path / "never", 6)
    assert not (tmp_path / "never").exists()
