"""``specdraft serve``: the run's verifier in vLLM's OpenAI server, generating AND capturing.

One server does both (the evidence, vLLM 0.32, :mod:`specdraft.engines.capture`): the
``extract_hidden_states`` method leaves the server's output the verifier's own (its draft is
verified like any draft), and specdraft's connector with ``named_only`` writes a file only for
a request that names ``kv_transfer_params["hidden_states_path"]``; chat completions write none.
``tests/engine/test_live_capture.py`` shows both on one real server: a greedy completion equal to
the verifier's in transformers, no file for it, and captured rows equal to the transformers
backend. So serve has no separate generate and capture roles: ``generate`` then ``extract
--endpoint`` talk to the same server, and nobody reloads the verifier between them.

The server is ``ENGINE_PYTHON -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script fails on the CPU wheel), started by the one launcher
(:func:`specdraft.engines.launcher.launch`) with ``PYTHONPATH`` = specdraft alone
(:mod:`specdraft.engines.worker`, so vLLM finds the connector by module path).
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from pathlib import Path
from typing import Any, Iterator

from specdraft.core.errors import ConfigError
from specdraft.engines.live_config import ServeConfig

#: The vLLM reasoning parser of a verifier family whose chat format has think markers
#: (parser names registered in vLLM 0.32 ``vllm/reasoning/__init__.py``).
REASONING_PARSERS = {"qwen3": "qwen3", "qwen3_moe": "qwen3", "kimi_k2": "kimi_k2",
                     "kimi_k25": "kimi_k2", "deepseek_v3": "deepseek_r1"}
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
NAME = "the vLLM server"


def served_verifier_dir(config: ServeConfig) -> tuple[str, Path]:
    """``(verifier as named, the HF directory vLLM loads)``: ``--verifier`` or the run's
    (``RUN/verifier.json`` ``loading.verifier``); a GGUF is converted once under
    ``RUN/verifier-hf`` (:func:`specdraft.engines.verifier_dir.engine_hf_dir`). Raises
    :class:`ConfigError` when neither names one."""
    from specdraft.artifacts import verifier_contract
    from specdraft.engines.verifier_dir import engine_hf_dir

    verifier = config.verifier
    if verifier is None:
        held = verifier_contract.load(config.run_dir)
        if held is None:
            raise ConfigError(f"--run-dir {config.run_dir}: no verifier.json yet; pass "
                              f"--verifier")
        verifier = held.loading.verifier
    else:
        verifier_contract.bind_model_stage(config.run_dir, "serve", verifier,
                                           trust_remote_code=config.trust_remote_code)
    return verifier, engine_hf_dir(verifier, config.run_dir)


def capture_layer_ids(config: ServeConfig, n_layers: int) -> list[int]:
    """The vLLM layer ids the server captures: the aux ids (``--aux-layers``, else the run's
    ``RUN/extract/plan.json``, else the default ``2, N//2, N-3``) and ``N`` (the last layer's
    pre-norm output, from which extract computes the final state)."""
    from specdraft.artifacts.layout import RunLayout
    from specdraft.core.aux_ids import extraction_capture_ids
    from specdraft.core.capture import check_aux_ids, default_aux_ids
    from specdraft.core.jsonl import read_json

    aux: Any = config.aux_layers
    plan = RunLayout(config.run_dir).extract / "plan.json"
    if aux is None and plan.exists():
        aux = (read_json(plan, what="extract plan") or {}).get("aux_layer_ids")
    aux = check_aux_ids(aux, n_layers) if aux else default_aux_ids(n_layers)
    return extraction_capture_ids(aux, n_layers)


def reasoning_parser(config: ServeConfig, model_type: str) -> str | None:
    """The ``--reasoning-parser`` to pass: none when the run's chat format has no think
    markers (or ``none``); the family's (:data:`REASONING_PARSERS`) for ``auto``; else as given.
    Raises :class:`ConfigError` naming ``--reasoning-parser`` for an unknown family that
    thinks."""
    from specdraft.artifacts.verifier_contract import run_verifier

    if config.reasoning_parser not in ("auto", "none"):
        return config.reasoning_parser
    chat = run_verifier(config.run_dir).chat
    if config.reasoning_parser == "none" or chat is None or chat.think is None:
        return None
    if model_type not in REASONING_PARSERS:
        raise ConfigError(f"the run's chat format has think markers ({chat.think.opener} "
                          f"{chat.think.closer}) but specdraft knows no vLLM reasoning parser "
                          f"for model_type {model_type!r}: pass --reasoning-parser NAME or none")
    return REASONING_PARSERS[model_type]


def server_command(config: ServeConfig, python: str, hf_dir: Path, engine_ids: list[int],
                   parser: str | None, *, mla: bool = False) -> list[str]:
    """The exact ``vllm serve`` command (as ``python -m vllm.entrypoints.openai.api_server``):
    the verifier, its names (the model name, then :func:`specdraft.engines.capture.descriptor`,
    which tells clients the captured ids), address, dtype, TP/PP/DP sizes, the capture
    (:func:`~specdraft.engines.capture.speculative_config`,
    :func:`~specdraft.engines.capture.kv_transfer_config` with ``named_only``), prefix caching
    off (every capture request runs its whole prompt), vLLM's reference MLA attention for an
    MLA verifier (``mla``: its profile has MLA facts) in float32 on a CPU
    (:func:`specdraft.engines.vllm_cpu.attention_kwargs`), the reasoning parser,
    ``extra_args``."""
    from specdraft.engines.capture import as_flag, descriptor, kv_transfer_config, \
        speculative_config
    from specdraft.engines.vllm_cpu import attention_kwargs

    spool = config.capture_dir or Path(config.run_dir) / "serve" / "capture"
    cmd = [python, "-m", SERVER_MODULE, "--model", str(hf_dir),
           "--served-model-name", config.served_model_name or hf_dir.name,
           descriptor(engine_ids), "--host", config.host, "--port", str(config.port),
           "--dtype", config.dtype,
           "--tensor-parallel-size", str(config.tensor_parallel_size),
           "--pipeline-parallel-size", str(config.pipeline_parallel_size),
           "--data-parallel-size", str(config.data_parallel_size),
           "--no-enable-prefix-caching",
           "--speculative-config", as_flag(speculative_config(engine_ids)),
           "--kv-transfer-config", as_flag(kv_transfer_config(str(Path(spool).resolve()),
                                                              named_only=True))]
    backend = attention_kwargs(config.dtype).get("attention_config", {}).get("backend")
    if backend and mla:  # an MLA verifier, float32, on a CPU (engines/vllm_cpu.py says why)
        cmd += ["--attention-backend", backend]
    if config.max_model_len:
        cmd += ["--max-model-len", str(config.max_model_len)]
    if parser:
        cmd += ["--reasoning-parser", parser]
    if config.trust_remote_code:
        cmd += ["--trust-remote-code"]
    return cmd + shlex.split(config.extra_args)


def prepare(config: ServeConfig) -> tuple[list[str], str]:
    """``(the server's command, its URL)`` for ``config`` (nothing started)."""
    from specdraft.core.profile import config_json, load_hf_config, resolve_mla
    from specdraft.engines.python import vllm_python

    _, hf_dir = served_verifier_dir(config)
    hf = config_json(hf_dir) or {}
    if "num_hidden_layers" not in hf:
        raise ConfigError(f"{hf_dir}/config.json: no num_hidden_layers")
    ids = capture_layer_ids(config, int(hf["num_hidden_layers"]))
    parser = reasoning_parser(config, str(hf.get("model_type", "")))
    mla = resolve_mla(load_hf_config(hf_dir, trust_remote_code=config.trust_remote_code))
    cmd = server_command(config, vllm_python(config.engine_python), hf_dir, ids, parser,
                         mla=mla is not None)
    return cmd, f"http://{config.host}:{config.port}"


@contextlib.contextmanager
def start(config: ServeConfig, *, env: dict[str, str] | None = None
          ) -> Iterator[tuple[str, list[str], Any]]:
    """Start the server (:func:`prepare`) under the one launcher and yield ``(URL, command,
    the running process)`` once it answers ``/health``; its whole process group is stopped on
    leaving. ``env``: the base environment (None: this process's); ``PYTHONPATH`` becomes
    specdraft's alone (:func:`specdraft.engines.worker.worker_env`). Raises
    :class:`~specdraft.engines.process.EngineError` (with the log's last lines) when it exits
    before it is ready or does not come up within ``startup_s``."""
    from specdraft.engines.launcher import http_ready, launch
    from specdraft.engines.worker import worker_env

    cmd, url = prepare(config)
    log = log_path(config)
    with launch(cmd, log, name=NAME, env=worker_env(log.parent, env),
                ready=http_ready(url, ("/health",)), startup_s=config.startup_s) as server:
        yield url, cmd, server


def log_path(config: ServeConfig) -> Path:
    """``RUN/serve/server-{port}.log``."""
    return Path(config.run_dir) / "serve" / f"server-{config.port}.log"


def serve(config: ServeConfig, *, out: Any = None) -> int:
    """``specdraft serve``: :func:`start`, print the URL, the exact command and the log, then
    stay in the foreground until the server exits or Ctrl-C (either way its whole process group
    is stopped). Returns 0 after Ctrl-C. Raises
    :class:`~specdraft.engines.process.EngineError` when the server fails to start or exits
    with a failure."""
    out = out or sys.stdout
    print(f"serve: starting {NAME} (log {log_path(config)})", file=out, flush=True)
    try:
        with start(config) as (url, cmd, server):
            print(f"serve: {url}/v1\nserve: command: {shlex.join(cmd)}", file=out, flush=True)
            rc = server.wait()
            if rc != 0:
                raise server.exited_error(rc)
    except KeyboardInterrupt:
        print("serve: stopped", file=out, flush=True)
        return 0
    return rc
