"""Which python runs an engine: the engines keep venvs of their own (vLLM's transformers pin
clashes with ours; SGLang does not install beside either), so every stage that runs one starts
it in a subprocess of the python found here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from specdraft.core.errors import ConfigError

SGLANG_PYTHON_ENV = "SPECDRAFT_SGLANG_PYTHON"

VLLM_PYTHON_ENV = "SPECDRAFT_VLLM_PYTHON"
REPO = Path(__file__).resolve().parents[3]  # the checkout, where `make install-vllm` builds


def vllm_python(explicit: str | None = None) -> str:
    """The python that has vLLM, for every stage that runs the engine in a subprocess (vLLM keeps
    its own venv: its transformers pin clashes with ours): ``explicit`` (``--engine-python``),
    else env ``SPECDRAFT_VLLM_PYTHON``, else this python when it can import vllm (a GPU machine
    with the user's own vLLM), else ``REPO/.venv-vllm/bin/python`` (``make install-vllm``).
    Raises :class:`ConfigError` when none exists."""
    for cand in (explicit, os.environ.get(VLLM_PYTHON_ENV)):
        if cand:
            if not Path(cand).exists():
                raise ConfigError(f"--engine-python {cand}: no such file")
            return str(cand)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    local = REPO / ".venv-vllm" / "bin" / "python"
    if local.exists():
        return str(local)
    raise ConfigError("no python with vLLM found: run `make install-vllm`, or pass "
                      f"--engine-python PY (or set {VLLM_PYTHON_ENV})")


def sglang_python(explicit: str | None = None) -> str:
    """The python that runs SGLang: ``explicit`` (``--engine-python``), else env
    ``SPECDRAFT_SGLANG_PYTHON``, else this python (SGLang's own failure to import names what is
    missing)."""
    return explicit or os.environ.get(SGLANG_PYTHON_ENV) or sys.executable


def engine_python(engine: str, explicit: str | None = None) -> str:
    """:func:`vllm_python` or :func:`sglang_python` for ``engine`` (``vllm`` / ``sglang``)."""
    return vllm_python(explicit) if engine == "vllm" else sglang_python(explicit)


def module_version(python: str, module: str, *, timeout_s: float = 120) -> str | None:
    """``module.__version__`` as ``python`` imports it (a short process run by the one
    launcher, :func:`specdraft.engines.launcher.launch`); None when it cannot import it.
    Raises :class:`~specdraft.engines.process.EngineError` past ``timeout_s`` seconds."""
    import tempfile

    from specdraft.engines.launcher import launch

    with tempfile.TemporaryDirectory(prefix="specdraft-version-") as tmp:
        out = Path(tmp) / "version"
        code = (f"import {module}; open({str(out)!r}, 'w').write(str({module}.__version__))")
        with launch([python, "-c", code], Path(tmp) / "probe.log",
                    name=f"the {module} version probe", deadline_s=timeout_s) as probe:
            rc = probe.wait()
        if rc != 0 or not out.exists():
            return None
        return out.read_text().strip() or None
