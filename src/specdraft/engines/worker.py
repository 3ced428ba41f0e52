"""How a specdraft worker runs in an engine's interpreter: one import policy for every worker
(``extract/vllm_worker.py``, ``eval/engine_worker.py``).

The engine keeps a venv of its own (vLLM pins its own transformers), so a worker is a specdraft
module run as ``ENGINE_PYTHON -m specdraft.<module> ARGS`` with ``PYTHONPATH`` = one directory
that holds the running ``specdraft`` package and nothing else: the worker imports
``specdraft.engines.*`` (stdlib and torch only, e.g. :mod:`specdraft.engines.vllm_cpu`) like
any module, vLLM finds specdraft's connector by module path, and nothing else of this venv
(our transformers) leaks into the engine's. A worker imports only the standard library,
torch, safetensors, the engine and those light ``specdraft.engines`` modules.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

PATH_DIR = "specdraft-path"  # under the worker's scratch directory, when one is needed


def specdraft_path(scratch: str | os.PathLike, package: str | os.PathLike | None = None) -> str:
    """A directory whose only Python package is the running ``specdraft`` (or ``package``): its
    parent directory when it holds nothing else (a checkout's ``src/``, an editable install),
    else ``scratch/specdraft-path`` with a symlink to the package (a wheel in a site-packages
    full of this venv's libraries)."""
    if package is None:
        import specdraft

        package = Path(specdraft.__file__).parent
    package = Path(package).resolve()
    parent = package.parent
    others = [n for n in os.listdir(parent) if n != package.name and not n.startswith(".")
              and not n.endswith((".egg-info", ".dist-info")) and n != "__pycache__"]
    if not others:
        return str(parent)
    where = Path(scratch) / PATH_DIR
    link = where / package.name
    where.mkdir(parents=True, exist_ok=True)
    if not (link.is_symlink() and link.resolve() == package):
        link.unlink(missing_ok=True)
        link.symlink_to(package, target_is_directory=True)
    return str(where)


def worker_command(python: str, module: str, *args: str) -> list[str]:
    """``[python, "-m", module, *args]``: a worker is always run as a module."""
    return [python, "-m", module, *args]


def worker_env(scratch: str | os.PathLike, base: Mapping[str, str] | None = None,
               **overrides: str) -> dict[str, str]:
    """The environment of a worker: ``base`` (default this process's) with ``PYTHONPATH`` =
    :func:`specdraft_path` only, then ``overrides``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = specdraft_path(scratch)
    env.update(overrides)
    return env
