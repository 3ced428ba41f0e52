"""Storage of captured rows: codecs, sharded safetensors files and the index.

Codecs (``--storage``), all measured by ``benchmarks/bench_extract.py``:

- ``fp32``: exact (used by tests), 4 bytes per value;
- ``bf16`` (default): 2 bytes per value, round-to-nearest-even;
- ``fp8``: float8 e4m3 with one fp32 scale per token and aux layer (``amax / 448``; hidden states
  of LLMs have outliers far beyond e4m3's ±448, so a fixed scale would clip them), 1 byte per
  value + 4 bytes per token and layer;
- ``bf16-zstd`` / ``fp8-zstd``: the same values, each row's bytes compressed losslessly with
  Zstandard (``zstandard`` package) so that a row can be read without its neighbours.

A shard ``shards/rank{r:05d}-{s:06d}.safetensors`` holds rows packed along dim 0:
``input_ids`` int32 ``[ΣT]``, ``loss_mask`` uint8 ``[ΣT]``, ``aux`` ``[ΣT, n_aux·H]`` (or
``aux_zstd`` uint8 ``[Σbytes]``), ``aux_scale`` fp32 ``[ΣT, n_aux]`` (fp8 only), ``final``
``[Σn_sup, H]`` (or ``final_zstd``), ``final_scale`` fp32 ``[Σn_sup, 1]`` (fp8 only). An index
entry (one JSON line per row) gives the shard and the offsets: ``tok`` (into the ``[ΣT]``
tensors), ``sup`` (into the ``[Σn_sup]`` tensors), and for zstd ``aux_z`` / ``final_z`` =
``[byte offset, byte length]``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.core.atomic import atomic_save_safetensors

FP8_MAX = 448.0  # largest finite float8 e4m3fn value


@dataclass(frozen=True)
class Codec:
    """How values are stored: element dtype, per-row fp8 scales, zstd compression."""

    name: str
    dtype: torch.dtype
    scaled: bool
    zstd: bool

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


CODECS = {c.name: c for c in (
    Codec("fp32", torch.float32, False, False),
    Codec("bf16", torch.bfloat16, False, False),
    Codec("fp8", torch.float8_e4m3fn, True, False),
    Codec("bf16-zstd", torch.bfloat16, False, True),
    Codec("fp8-zstd", torch.float8_e4m3fn, True, True),
)}


def encode(x: torch.Tensor, codec: Codec) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` ``[R, G, H]`` (any float dtype) → ``(data [R, G·H] codec.dtype, scale)``.

    ``scale`` is ``[R, G]`` fp32 (``amax / 448`` per row and group, 1 for an all-zero group) for
    fp8 codecs, else None. Runs on ``x``'s device.
    """
    R, G, H = x.shape
    if not codec.scaled:
        return x.to(codec.dtype).reshape(R, G * H), None
    xf = x.float()
    amax = xf.abs().amax(dim=-1)  # [R, G]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(codec.dtype)  # [R, G, H]
    return q.reshape(R, G * H), scale


def decode(data: torch.Tensor, scale: torch.Tensor | None, groups: int) -> torch.Tensor:
    """Inverse of :func:`encode`: ``data`` ``[R, G·H]`` → fp32 ``[R, G·H]``."""
    x = data.float()
    if scale is None:
        return x
    R, width = x.shape
    return (x.reshape(R, groups, width // groups) * scale.float()[..., None]).reshape(R, width)


def round_trip(x: torch.Tensor, codec: Codec) -> torch.Tensor:
    """``x`` ``[R, G, H]`` → fp32 ``[R, G·H]`` exactly as stored and read back by ``codec``."""
    data, scale = encode(x, codec)
    return decode(data, scale, x.shape[1])


def row_bytes(seq_len: int, n_sup: int, groups: int, hidden: int, codec: Codec) -> int:
    """Uncompressed bytes of one row: ids + mask (5/token), aux, final and fp8 scales."""
    values = (seq_len * groups + n_sup) * hidden * codec.itemsize
    scales = (seq_len * groups + n_sup) * 4 if codec.scaled else 0
    return seq_len * 5 + values + scales


def _to_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


class ShardBuffer:
    """The rows of one shard, accumulated in memory (CPU tensors) until :meth:`write`."""

    def __init__(self, codec: Codec, level: int = 3) -> None:
        self.codec = codec
        self.entries: list[dict[str, Any]] = []
        self.parts: dict[str, list[torch.Tensor]] = {}
        self._tok = self._sup = 0
        self._zoff = {"aux": 0, "final": 0}
        self._zc = None
        if codec.zstd:
            import zstandard
            self._zc = zstandard.ZstdCompressor(level=level)

    def _put(self, name: str, t: torch.Tensor | None) -> None:
        if t is not None:
            self.parts.setdefault(name, []).append(t)

    def _put_values(self, name: str, data: torch.Tensor, entry: dict[str, Any]) -> None:
        if self._zc is None:
            self._put(name, data)
            return
        blob = self._zc.compress(_to_bytes(data))
        entry[f"{name}_z"] = [self._zoff[name], len(blob)]
        self._zoff[name] += len(blob)
        self._put(f"{name}_zstd", torch.frombuffer(bytearray(blob), dtype=torch.uint8)
                  if blob else torch.zeros(0, dtype=torch.uint8))

    def add(self, key: str, row: int, input_ids: torch.Tensor, loss_mask: torch.Tensor,
            aux: tuple[torch.Tensor, torch.Tensor | None],
            final: tuple[torch.Tensor, torch.Tensor | None]) -> None:
        """Add one row: ids ``[T]`` int32, mask ``[T]`` uint8, encoded ``aux`` ``([T, G·H],
        [T, G] | None)`` and ``final`` ``([n_sup, H], [n_sup, 1] | None)``."""
        T, n = int(input_ids.shape[0]), int(final[0].shape[0])
        entry = {"key": key, "row": row, "seq_len": T, "n_sup": n, "tok": self._tok,
                 "sup": self._sup}
        self._put("input_ids", input_ids.to(torch.int32))
        self._put("loss_mask", loss_mask.to(torch.uint8))
        self._put_values("aux", aux[0], entry)
        self._put("aux_scale", aux[1])
        self._put_values("final", final[0], entry)
        self._put("final_scale", final[1])
        self._tok += T
        self._sup += n
        self.entries.append(entry)

    def write(self, path: Path, metadata: dict[str, str]) -> list[dict[str, Any]]:
        """Write the shard to ``path`` (temp file + fsync + rename); return its index entries
        with ``"shard"`` set to ``shards/<name>``."""
        tensors = {k: torch.cat(v).contiguous() for k, v in self.parts.items()}
        # one metadata key: safetensors writes its metadata map in hash order, and a resumed
        # run must produce the same bytes as an uninterrupted one
        atomic_save_safetensors(tensors, path,
                                metadata={"specdraft": json.dumps(metadata, sort_keys=True)})
        for e in self.entries:
            e["shard"] = f"shards/{path.name}"
        return self.entries


class ShardReader:
    """Reads rows back from shards via their index entries (memory-mapped ``safe_open``).

    Open files are cached (at most ``max_open``). Thread-unsafe: one reader per thread.
    """

    def __init__(self, extract_dir: str | os.PathLike, codec: Codec, groups: int, hidden: int,
                 max_open: int = 16) -> None:
        self.root = Path(extract_dir)
        self.codec, self.groups, self.hidden = codec, groups, hidden
        self.max_open = max_open
        self._open: dict[str, Any] = {}
        self._zd = None
        if codec.zstd:
            import zstandard
            self._zd = zstandard.ZstdDecompressor()

    def _file(self, shard: str) -> Any:
        from safetensors import safe_open

        if shard not in self._open:
            if len(self._open) >= self.max_open:
                self._open.pop(next(iter(self._open)))
            self._open[shard] = safe_open(str(self.root / shard), framework="pt")
        return self._open[shard]

    def _values(self, f: Any, name: str, entry: dict, start: int, rows: int, width: int
                ) -> torch.Tensor:
        if rows == 0:
            return torch.zeros(0, width, dtype=self.codec.dtype)
        if self._zd is None:
            return f.get_slice(name)[start:start + rows]
        off, size = entry[f"{name}_z"]
        blob = f.get_slice(f"{name}_zstd")[off:off + size].numpy().tobytes()
        raw = bytearray(self._zd.decompress(blob, max_output_size=rows * width * 8))
        return torch.frombuffer(raw, dtype=torch.uint8).view(self.codec.dtype).reshape(rows, width)

    def read(self, entry: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Decode one row: ``input_ids`` ``[T]`` int64, ``loss_mask`` ``[T]`` uint8, ``aux``
        fp32 ``[T, G·H]``, ``final`` fp32 ``[n_sup, H]``."""
        f = self._file(entry["shard"])
        t0, T, s0, n = entry["tok"], entry["seq_len"], entry["sup"], entry["n_sup"]
        scaled = self.codec.scaled
        aux = self._values(f, "aux", entry, t0, T, self.groups * self.hidden)
        final = self._values(f, "final", entry, s0, n, self.hidden)
        aux_scale = f.get_slice("aux_scale")[t0:t0 + T] if scaled and T else None
        final_scale = f.get_slice("final_scale")[s0:s0 + n] if scaled and n else None
        return {"input_ids": f.get_slice("input_ids")[t0:t0 + T].to(torch.int64),
                "loss_mask": f.get_slice("loss_mask")[t0:t0 + T].to(torch.uint8),
                "aux": decode(aux, aux_scale if T else None, self.groups),
                "final": decode(final, final_scale if n else None, 1)}


def shard_readable(path: Path, entries: list[dict[str, Any]], codec: Codec) -> bool:
    """True when ``path`` opens as safetensors and holds every row ``entries`` point into."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            n_tok = f.get_slice("input_ids").get_shape()[0]
            need_tok = max(e["tok"] + e["seq_len"] for e in entries)
            ok = n_tok == need_tok
            if codec.zstd:
                for name in ("aux", "final"):
                    size = f.get_slice(f"{name}_zstd").get_shape()[0]
                    ok = ok and size == max(e[f"{name}_z"][0] + e[f"{name}_z"][1]
                                            for e in entries)
            return ok
    except Exception:  # noqa: BLE001 - any unreadable file is recomputed
        return False
