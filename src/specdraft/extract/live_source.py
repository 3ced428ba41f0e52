"""``specdraft train --online --endpoint URL[,URL...]``: training rows whose hidden states are
captured through running ``specdraft serve`` servers ahead of the step that needs them; nothing
is stored but the servers' capture files, each deleted once read.

A row is captured exactly as ``extract --endpoint`` captures it
(:func:`specdraft.extract.endpoint.capture_rows`: one request per row, spread over the servers,
a failed server's rows taken by the others; :func:`specdraft.extract.vllm_backend.to_packed`:
the final norm applied once; rounded by the ``--online-storage`` codec) and decoded as
:class:`specdraft.artifacts.hidden_states.DiskSource` decodes a stored row, so a row equals what
``extract --endpoint --storage S`` followed by ``train`` reads. The servers are checked and
probed before the first step (:func:`specdraft.extract.endpoint.open_servers`).

Prefetch: the trainer names the rows of this rank, in the order its steps will load them, for
the rest of the epoch (:meth:`LiveSource.expect`; the step counter decides them, so a resumed
run asks for the rows from its step on and stores nothing else). A background thread captures
them in chunks of ``--online-prefetch`` N rows; it holds at most one finished chunk while the
trainer consumes the previous one, so at most 3 chunks are alive (one trained on, one ready, one
in capture): ``3 · N · T · (n_aux + 1) · H · b`` bytes (T the rows' mean tokens, b the codec's
bytes per value: 2 for bf16; the final state counts only supervised positions, so this is an
upper bound). Rows asked for out of that order (validation, the teacher check) are captured
when asked. Under torchrun each rank has its own source, its own rows (the plan's row→rank
split, :func:`specdraft.train.data.rank_micro_batches`) and its own capture directory.

This module lives in ``extract`` (it captures); ``specdraft.cli.train`` hands it to the
training stage, which sees only a source.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import torch

from specdraft.artifacts.hidden_states import Row
from specdraft.core.conventions import supervised_positions
from specdraft.core.storage import CODECS, decode


class LiveSource:
    """Rows captured through ``servers`` (already checked and probed), in dataset order.

    ``verifier``: the :class:`~specdraft.extract.vllm_backend.EngineVerifier` in the servers'
    dtype (its final norm is applied here; ``head`` is its ``lm_head``/``embed_tokens``
    ``[V, H]``); ``dataset``: the prepared dataset; ``codec``: the storage rounding;
    ``where``: this rank's capture directory. ``get_batch`` returns :class:`Row` s (fp32,
    CPU) exactly as :class:`~specdraft.artifacts.hidden_states.DiskSource` decodes them.
    """

    def __init__(self, servers: Sequence[Any], verifier: Any, dataset: Any,
                 aux_ids: Sequence[int], codec: Any, where: Path, *, slots: int,
                 timeout_s: float, prefetch: int, inputs: dict[str, Any] | None = None) -> None:
        from specdraft.core.aux_ids import extraction_capture_ids
        from specdraft.extract.run import _row_table

        self.servers, self.verifier, self.dataset = list(servers), verifier, dataset
        self.aux_layer_ids = tuple(int(a) for a in aux_ids)
        self.engine_ids = extraction_capture_ids(self.aux_layer_ids, verifier.n_layers)
        self.hidden_size, self.codec, self.where = verifier.hidden_size, codec, where
        self.slots, self.timeout_s, self.chunk = slots, timeout_s, prefetch
        self.head = dict(verifier.head)
        self.inputs = inputs or {}
        self._keys, self._lengths = _row_table(dataset)
        self._prefetch: _Prefetch | None = None
        self.served = {"prefetched": 0, "on_demand": 0}  # rows handed out, by path

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> list[str]:
        return list(self._keys)

    def lengths(self) -> list[int]:
        return list(self._lengths)

    def capture(self, indices: Sequence[int]) -> dict[int, tuple]:
        """Capture the dataset rows ``indices`` now: ``{row: (input_ids, loss_mask, Packed)}``
        (the packed states in ``codec``). Raises what
        :func:`specdraft.extract.endpoint.capture_rows` raises."""
        from specdraft.extract.endpoint import capture_rows
        from specdraft.extract.run import _load_rows

        rows = list(indices)
        ids, masks = _load_rows(self.dataset, rows, self._keys, self._lengths)
        job = {"rows": rows, "keys": self._keys, "ids": ids, "masks": masks,
               "aux_ids": list(self.aux_layer_ids), "engine_ids": self.engine_ids,
               "verifier": self.verifier, "codec": self.codec, "capture_dir": self.where,
               "timeout_s": self.timeout_s}
        got: dict[int, tuple] = {}

        class _Collect:  # the writer capture_rows hands each row to, in plan order
            def submit(self, positions, row_ids, row_masks, packed) -> None:
                got[positions[0]] = (row_ids[0], row_masks[0], packed)

        capture_rows(self.servers, job, _Collect(), slots=self.slots, timeout_s=self.timeout_s)
        return got

    def expect(self, order: Sequence[int]) -> None:
        """The rows this rank's coming steps load, in order: captured ahead in the
        background (module doc); replaces the previous expectation."""
        self.close()
        self._prefetch = _Prefetch(self, list(order), self.chunk)

    def get_batch(self, indices: Sequence[int]) -> list[Row]:
        """The rows at ``indices``: from the prefetch when they are its next rows, else
        captured now."""
        pre = self._prefetch
        if pre is not None and pre.is_next(indices):
            items = pre.take(len(indices))
            self.served["prefetched"] += len(items)
        else:
            got = self.capture(indices)
            items = [got[i] for i in indices]
            self.served["on_demand"] += len(items)
        return [self._row(i, *item) for i, item in zip(indices, items)]

    def _row(self, i: int, ids: Sequence[int], mask: Sequence[int], packed: Any) -> Row:
        aux = decode(packed.aux[0], packed.aux[1], len(self.aux_layer_ids))
        final = decode(packed.final[0], packed.final[1], 1)
        loss_mask = torch.as_tensor(list(mask), dtype=torch.uint8)
        return Row(self._keys[i], torch.as_tensor(list(ids), dtype=torch.long), loss_mask,
                   aux, final, supervised_positions(loss_mask))

    def close(self) -> None:
        """Stop the prefetch thread (its captured rows are dropped)."""
        if self._prefetch is not None:
            self._prefetch.halt()
            self._prefetch = None


class _Prefetch:
    """A thread capturing ``order`` in chunks of ``chunk`` rows, one finished chunk queued."""

    def __init__(self, source: LiveSource, order: list[int], chunk: int) -> None:
        self.order, self.chunk, self.pos = order, chunk, 0
        self.ready: queue.Queue = queue.Queue(maxsize=1)
        self.current: dict[int, tuple] = {}
        self.received = 0  # chunks taken from ``ready``
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(source,), daemon=True,
                                       name="live-prefetch")
        self.thread.start()

    def chunks(self) -> list[list[int]]:
        return [self.order[s: s + self.chunk] for s in range(0, len(self.order), self.chunk)]

    def _run(self, source: LiveSource) -> None:
        for part in self.chunks():
            if self.stopped.is_set():
                return
            try:
                item = ("rows", source.capture(part))
            except BaseException as err:  # noqa: BLE001 - raised in the trainer's thread
                item = ("error", err)
            while not self.stopped.is_set():
                with contextlib.suppress(queue.Full):
                    self.ready.put(item, timeout=0.2)
                    break
            if item[0] == "error":
                return

    def is_next(self, indices: Sequence[int]) -> bool:
        return list(indices) == self.order[self.pos: self.pos + len(indices)]

    def take(self, n: int) -> list[tuple]:
        """The next ``n`` rows of ``order`` (waits for their chunk). Raises RuntimeError when a
        chunk does not hold exactly the rows asked of it, or the capture's error."""
        out = []
        for _ in range(n):
            i = self.order[self.pos]
            if i not in self.current:
                kind, value = self.ready.get()
                if kind == "error":
                    raise value
                want = self.chunks()[self.received]
                if sorted(value) != sorted(want):
                    raise RuntimeError(f"train --endpoint: prefetch chunk {self.received} holds "
                                       f"rows {sorted(value)}, the plan asked {sorted(want)}")
                self.received += 1
                self.current.update(value)
            out.append(self.current.pop(i))
            self.pos += 1
        return out

    def halt(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)


def open_live_source(cfg: Any, env: Any) -> LiveSource:
    """The :class:`LiveSource` of ``train --online --endpoint`` for this rank (``env.rank``):
    the run's verifier bound (rank 0) and read from ``--verifier``'s directory (config, head,
    final norm; the weights stay with the servers), the servers checked and probed with the
    dataset's shortest row (:func:`specdraft.extract.endpoint.open_servers`) before any step.
    Raises :class:`~specdraft.core.errors.ConfigError` / ``EngineError`` as ``open_servers``."""
    from specdraft.artifacts.layout import RunLayout
    from specdraft.artifacts.verifier_contract import bind_model_stage
    from specdraft.core.capture import check_aux_ids, default_aux_ids
    from specdraft.core.manifest import input_hash
    from specdraft.core.rundir import require_stage
    from specdraft.extract.endpoint import open_servers
    from specdraft.extract.run import _load_dataset, _load_rows, _row_table
    from specdraft.extract.vllm_backend import engine_dtype, load_engine_verifier, \
        verifier_hf_dir

    require_stage(cfg.run_dir, "prepare")
    if env.is_main:
        bind_model_stage(cfg.run_dir, "train", cfg.verifier)
    hf_dir = verifier_hf_dir(cfg)
    verifier = load_engine_verifier(hf_dir, engine_dtype(SimpleNamespace(
        dtype="auto", device=str(env.device))))
    n = verifier.n_layers
    aux = check_aux_ids(cfg.aux_layers, n) if cfg.aux_layers else default_aux_ids(n)
    ds = _load_dataset(cfg.run_dir)
    keys, lens = _row_table(ds)
    row = min(range(len(lens)), key=lens.__getitem__)
    ids, _ = _load_rows(ds, [row], keys, lens)
    base = cfg.capture_dir or RunLayout(cfg.run_dir).train / "live"
    view = SimpleNamespace(endpoint=cfg.endpoint, endpoint_timeout_s=cfg.endpoint_timeout_s,
                           capture_dir=base, run_dir=cfg.run_dir, dtype="auto")
    servers, record, verifier = open_servers(view, verifier, aux, (keys[row], row, ids[0]),
                                             rank=env.rank)
    if env.is_main:
        print(f"train: --endpoint {', '.join(record['servers'])}: checked and probed; "
              f"prefetch {cfg.online_prefetch} rows", file=sys.stderr, flush=True)
    from specdraft.extract.endpoint import capture_dir

    return LiveSource(servers, verifier, ds, aux, CODECS[cfg.online_storage],
                      capture_dir(view, env.rank), slots=cfg.endpoint_concurrency,
                      timeout_s=cfg.endpoint_timeout_s, prefetch=cfg.online_prefetch,
                      inputs={"prepare": input_hash(RunLayout(cfg.run_dir).prepare)})
