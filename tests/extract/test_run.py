"""``specdraft extract`` end to end on the tiny random verifier."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
import torch

from specdraft.core.errors import ConfigError, InputError, StageDirError
from specdraft.core.conventions import supervised_positions
from specdraft.core.batching import plan_batches
from specdraft.extract.config import ExtractConfig
from specdraft.extract.run import run
from specdraft.artifacts.hidden_states import DiskSource, OnlineSource, load_verifier_head
from specdraft.core.storage import CODECS, round_trip

from extract_helpers import random_rows, write_prepared

AUX = (1, 2, 3)


def lengths_12() -> list[int]:
    lens = list(range(20, 32))
    random.Random(3).shuffle(lens)
    return lens


def prepared(tmp_path, lens=None, seed=0):
    ids, masks = random_rows(lens or lengths_12(), vocab=2000, seed=seed)
    return write_prepared(tmp_path / "run", ids, masks), ids, masks


def extract(run_dir, model, **kw):
    values = {"run_dir": run_dir, "verifier": "tiny", "aux_layers": AUX, "batch_tokens": 155,
              "storage": "fp32", "shard_mb": 0.05, **kw}
    return run(ExtractConfig(**values), verifier=model)


def digest(extract_dir) -> dict[str, str]:
    files = [extract_dir / "index.jsonl", *sorted((extract_dir / "shards").iterdir())]
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def test_batched_rows_equal_one_sample_reference(tmp_path, tiny_model):
    run_dir, ids, masks = prepared(tmp_path)
    assert [len(b.rows) for b in plan_batches(lengths_12(), 155)] == [5, 5, 2]
    manifest = extract(run_dir, tiny_model)
    source = DiskSource(run_dir / "extract")
    assert source.keys() == [f"s{i:03d}/0" for i in range(12)]  # dataset order
    assert manifest["counts"]["rows_out"] == 12
    for i, row in enumerate(source.get_batch(range(12))):
        assert row.input_ids.tolist() == ids[i] and row.loss_mask.tolist() == masks[i]
        with torch.no_grad():  # independent reference: HF hidden_states, one sample, no padding
            out = tiny_model(input_ids=torch.tensor([ids[i]]), output_hidden_states=True)
        ref_aux = torch.cat([out.hidden_states[j][0] for j in AUX], dim=-1)  # [T, 3H]
        pos = [p for p in range(len(ids[i]) - 1) if masks[i][p + 1] == 1]
        assert row.target_positions.tolist() == pos
        assert (row.aux_hidden - ref_aux).abs().max() <= 1e-5
        assert (row.final_hidden - out.hidden_states[-1][0, pos]).abs().max() <= 1e-5
    first = digest(run_dir / "extract")
    extract(run_dir, tiny_model, overwrite=True)
    assert digest(run_dir / "extract") == first  # the same bytes on a 2nd run


def test_manifest_head_and_verify(tmp_path, tiny_model):
    run_dir, ids, _ = prepared(tmp_path)
    m = extract(run_dir, tiny_model, storage="bf16", verify=4)
    out = run_dir / "extract"
    H = tiny_model.config.hidden_size
    assert m["aux_layer_ids"] == list(AUX) and m["n_layers"] == 4 and m["hidden_size"] == H
    assert m["vocab_size"] == tiny_model.config.vocab_size
    assert "input to decoder layer i" in m["convention"]
    assert m["verify"]["ok"] and m["verify"]["n"] == 4
    assert 0 < m["verify"]["aux_max_abs_diff"] < 0.05
    total = sum(f.stat().st_size for f in (out / "shards").iterdir())
    tokens = sum(len(r) for r in ids)
    assert m["counts"]["tokens"] == tokens
    assert m["storage"]["bytes_total"] == total
    assert m["storage"]["bytes_per_token"] == round(total / tokens, 2)
    assert all("rank00000-" in f.name for f in (out / "shards").iterdir())
    head = load_verifier_head(out)
    assert torch.equal(head["lm_head.weight"], tiny_model.lm_head.weight)
    assert torch.equal(head["embed_tokens.weight"], tiny_model.model.embed_tokens.weight)
    index = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert [e["key"] for e in index] == [f"s{i:03d}/0" for i in range(12)]
    assert all(e["shard"].startswith("shards/rank00000-") for e in index)
    from specdraft.core.manifest import load_stage_manifest
    from specdraft.core.profile import resolve_profile

    profile = load_stage_manifest(out).profile  # typed: ExtractManifest.profile
    assert profile == resolve_profile(tiny_model.config, model=tiny_model)
    assert (profile.n_layers, profile.hidden_size, profile.final_state, profile.norm_gain) == \
        (4, H, "post_norm", "w")


def test_verifier_config_not_understood_is_refused_before_extracting(tmp_path, tiny_model):
    import copy

    run_dir, _, _ = prepared(tmp_path)
    odd = copy.deepcopy(tiny_model)
    odd.config.rope_parameters = {"rope_type": "superrope", "rope_theta": 1e4}
    with pytest.raises(ConfigError, match=r"`rope_parameters.rope_type` = 'superrope'"):
        extract(run_dir, odd)
    assert not (run_dir / "extract" / "shards").exists()


def test_disk_and_online_sources_identical(tmp_path, tiny_model):
    run_dir, _, _ = prepared(tmp_path)
    extract(run_dir, tiny_model, storage="bf16")
    disk = DiskSource(run_dir / "extract")
    online = OnlineSource(tiny_model, run_dir / "prepare" / "dataset", AUX, storage="bf16")
    assert online.keys() == disk.keys() and len(online) == len(disk) == 12
    assert online.aux_layer_ids == disk.aux_layer_ids and online.hidden_size == disk.hidden_size
    for batch in plan_batches(lengths_12(), 155):  # the same rows in one forward: bit-identical
        for a, b in zip(disk.get_batch(batch.rows), online.get_batch(batch.rows)):
            assert a.key == b.key
            for name in ("input_ids", "loss_mask", "aux_hidden", "final_hidden",
                         "target_positions"):
                x, y = getattr(a, name), getattr(b, name)
                assert x.dtype == y.dtype and torch.equal(x, y), (a.key, name)
    # any other grouping: equal up to one bf16 rounding step of the padded-shape noise
    for a, b in zip(disk.get_batch([3, 0, 7]), online.get_batch([3, 0, 7])):
        assert torch.allclose(a.aux_hidden, b.aux_hidden, rtol=2**-7, atol=1e-6)


def test_compact_storage_decodes_to_rounded_fp32(tmp_path, tiny_model):
    """fp8 / zstd runs store exactly the codec's rounding of the fp32 run (same batches)."""
    run_dir, _, _ = prepared(tmp_path)
    extract(run_dir, tiny_model, storage="fp32")
    exact = DiskSource(run_dir / "extract").get_batch(range(12))
    sizes = {}
    for name in ("bf16", "fp8", "bf16-zstd", "fp8-zstd"):
        m = extract(run_dir, tiny_model, storage=name, overwrite=True)
        sizes[name] = m["storage"]["bytes_per_token"]
        for a, b in zip(exact, DiskSource(run_dir / "extract").get_batch(range(12))):
            G = len(AUX)
            assert torch.equal(b.aux_hidden, round_trip(a.aux_hidden.reshape(-1, G, 64),
                                                        CODECS[name]))
            assert torch.equal(b.final_hidden, round_trip(a.final_hidden[:, None], CODECS[name]))
    assert sizes["fp8"] < 0.6 * sizes["bf16"]
    assert sizes["bf16-zstd"] < sizes["bf16"]


def test_refusals(tmp_path, tiny_model):
    run_dir, ids, masks = prepared(tmp_path)
    with pytest.raises(ConfigError, match=r"--aux-layers 0,2"):
        extract(run_dir, tiny_model, aux_layers=(0, 2))
    with pytest.raises(ConfigError, match=r"outside \[1, 3\]"):  # id N = 4 is refused too
        extract(run_dir, tiny_model, aux_layers=(1, 5), overwrite=True)
    extract(run_dir, tiny_model)
    done = {p.name: p.read_bytes() for p in (run_dir / "extract").iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match=r"outside \[1, 3\]"):  # refused before deleting
        extract(run_dir, tiny_model, aux_layers=(1, 5), overwrite=True)
    assert {p.name: p.read_bytes() for p in (run_dir / "extract").iterdir()
            if p.is_file()} == done and "manifest.json" in done
    with pytest.raises(StageDirError, match="--resume"):
        extract(run_dir, tiny_model)
    with pytest.raises(StageDirError, match="storage"):
        extract(run_dir, tiny_model, storage="bf16", resume=True)
    assert ExtractConfig(run_dir=run_dir, aux_layers="2,15,27").aux_layers == (2, 15, 27)
    bad = tmp_path / "bad"
    masks[4] = masks[4][:-1]
    write_prepared(bad, ids, masks)
    with pytest.raises(InputError, match="s004/0"):
        extract(bad, tiny_model)


def test_target_positions_of_rows_without_targets(tmp_path, tiny_model):
    run_dir = write_prepared(tmp_path / "run", [[5, 6, 7], [8, 9]], [[0, 0, 0], [1, 0]])
    m = extract(run_dir, tiny_model)
    rows = DiskSource(run_dir / "extract").get_batch([0, 1])
    assert m["counts"]["rows_without_targets"] == 2
    assert [r.final_hidden.shape for r in rows] == [(0, 64), (0, 64)]
    assert supervised_positions(rows[1].loss_mask).tolist() == []


def test_progress_counts_real_tokens_and_written_bytes(tmp_path, tiny_model, capsys,
                                                       monkeypatch):
    """The progress line counts the rows' real (unpadded) tokens and the bytes of the shard
    files on disk (issue 40: it showed padded tokens, and 0.0 MiB written for a 166 MiB
    stage); off a terminal it is plain lines, no carriage return."""
    import specdraft.extract.run as extract_run

    seen = []
    real = extract_run.progress_fields

    def spy(samples, writer):
        seen.append((samples, writer.bytes_written, writer.shards_written))
        return real(samples, writer)

    monkeypatch.setattr(extract_run, "progress_fields", spy)
    run_dir, ids, _ = prepared(tmp_path)
    capsys.readouterr()                                     # the test's own dataset writing
    extract(run_dir, tiny_model)
    shards = sorted((run_dir / "extract" / "shards").glob("*.safetensors"))
    on_disk = sum(f.stat().st_size for f in shards)
    tokens = sum(len(r) for r in ids)                       # 20 + 21 + ... + 31 = 306
    assert tokens == 306 and len(shards) > 1
    assert seen[-1] == (12, on_disk, len(shards))
    err = capsys.readouterr().err
    assert "\r" not in err
    final = [ln for ln in err.splitlines() if ln.startswith("extract: 306/306 tokens (100%)")]
    assert len(final) == 1 and final[0].endswith(
        f"; samples 12, written {on_disk / 2**20:.1f} MiB in {len(shards)} shards")
