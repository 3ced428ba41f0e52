"""The rank's shard writer: a background thread, so that encoding, compression and disk writes
overlap the verifier's next forward; plus recovery of a killed run.

A shard is *complete* when its file was renamed into place and all its rows (as planned by
:func:`specdraft.core.batching.plan_shards`) are listed in the rank's index part
``index.rank{r:05d}.jsonl`` (appended with fsync after the rename). On resume anything else is
distrusted: listed rows of an incomplete or unreadable shard are dropped, unlisted shard files
are deleted, and those shards are recomputed.
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
from pathlib import Path
from typing import Any, Sequence

import torch

from specdraft.core.atomic import atomic_write_text
from specdraft.core.jsonl import JsonlWriter, iter_jsonl, repair_torn_tail
from specdraft.core.capture import Packed
from specdraft.core.storage import Codec, ShardBuffer, shard_readable


def shard_name(rank: int, shard: int) -> str:
    """``rank{rank:05d}-{shard:06d}.safetensors``: the rank is in every shard name."""
    return f"rank{rank:05d}-{shard:06d}.safetensors"


def part_path(out_dir: Path, rank: int) -> Path:
    """The rank's index part, merged into ``index.jsonl`` at the end."""
    return out_dir / f"index.rank{rank:05d}.jsonl"


def recover(out_dir: Path, rank: int, shard_plan: Sequence[Sequence[int]], codec: Codec
            ) -> set[int]:
    """Keep the complete shards of ``rank`` from an earlier run; return their shard numbers.

    Rewrites the index part with only their entries and deletes this rank's other shard files
    and temp files (never another rank's: the ranks recover concurrently).
    """
    part = part_path(out_dir, rank)
    repair_torn_tail(part)
    by_shard: dict[str, list[dict[str, Any]]] = {}
    if part.exists():
        for _, entry in iter_jsonl(part):
            by_shard.setdefault(entry["shard"], []).append(entry)
    done, kept = set(), []
    for s, rows in enumerate(shard_plan):
        entries = by_shard.get(f"shards/{shard_name(rank, s)}", [])
        complete = sorted(e["row"] for e in entries) == sorted(rows)
        if complete and shard_readable(out_dir / "shards" / shard_name(rank, s), entries, codec):
            done.add(s)
            kept.extend(entries)
    atomic_write_text(part, "".join(json.dumps(e) + "\n" for e in kept))
    for f in (out_dir / "shards").glob(f"rank{rank:05d}-*.safetensors*"):
        if ".tmp-" in f.name or int(f.name.split("-")[1].split(".")[0]) not in done:
            # an orphan of a killed run, or a half-written write's staging directory
            shutil.rmtree(f) if f.is_dir() else f.unlink()
    return done


def progress_fields(samples: int, writer: "RankWriter") -> dict[str, str]:
    """Progress postfix: rows captured, and the bytes of the shard files on disk (a shard is
    written whole when its last row arrives, so this lags the capture by up to a shard)."""
    return {"samples": f"{samples:,}",
            "written": f"{writer.bytes_written / 2**20:.1f} MiB in "
                       f"{writer.shards_written} shards"}


def _to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    """Start a device → host copy (pinned, non-blocking on CUDA); CPU tensors pass through."""
    if t is None or not t.is_cuda:
        return t
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t, non_blocking=True)


class RankWriter:
    """Fills this rank's shards from packed batches in a background thread.

    ``shard_plan[s]`` = the dataset rows of shard ``s``; rows of shards in ``done`` are ignored.
    :meth:`submit` blocks when ``depth`` batches are waiting (bounded memory). An error in the
    thread is raised by the next :meth:`submit` or by :meth:`close`.
    """

    def __init__(self, out_dir: Path, rank: int, shard_plan: Sequence[Sequence[int]],
                 done: set[int], keys: Sequence[str], codec: Codec, metadata: dict[str, str],
                 *, zstd_level: int = 3, depth: int = 2) -> None:
        self.out_dir, self.rank, self.codec = out_dir, rank, codec
        self.keys, self.metadata, self.level = keys, metadata, zstd_level
        self.shard_of = {r: s for s, rows in enumerate(shard_plan) for r in rows}
        self.remaining = {s: len(rows) for s, rows in enumerate(shard_plan) if s not in done}
        self.buffers: dict[int, ShardBuffer] = {}
        self.bytes_written = 0
        self.shards_written = 0
        self._part = JsonlWriter(part_path(out_dir, rank))
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"extract-writer-{rank}",
                                        daemon=True)
        self._thread.start()

    def submit(self, rows: Sequence[int], ids: Sequence[Sequence[int]],
               masks: Sequence[Sequence[int]], packed: Packed) -> None:
        """Queue one captured batch (``rows`` in the order of ``packed``)."""
        self._raise()
        host = Packed(packed.lengths, packed.n_sup,
                      (_to_host(packed.aux[0]), _to_host(packed.aux[1])),
                      (_to_host(packed.final[0]), _to_host(packed.final[1])))
        event = None
        if packed.aux[0].is_cuda:
            event = torch.cuda.Event()
            event.record()
        self._queue.put((list(rows), ids, masks, host, event))

    def close(self, strict: bool = True) -> None:
        """Wait for the queued batches to be written (completed shards are kept).

        ``strict``: raise the thread's error, or an error when a planned shard is incomplete;
        pass False while another error is propagating.
        """
        self._queue.put(None)
        self._thread.join()
        self._part.close()
        if not strict:
            return
        self._raise()
        if self.remaining:
            raise RuntimeError(f"rank {self.rank}: shards {sorted(self.remaining)} incomplete")

    def _raise(self) -> None:
        if isinstance(self._error, OSError):  # disk full, read-only: the CLI reports it as is
            raise self._error
        if self._error is not None:
            raise RuntimeError(f"extract writer thread of rank {self.rank} failed") \
                from self._error

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is not None:
                continue
            try:
                self._write_batch(*item)
            except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
                self._error = err

    def _write_batch(self, rows: list[int], ids: Sequence[Sequence[int]],
                     masks: Sequence[Sequence[int]], packed: Packed, event: Any) -> None:
        if event is not None:
            event.synchronize()
        aux_d, aux_s = packed.aux
        fin_d, fin_s = packed.final
        t0 = s0 = 0
        for b, row in enumerate(rows):
            T, n = packed.lengths[b], packed.n_sup[b]
            s = self.shard_of[row]
            if s in self.remaining:
                buf = self.buffers.setdefault(s, ShardBuffer(self.codec, self.level))
                buf.add(self.keys[row], row, torch.as_tensor(ids[b], dtype=torch.int32),
                        torch.as_tensor(masks[b], dtype=torch.uint8),
                        (aux_d[t0:t0 + T], None if aux_s is None else aux_s[t0:t0 + T]),
                        (fin_d[s0:s0 + n], None if fin_s is None else fin_s[s0:s0 + n]))
                self.remaining[s] -= 1
                if self.remaining[s] == 0:
                    self._flush(s)
            t0, s0 = t0 + T, s0 + n

    def _flush(self, s: int) -> None:
        path = self.out_dir / "shards" / shard_name(self.rank, s)
        entries = self.buffers.pop(s).write(path, self.metadata)
        self._part.write_batch(entries)
        del self.remaining[s]
        self.bytes_written += path.stat().st_size
        self.shards_written += 1
