"""Codecs and shard files: round trips, fp8 scales with outliers, zstd losslessness."""

from __future__ import annotations

import torch

from specdraft.core.storage import (CODECS, ShardBuffer, ShardReader, decode, encode,
                                       round_trip, row_bytes, shard_readable)


def sample(seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    x = torch.randn(6, 3, 16)  # [R, G, H]
    x[2, 1, 5] = 3000.0  # an outlier far beyond e4m3's ±448
    x[4, 0] = 0.0  # an all-zero group
    return x


def test_fp32_and_bf16_round_trip():
    x = sample()
    assert torch.equal(round_trip(x, CODECS["fp32"]), x.reshape(6, 48))
    assert torch.equal(round_trip(x, CODECS["bf16"]), x.to(torch.bfloat16).float().reshape(6, 48))


def test_fp8_per_row_scales():
    x = sample()
    data, scale = encode(x, CODECS["fp8"])
    assert data.dtype == torch.float8_e4m3fn and data.shape == (6, 48)
    assert scale.shape == (6, 3)
    assert scale[2, 1] == 3000.0 / 448 and scale[4, 0] == 1.0
    y = decode(data, scale, 3).reshape(6, 3, 16)
    assert y[2, 1, 5] == 3000.0  # the outlier maps to ±448 exactly: not clipped
    assert torch.equal(y[4, 0], torch.zeros(16))
    # e4m3 keeps 3 mantissa bits: relative error <= 2**-4, plus the subnormal step near 0
    err = (y - x).abs()
    amax = x.abs().amax(-1, keepdim=True)
    assert bool((err <= 2**-4 * x.abs() + amax / 448 * 2**-9 + 1e-12).all())


def test_shard_round_trip_all_codecs(tmp_path):
    x = sample()
    for name, codec in CODECS.items():
        buf = ShardBuffer(codec)
        rows = [(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 1, 0]), x[:4], x[4:5, :1]),
                (torch.tensor([7, 8]), torch.tensor([0, 0]), x[4:6], x[:0, :1])]  # n_sup = 0
        for k, (ids, mask, aux, fin) in enumerate(rows):
            buf.add(f"s{k}/0", k, ids, mask, encode(aux, codec), encode(fin, codec))
        (tmp_path / "shards").mkdir(exist_ok=True)
        path = tmp_path / "shards" / f"rank00000-{name}.safetensors"
        entries = buf.write(path, {"format": name})
        assert shard_readable(path, entries, codec)
        reader = ShardReader(tmp_path, codec, groups=3, hidden=16)
        for (ids, mask, aux, fin), entry in zip(rows, entries):
            got = reader.read(entry)
            assert torch.equal(got["input_ids"], ids)
            assert torch.equal(got["loss_mask"], mask.to(torch.uint8))
            assert torch.equal(got["aux"], round_trip(aux, codec)), name
            assert torch.equal(got["final"], round_trip(fin, codec)), name
        if not codec.zstd:
            assert path.stat().st_size > row_bytes(4, 1, 3, 16, codec) + row_bytes(2, 0, 3, 16,
                                                                                  codec)
        path.write_bytes(path.read_bytes()[:100])  # truncated: distrusted on resume
        assert not shard_readable(path, entries, codec)


def test_zstd_is_smaller_on_hidden_state_like_data():
    """bf16 values of a narrow distribution share exponent bits, which zstd squeezes."""
    torch.manual_seed(0)
    x = torch.randn(64, 1, 256) * 0.05
    import zstandard

    raw = encode(x, CODECS["bf16"])[0].contiguous().view(torch.uint8).numpy().tobytes()
    assert len(zstandard.ZstdCompressor(level=3).compress(raw)) < 0.9 * len(raw)
