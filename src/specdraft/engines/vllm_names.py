"""vLLM's own weight-name mapping, run in vLLM's interpreter: the read-back of an export
(:mod:`specdraft.artifacts.engine_names`) asks the installed engine how it renames each tensor
name, rather than trusting a restatement of its rules.

As a worker (``ENGINE_PYTHON -m specdraft.engines.vllm_names REQUEST OUT``, imports the
standard library and vLLM only, :mod:`specdraft.engines.worker`): ``REQUEST`` is JSON
``{"module:class": [names]}``; each class's ``hf_to_vllm_mapper`` (a vLLM ``WeightsMapper``)
maps each name with its own method; ``OUT`` gets ``{"module:class": {name: [new, shard] or
null}}`` and ``"version"``.

On this side (:func:`installed_mapper`): a :data:`~specdraft.artifacts.engine_names.Mapper`
backed by that worker, asked once per process for every name of a class (one vLLM import,
~10 s on 2 cores), cached under ``~/.cache/specdraft`` keyed by the vLLM install; where no vLLM
python exists, the table of vLLM 0.32's rules (:func:`table_mapper`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Names asked for every class at once, so one engine import answers every export of a run:
#: every tensor name an EAGLE-3 export of any layer can hold, in its two spellings.
_LAYER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "self_attn.q_norm", "self_attn.k_norm", "self_attn.q_a_proj",
          "self_attn.q_a_layernorm", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
          "self_attn.kv_a_layernorm", "self_attn.kv_b_proj", "mlp.gate_proj", "mlp.up_proj",
          "mlp.down_proj", "input_layernorm", "hidden_norm", "post_attention_layernorm"]
COMMON_NAMES = sorted({f"{p}.{n}.weight" for p in ("midlayer", "layers.0") for n in _LAYER}
                      | {"fc.weight", "norm.weight", "embed_tokens.weight", "input_norm.weight"}
                      | {f"fc_norm.{i}.weight" for i in range(8)})


def main(argv: list[str]) -> int:
    """The worker (module doc). Exit 0 with ``OUT`` written; an import error exits non-zero
    with vLLM's traceback in the log."""
    import importlib

    import vllm

    request = json.loads(Path(argv[0]).read_text())
    out: dict[str, Any] = {"version": getattr(vllm, "__version__", "?")}
    for target, names in request.items():
        module, cls = target.split(":")
        mapper = getattr(importlib.import_module(module), cls).hf_to_vllm_mapper
        mapped = {}
        for name in names:
            got = mapper._map_name_with_shard(name)  # the loader's own call (utils.py apply)
            mapped[name] = None if got is None else [got[0], got[1]]
        out[target] = mapped
    Path(argv[1]).write_text(json.dumps(out))
    return 0


def _cache_file(python: str) -> Path | None:
    """The cache of ``python``'s answers, keyed by its path and its site-packages' change
    time (a reinstall of vLLM changes it); None when no site-packages is found beside it."""
    venv = Path(python).resolve().parent.parent
    sites = sorted(venv.glob("lib/python3*/site-packages"))
    if not sites:
        return None
    key = f"{Path(python).absolute()}|{sites[0].stat().st_mtime_ns}"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdraft"
    return base / f"vllm-names-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def ask_vllm(python: str, request: dict[str, list[str]], *, timeout_s: float = 300
             ) -> dict[str, Any]:
    """Run the worker in ``python`` on ``request`` (module doc) and return its answer. Raises
    :class:`~specdraft.engines.process.EngineError` when it fails or times out (the log's last
    lines in the message)."""
    from specdraft.engines.launcher import launch
    from specdraft.engines.worker import worker_command, worker_env

    with tempfile.TemporaryDirectory(prefix="specdraft-names-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "names.json"
        req.write_text(json.dumps(request))
        cmd = worker_command(python, "specdraft.engines.vllm_names", str(req), str(out))
        with launch(cmd, Path(tmp) / "names.log", name="vLLM's weight-name mapping",
                    env=worker_env(tmp), deadline_s=timeout_s) as proc:
            rc = proc.wait()
            if rc != 0 or not out.exists():
                raise proc.exited_error(rc)
        return json.loads(out.read_text())


_MEMO: dict[tuple[str, str], dict[str, Any]] = {}


def installed_mapper(python: str | None = None) -> tuple[Any, str]:
    """``(mapper, source)``: the :data:`~specdraft.artifacts.engine_names.Mapper` of the
    installed vLLM (``python``, else :func:`specdraft.engines.python.vllm_python`'s), with
    ``source`` naming it; the vLLM 0.32 table when no vLLM python exists. A vLLM python that
    fails to answer falls back to the table, said on stderr (never silently)."""
    from specdraft.artifacts.engine_names import table_mapper
    from specdraft.core.errors import ConfigError, SpecdraftError
    from specdraft.engines.python import vllm_python

    try:
        python = python or vllm_python()
    except ConfigError:
        return table_mapper, "specdraft's table of vLLM 0.32 (no vLLM python here)"

    def mapper(module_class: str, names: list[str]) -> dict[str, Any]:
        answer = _answer(python, module_class, names)
        return {n: None if answer[n] is None else tuple(answer[n]) for n in names}

    try:
        _answer(python, next(iter(_classes())), [])
    except SpecdraftError as err:
        print(f"warning: vLLM at {python} could not be asked for its weight-name mapping "
              f"({err}); the read-back uses specdraft's table of vLLM 0.32", file=sys.stderr)
        return table_mapper, "specdraft's table of vLLM 0.32 (the installed vLLM failed)"
    version = _MEMO[(python, "version")]
    return mapper, f"vLLM {version} at {python}"


def _classes() -> list[str]:
    from specdraft.artifacts.engine_names import INNER_MODELS

    return sorted(set(INNER_MODELS.values()))


def _answer(python: str, module_class: str, names: list[str]) -> dict[str, Any]:
    """The worker's mapping of ``names`` (and :data:`COMMON_NAMES`) for ``module_class``,
    from this process's memo, the disk cache, or one worker run for every class."""
    have = _MEMO.get((python, module_class))
    if have is not None and all(n in have for n in names):
        return have
    cache = _cache_file(python)
    if have is None and cache is not None and cache.exists():
        try:
            stored = json.loads(cache.read_text())
            for key, value in stored.items():
                _MEMO[(python, key)] = value
        except (OSError, ValueError):
            pass  # an unreadable cache is asked again
        have = _MEMO.get((python, module_class))
        if have is not None and all(n in have for n in names):
            return have
    request = {c: sorted(set(COMMON_NAMES) | set(_MEMO.get((python, c), {})) |
                         (set(names) if c == module_class else set())) for c in _classes()}
    answer = ask_vllm(python, request)
    for key, value in answer.items():
        _MEMO[(python, key)] = value
    if cache is not None:
        from specdraft.core.atomic import atomic_write_json

        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(cache, answer)
        except OSError as err:  # a read-only home: asked again next process, said once here
            print(f"warning: cannot cache vLLM's weight-name mapping at {cache} ({err})",
                  file=sys.stderr)
    return _MEMO[(python, module_class)]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
