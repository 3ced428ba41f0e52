"""specdraft's vLLM KV connector: one synchronous, atomic safetensors file per finished request.

Runs inside the vLLM engine (the ``.venv-vllm`` interpreter): imports only stdlib, torch,
safetensors, vllm and :mod:`specdraft.core.atomic` (stdlib only). Registered by
:mod:`specdraft.extract.vllm_worker` with
``kv_connector="SpecdraftHiddenStatesConnector"`` and
``kv_connector_module_path="specdraft.extract.vllm_connector"``.

Contract matched: vLLM 0.32 ``ExampleHiddenStatesConnector``
(``vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py``), used with
the ``extract_hidden_states`` speculative method: the hidden states of the layer ids in
``eagle_aux_hidden_state_layer_ids`` (ascending, as ``_set_aux_hidden_state_layers`` sorts them)
are cached per token in a KV-cache-like buffer; when a request finishes, the scheduler hands its
block ids to the worker side, which reads them out. Only the write differs from the stock class:
its asynchronous device → pinned-host copy needs CUDA (``pin_memory=True`` fails on CPU), so this
class copies synchronously and writes ``hidden_states`` ``[T, n_ids, H]`` (engine dtype) and
``token_ids`` ``[T]`` int64 inside ``<path>.tmp-<pid>/``, fsyncs and renames it to ``<path>``: a
file under its final name is always complete. ``<path>`` is the request's
``kv_transfer_params["hidden_states_path"]`` (``allow_custom_save_path`` must be on), which the
worker derives from the row, so files are matched to rows by identity, never by arrival order.

A live server that also generates (``specdraft serve``) sets ``specdraft_named_only`` in
``kv_connector_extra_config`` (:data:`specdraft.engines.capture.NAMED_ONLY`): then a request
that names no ``hidden_states_path`` (a chat completion) writes nothing and frees its blocks at
once, where the stock class writes every request to ``shared_storage_path/<id>.safetensors``.
"""

from __future__ import annotations

import os

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, PendingSave, extract_from_kv_cache)

from specdraft.core.atomic import atomic_save_safetensors
from specdraft.engines.capture import NAMED_ONLY


class _Done:
    """Stands in for the stock connector's CUDA copy event: the copy already finished."""

    def query(self) -> bool:
        return True


def write_atomic(tensors: dict[str, torch.Tensor], path: str) -> None:
    """Write ``tensors`` to ``path`` through :func:`specdraft.core.atomic.atomic_save_safetensors`
    (never half-written; a killed engine leaves only a ``*.tmp-<pid>`` staging directory)."""
    atomic_save_safetensors({k: v.contiguous() for k, v in tensors.items()}, path)


class SpecdraftHiddenStatesConnector(ExampleHiddenStatesConnector):
    """``ExampleHiddenStatesConnector`` with a synchronous host copy and an atomic write."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        """Read the finished request's hidden states out of the cache and write its file.

        Called on the worker by the base class's ``get_finished``. Only TP rank 0 writes.
        """
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + offsets[None, :]).flatten()
        n = int(pending.token_ids.shape[0])
        hidden = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), n)
        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        write_atomic({"hidden_states": hidden.to("cpu"),  # [T, n_ids, H]
                      "token_ids": pending.token_ids.to(torch.long).clone()}, pending.filename)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is not None:
            os.close(lock_fd)
        self._req_copy_events[pending.req_id] = _Done()  # type: ignore[assignment]

    def request_finished(self, request, block_ids):  # type: ignore[no-untyped-def]
        """The stock scheduler-side hook, except that with ``specdraft_named_only`` a request
        without ``kv_transfer_params["hidden_states_path"]`` saves nothing: ``(False, None)``
        (its blocks are freed at once, no file is written)."""
        named = (request.kv_transfer_params or {}).get("hidden_states_path")
        if named is None and self._kv_transfer_config.get_from_extra_config(NAMED_ONLY, False):
            self._request_filenames.pop(request.request_id, None)
            return False, None
        return super().request_finished(request, block_ids)
