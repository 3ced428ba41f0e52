"""vLLM's hidden-state capture as specdraft configures it, in one place: the offline engine
(``extract/vllm_worker.py``, ``vllm.LLM`` keyword arguments) and a live server (``specdraft
serve``, ``vllm serve`` flags) get the very same two settings from here.

Imports the standard library only (the offline worker imports it in the engine's interpreter,
:mod:`specdraft.engines.worker`).

vLLM 0.32 facts (``site-packages/vllm``):

- ``v1/spec_decode/extract_hidden_states.py``: the ``extract_hidden_states`` speculative method
  (``num_speculative_tokens`` must be 1) stores, per token, the hidden states of the layer ids
  in ``eagle_aux_hidden_state_layer_ids`` in a KV-cache-like buffer; it "does not actually
  perform speculation": its draft is the token just sampled, verified like any draft, so the
  server's output stays the verifier's own (rejection sampling), at the cost of one extra
  position per decode step.
- ``distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py``: a request's
  states are written when it finishes, to ``kv_transfer_params["hidden_states_path"]`` when
  ``allow_custom_save_path`` is on (``build_connector_meta``), else to
  ``shared_storage_path/<request id>.safetensors``: EVERY request, chat completions included
  (``request_finished``). specdraft's connector
  (:class:`specdraft.extract.vllm_connector.SpecdraftHiddenStatesConnector`) writes only the
  requests that name a path when ``named_only`` is set (:data:`NAMED_ONLY`), so one server both
  generates (no file) and captures (a file per capture request).
- The OpenAI server passes a request body's ``kv_transfer_params`` to the engine
  (``entrypoints/openai/completion/protocol.py``: ``extra_args["kv_transfer_params"]``).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

CONNECTOR = "SpecdraftHiddenStatesConnector"
CONNECTOR_MODULE = "specdraft.extract.vllm_connector"
#: ``kv_connector_extra_config`` key: write only requests that name ``hidden_states_path``.
NAMED_ONLY = "specdraft_named_only"
#: A served model name that carries the captured layer ids (``/v1/models`` lists every served
#: name with ``root`` = the model path: ``entrypoints/openai/models/serving.py``).
DESCRIPTOR_PREFIX = "specdraft-capture:"


def speculative_config(engine_ids: Sequence[int]) -> dict[str, Any]:
    """vLLM's ``speculative_config`` that captures the layer ids ``engine_ids`` (vLLM's
    convention, ascending: id k = HF ``hidden_states[k]`` for k < N, id N = the last layer's
    output before the final norm; :func:`specdraft.core.aux_ids.extraction_capture_ids`)."""
    return {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {
                "eagle_aux_hidden_state_layer_ids": [int(i) for i in engine_ids]}}}


def kv_transfer_config(spool: str, *, named_only: bool = False) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` with specdraft's connector writing under ``spool`` (the
    default path of a request that names none; a request's ``hidden_states_path`` wins).
    ``named_only``: a request without a path writes nothing (a server that also generates)."""
    extra: dict[str, Any] = {"shared_storage_path": spool, "allow_custom_save_path": True,
                             "use_synchronization_lock": False}
    if named_only:
        extra[NAMED_ONLY] = True
    return {"kv_connector": CONNECTOR, "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_producer", "kv_connector_extra_config": extra}


def descriptor(engine_ids: Sequence[int]) -> str:
    """The served name that says which layer ids a server captures: ``specdraft-capture:1,2,4``."""
    return DESCRIPTOR_PREFIX + ",".join(str(int(i)) for i in engine_ids)


def parse_descriptor(names: Sequence[str]) -> list[int] | None:
    """The captured layer ids from a server's served names (:func:`descriptor`); None when no
    name carries them (a server specdraft did not start)."""
    for name in names:
        if name.startswith(DESCRIPTOR_PREFIX):
            return [int(x) for x in name[len(DESCRIPTOR_PREFIX):].split(",") if x]
    return None


def as_flag(value: dict[str, Any]) -> str:
    """A JSON object as one ``vllm serve`` flag value (``--speculative-config '{...}'``)."""
    return json.dumps(value, separators=(",", ":"))
