"""The verifier's identity: which model a drafter was trained on, and whether a given one is it.

A drafter reads the verifier's hidden states, so it only works with the verifier it was trained
on. Another model of the same shapes, or the same model with its hidden basis rotated
(QuaRot-style quantization: every residual vector multiplied by an orthogonal ``Q``, the weights
adjusted so the logits are unchanged), loads, passes every shape check and gives τ ≈ 1. This
module records, cheaply enough for a 1T-parameter checkpoint (no weights loaded):

- ``config``: the HF config as transformers normalises it (:func:`normalized_config`) and its
  SHA-256 — without the keys that describe how the weights are stored (``quantization_config``,
  ``torch_dtype``) or where they came from;
- ``quantization``: GPTQ / AWQ / compressed-tensors / bitsandbytes / FP8 from
  ``config.json``'s ``quantization_config``, or the GGUF file type and tensor types;
- ``weights``: a SHA-256 over a fixed sample of the weight bytes (:data:`SAMPLE_TENSORS` tensors
  picked evenly from the sorted tensor names, :data:`SAMPLE_BYTES` bytes at the start, middle
  and end of each), read from the safetensors headers / GGUF tensor table directly;
- ``tokenizer_sha256`` / ``chat_template_sha256``: the vocabulary, added tokens, special ids and
  the ids of a fixed probe text; the chat template string.

``extract`` records it in its manifest, ``train`` carries it in ``drafter_config.json``,
``export`` in ``provenance.json``; ``export``, ``eval`` and ``doctor`` compare the verifier they
are given with :func:`compare` and, when ``RUN/extract`` rows are at hand, recompute a few of
them with :func:`specdraft.artifacts.hidden_states.probe_hidden_states`, which catches a
change of hidden basis that leaves the logits (and so every logit-level check) unchanged. See docs/verifier-binding.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from specdraft.core.errors import ConfigError

IDENTITY_VERSION = 1
SAMPLE_TENSORS = 8        # tensors whose bytes are sampled
SAMPLE_BYTES = 4096       # bytes read at the start, middle and end of each sampled tensor
# Keys of a normalised config that say how or where the weights are stored, not which model.
STORAGE_KEYS = ("quantization_config", "torch_dtype", "dtype", "_name_or_path",
                "transformers_version", "_commit_hash", "architectures", "use_cache",
                "_attn_implementation", "_attn_implementation_autoset", "output_attentions",
                "output_hidden_states", "return_dict", "auto_map")
PROBE_TEXT = "Verifier identity probe: 12,345 × ½ = ? Привет 你好 <think> def f(x): return x**2\n"
Kind = Literal["same", "variant", "other", "unknown"]


def _sha256(obj: Any) -> str:
    data = obj if isinstance(obj, bytes) else json.dumps(obj, sort_keys=True,
                                                          default=str).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- config and quantization


def normalized_config(hf_config: Any) -> dict[str, Any]:
    """The language model's config as a dict (``text_config`` of a VL model), every default
    filled in by transformers, without :data:`STORAGE_KEYS`; so a config.json re-saved by
    another transformers version, or by a quantizer, normalises to the same dict."""
    full = hf_config.to_dict()
    text = full.get("text_config") or full
    kept = {k: v for k, v in sorted(text.items()) if k not in STORAGE_KEYS}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))  # as stored in manifests


def quantization(hf_config: Any, gguf: Any = None) -> dict[str, Any] | None:
    """How the weights are quantized: the GGUF file type and tensor types (``gguf``: a
    ``gguf.GGUFReader`` of the file), else ``quantization_config`` (``quant_method`` first:
    gptq, awq, compressed-tensors, bitsandbytes, fp8, ...), else None for plain float weights."""
    if gguf is not None:
        return _gguf_quantization(gguf)
    q = getattr(hf_config, "quantization_config", None)
    if q is None:
        return None
    q = q.to_dict() if hasattr(q, "to_dict") else dict(q)
    return {"method": str(q.get("quant_method", "unknown")), "config": q}


def _gguf_quantization(reader: Any) -> dict[str, Any]:
    from gguf import LlamaFileType

    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    ft = reader.get_field("general.file_type")
    file_type = LlamaFileType(int(ft.contents())).name if ft is not None else None
    return {"method": "gguf", "file_type": file_type, "tensor_types": dict(sorted(types.items()))}


def describe_quantization(q: dict[str, Any] | None, dtype: str | None = None) -> str:
    """``"gptq 4-bit, group 128"``, ``"gguf MOSTLY_Q4_1"``, or the float dtype."""
    if q is None:
        return f"unquantized ({dtype or 'dtype unknown'})"
    if q["method"] == "gguf":
        return f"gguf {q.get('file_type')}"
    c = q.get("config", {})
    bits = c.get("bits") or c.get("w_bit") or ("4" if c.get("load_in_4bit") else
                                                 "8" if c.get("load_in_8bit") else None)
    group = c.get("group_size") or c.get("q_group_size")
    return q["method"] + (f" {bits}-bit" if bits else "") + (f", group {group}" if group else "")


# ---------------------------------------------------------------- weight fingerprint


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offset of the tensor's data in ``file``
    nbytes: int


def _safetensors_table(directory: Path) -> list[_Tensor]:
    """Every tensor of the ``*.safetensors`` files in ``directory`` from their headers (8-byte
    little-endian header length, JSON header; the safetensors format spec)."""
    table = []
    for f in sorted(directory.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            table.append(_Tensor(name, info["dtype"], tuple(info["shape"]), f, 8 + n + begin,
                                 end - begin))
    return table


def _gguf_table(reader: Any) -> list[_Tensor]:
    """Every tensor of a GGUF file from its tensor-info table (a ``gguf.GGUFReader``; offsets
    are absolute in the file)."""
    path = Path(reader.data.filename)
    return [_Tensor(t.name, t.tensor_type.name, tuple(int(s) for s in t.shape), path,
                    int(t.data_offset), int(t.n_bytes)) for t in reader.tensors]


def _sample_ranges(t: _Tensor) -> list[tuple[int, int]]:
    """``(offset, length)`` of the start, middle and end :data:`SAMPLE_BYTES` of ``t``."""
    n = min(SAMPLE_BYTES, t.nbytes)
    starts = sorted({0, max(0, (t.nbytes - n) // 2), t.nbytes - n})
    return [(t.start + s, n) for s in starts]


def weights_fingerprint(directory: Path, gguf: Any = None) -> dict[str, Any]:
    """SHA-256 of the tensor table (names, dtypes, shapes) and of the sampled bytes of
    :data:`SAMPLE_TENSORS` tensors evenly spaced over the sorted names; reads at most
    ``3 · SAMPLE_TENSORS · SAMPLE_BYTES`` bytes of weights (96 KiB), whatever the model size.
    Raises :class:`ConfigError` when no weights file is found."""
    table = _gguf_table(gguf) if gguf is not None else _safetensors_table(directory)
    if not table:
        raise ConfigError(f"--verifier {directory}: no *.safetensors weights to fingerprint")
    table.sort(key=lambda t: t.name)
    k = min(SAMPLE_TENSORS, len(table))
    picked = [table[round(i * (len(table) - 1) / max(k - 1, 1))] for i in range(k)]
    h = hashlib.sha256(_sha256([[t.name, t.dtype, list(t.shape)] for t in table]).encode())
    read = 0
    for t in dict.fromkeys(picked):
        with open(t.file, "rb") as fh:
            for offset, length in _sample_ranges(t):
                fh.seek(offset)
                h.update(fh.read(length))
                read += length
    return {"sha256": h.hexdigest(), "n_tensors": len(table),
            "sampled": [t.name for t in dict.fromkeys(picked)], "bytes_read": read}


# ---------------------------------------------------------------- tokenizer


def tokenizer_hashes(tokenizer: Any) -> dict[str, str]:
    """``{"tokenizer_sha256", "chat_template_sha256"}``: the vocabulary, added tokens, special
    ids and the ids of :data:`PROBE_TEXT` (which exercise merges and normalisation); the chat
    template string (a dict of named templates as sorted JSON)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    added = sorted((int(i), str(t)) for i, t in tokenizer.added_tokens_decoder.items())
    special = {k: getattr(tokenizer, k, None) for k in
               ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")}
    probe = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    template = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(template, str):
        template = json.dumps(template, sort_keys=True)
    return {"tokenizer_sha256": _sha256([vocab, added, special, probe]),
            "chat_template_sha256": _sha256(template.encode("utf-8"))}


# ---------------------------------------------------------------- identity


_CACHE: dict[tuple, dict[str, Any]] = {}  # one process (``specdraft run``) reads each once


def _stamp(directory: str, gguf_file: str | None) -> tuple:
    """Size and mtime of every file the identity reads: a changed file is read again."""
    files = [Path(directory) / gguf_file] if gguf_file else sorted(
        f for f in Path(directory).iterdir() if f.is_file())
    return tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)


def identify(verifier: str | os.PathLike, *, tokenizer: Any = None,
             trust_remote_code: bool = False) -> dict[str, Any]:
    """The identity record of ``verifier`` (HF directory, ``.gguf`` file or ``smollm2``):
    config hash and normalised config, quantization, weight fingerprint, tokenizer and chat
    template hashes. Reads config, tokenizer and a few KiB of weights; never loads the model.
    ``tokenizer``: an already loaded tokenizer of the same path (saves loading it again).
    Cached per process by the files' sizes and mtimes."""
    from specdraft.core.verifier import resolve_verifier

    directory, gguf_file = resolve_verifier(verifier)
    key = (str(Path(directory).resolve()), gguf_file, trust_remote_code,
           _stamp(directory, gguf_file))
    if key not in _CACHE:
        _CACHE[key] = _identify(directory, gguf_file, verifier, tokenizer, trust_remote_code)
    return {**_CACHE[key], "path": str(verifier)}


def _identify(directory: str, gguf_file: str | None, verifier: str | os.PathLike,
              tokenizer: Any, trust_remote_code: bool) -> dict[str, Any]:
    from specdraft.core.profile import load_hf_config
    from specdraft.core.verifier import load_tokenizer

    gguf = None
    if gguf_file:
        from gguf import GGUFReader

        gguf = GGUFReader(str(Path(directory) / gguf_file))
    hf = load_hf_config(verifier, trust_remote_code=trust_remote_code)
    config = normalized_config(hf)
    if tokenizer is None:
        tokenizer = load_tokenizer(verifier, trust_remote_code=trust_remote_code)
    dtype = getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None)
    return {"version": IDENTITY_VERSION, "path": str(verifier),
            "config_sha256": _sha256(config), "config": config,
            "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
            "quantization": quantization(hf, gguf),
            "weights": weights_fingerprint(Path(directory), gguf),
            **tokenizer_hashes(tokenizer)}


@dataclass
class Comparison:
    """How a given verifier relates to the recorded one.

    ``kind``: ``same`` (config, quantization, tokenizer, template and weight sample equal),
    ``variant`` (same config, tokenizer and template; only the storage differs: quantization,
    dtype and so the weight bytes), ``other`` (anything else: ``differences`` names it), or
    ``unknown`` (nothing recorded: a drafter made before identities existed).
    """

    kind: Kind
    differences: list[str] = field(default_factory=list)
    recorded: str = ""  # describe_quantization of each side
    given: str = ""

    def line(self) -> str:
        """The one line the stages print."""
        if self.kind == "same":
            return "verifier: the model the drafter was trained on (config, tokenizer, weights)"
        if self.kind == "variant":
            return (f"verifier: a quantized variant of the model the drafter was trained on "
                    f"(served {self.given}; trained on {self.recorded}); allowed: same config "
                    f"and tokenizer; the hidden-state probe checks its hidden basis")
        if self.kind == "unknown":
            return "verifier: no identity recorded with the drafter (made before specdraft " \
                   "recorded one): not checked"
        return "verifier: not the model the drafter was trained on: " + "; ".join(
            self.differences)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "differences": self.differences, "recorded": self.recorded,
                "given": self.given, "line": self.line()}


def _config_differences(a: dict[str, Any], b: dict[str, Any], limit: int = 8) -> list[str]:
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    shown = [f"{k} {json.dumps(a.get(k), default=str)} != {json.dumps(b.get(k), default=str)}"
             for k in keys[:limit]]
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return [f"config fields {', '.join(shown)}{more} (trained on != given)"] if keys else []


def compare(recorded: dict[str, Any] | None, given: dict[str, Any]) -> Comparison:
    """Classify ``given`` against ``recorded`` (both :func:`identify` records)."""
    if not recorded:
        return Comparison("unknown")
    diffs = _config_differences(recorded.get("config", {}), given["config"])
    if recorded.get("tokenizer_sha256") != given["tokenizer_sha256"]:
        diffs.append("tokenizer (vocabulary, added/special tokens or how the probe text "
                     "encodes)")
    if recorded.get("chat_template_sha256") != given["chat_template_sha256"]:
        diffs.append("chat template")
    rq = describe_quantization(recorded.get("quantization"), recorded.get("dtype"))
    gq = describe_quantization(given.get("quantization"), given.get("dtype"))
    storage_same = (recorded.get("quantization") == given.get("quantization")
                    and recorded.get("dtype") == given.get("dtype"))
    weights_same = (recorded.get("weights") or {}).get("sha256") == given["weights"]["sha256"]
    if not diffs and storage_same and weights_same:
        return Comparison("same", recorded=rq, given=gq)
    if not diffs and not storage_same:
        return Comparison("variant", recorded=rq, given=gq)
    if not weights_same and storage_same:
        diffs.append(f"weights (sampled bytes of {given['weights']['n_tensors']} tensors: "
                     f"{(recorded.get('weights') or {}).get('sha256', '?')[:12]} != "
                     f"{given['weights']['sha256'][:12]}; same config and storage {gq})")
    return Comparison("other", diffs, recorded=rq, given=gq)


def drafter_identity(drafter_dir: str | os.PathLike, config: Any = None) -> dict[str, Any] | None:
    """The identity carried by a drafter: ``config.verifier_identity`` when given, else its
    ``drafter_config.json``'s (specdraft drafters), else ``provenance.json``'s (exports), else
    None. Reads JSON only, never the weights."""
    recorded = getattr(config, "verifier_identity", None)
    if recorded:
        return recorded
    for name in ("drafter_config.json", "provenance.json"):
        path = Path(drafter_dir) / name
        try:
            recorded = json.loads(path.read_text(encoding="utf-8")).get("verifier_identity")
        except (OSError, ValueError, AttributeError):
            continue
        if recorded:
            return recorded
    return None


def bind(recorded: dict[str, Any] | None, verifier: str, *, allow_other: bool, flag: str,
         tokenizer: Any = None, trust_remote_code: bool = False) -> dict[str, Any]:
    """Compare ``verifier`` with the drafter's recorded identity and return the record a stage
    stores: the :class:`Comparison` (``kind``, ``differences``, ``line``), ``allowed_by_flag``,
    ``served`` (the given verifier's path, quantization and dtype) and ``refusal``: the error
    naming what differs when it is another model and ``allow_other`` is false (``flag`` names
    the flag that allows it), else None. The line is printed on stderr unless refused."""
    import sys

    if not recorded:  # nothing to compare with: the files are not read
        c = Comparison("unknown")
        print(c.line(), file=sys.stderr)
        return {**c.to_dict(), "allowed_by_flag": False, "refusal": None,
                "served": {"path": str(verifier)}}
    given = identify(verifier, tokenizer=tokenizer, trust_remote_code=trust_remote_code)
    c = compare(recorded, given)
    refusal = None
    if c.kind == "other" and not allow_other:
        refusal = (f"--verifier {verifier}: not the model the drafter was trained on "
                   f"({(recorded or {}).get('path')}): {'; '.join(c.differences)}. Use the "
                   f"verifier the drafter was trained on, or pass {flag} to go on anyway "
                   f"(recorded in the results)")
    else:
        print(c.line() + (f" [{flag}]" if c.kind == "other" else ""), file=sys.stderr)
    return {**c.to_dict(), "allowed_by_flag": c.kind == "other" and allow_other,
            "refusal": refusal, "served": {"path": str(verifier), "dtype": given["dtype"],
                                           "quantization": given["quantization"]}}


# ---------------------------------------------------------------- hidden-state probe
