"""The verifier as an engine loads it: an HF directory, a GGUF converted once into one
(``RUN/verifier-hf``), and the engine-facing checks of its config, before any engine starts.

Shared by ``extract --backend vllm`` and ``eval --engine`` (and the serve line of the run
summary, which names the converted directory).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from specdraft.core.errors import InputError
from specdraft.core.jsonl import read_json
from specdraft.core.verifier import DEFAULT_VERIFIER, resolve_verifier, smollm2_gguf


def _read_marker(marker: Path) -> Any:
    """The cache stamp in ``marker``, or None when it cannot be read (the cache is rebuilt)."""
    try:
        return read_json(marker, what="cache stamp")
    except InputError:
        return None


def gguf_to_hf_dir(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write a ``.gguf`` verifier as a plain HF model directory (for engines that need one).

    The GGUF is dequantized by transformers (``gguf_file=``), copied into a plain model of the
    same architecture and config (transformers refuses to save a GGUF-loaded model), saved as
    float32 safetensors with its tokenizer (chat template included). Cached:
    when ``out_dir`` already holds a conversion of this file (same size and mtime, recorded in
    ``out_dir/gguf_source.json``) it is returned unchanged. Written to a temp sibling and
    renamed, so ``out_dir`` is never half-written. Returns ``out_dir``. ``gguf_path`` may be
    ``"smollm2"`` (the embedded default).
    """
    import json
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if str(gguf_path) == DEFAULT_VERIFIER:
        gguf_path = smollm2_gguf()
    src, out = Path(gguf_path), Path(out_dir)
    stamp = {"gguf": str(src.resolve()), "size": src.stat().st_size,
             "mtime_ns": src.stat().st_mtime_ns}
    marker = out / "gguf_source.json"
    if marker.exists() and _read_marker(marker) == stamp:
        return out
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name,
                                                  dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the dequantized weights are plain floats
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name).save_pretrained(tmp)
    (tmp / "gguf_source.json").write_text(json.dumps(stamp), encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return out


ENGINE_HF_DIR = "verifier-hf"  # RUN/verifier-hf: the one converted copy every engine stage serves


def engine_hf_dir(verifier: str, run_dir: str | os.PathLike) -> Path:
    """The verifier as an HF directory an engine can load (vLLM, SGLang): an HF directory as is,
    a GGUF converted once into ``RUN/verifier-hf`` (:func:`gguf_to_hf_dir`, cached by the GGUF's
    size and mtime), shared by ``extract --backend vllm`` and ``eval --engine``.

    Raises :class:`~specdraft.core.errors.ConfigError` for a config the engine would route
    differently from transformers (:func:`specdraft.core.profile.check_engine_routing`),
    before the engine starts.
    """
    directory, gguf_file = resolve_verifier(verifier)
    if gguf_file is None:
        check_engine_config(Path(directory))
        return Path(directory)
    cache = Path(run_dir) / ENGINE_HF_DIR
    if not (cache / "gguf_source.json").exists():
        print(f"converting the GGUF verifier to an HF directory for the engine: {cache}",
              file=sys.stderr)
    return gguf_to_hf_dir(Path(directory) / gguf_file, cache)


def check_engine_config(hf_dir: Path) -> None:
    """The engine-facing checks of ``hf_dir/config.json`` (a VL model's ``text_config`` merged
    over it): the MoE routing keys (:func:`specdraft.core.profile.check_engine_routing`)."""
    from specdraft.core.profile import check_engine_routing, config_json

    config = config_json(hf_dir)
    if config is None:
        return  # the engine's own loader names the missing file
    check_engine_routing(config, str(hf_dir / "config.json"))
