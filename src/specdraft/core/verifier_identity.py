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
- ``weights``: a fingerprint every tensor contributes to (:func:`weights_fingerprint`): the
  tensor table (names, dtypes, shapes), and from each tensor :data:`STRATA` windows of
  :data:`WINDOW` bytes, one in each equal stratum of its bytes at an offset drawn from the
  tensor's name (a tensor smaller than that is read whole), hashed per layer (``groups``: a
  fine-tune of one layer is named) and as a whole; ``scheme="full"`` hashes every byte instead.
  Read from the safetensors headers / GGUF tensor table directly, never loading the model. The
  sampled scheme reads ``STRATA * WINDOW`` bytes per tensor (under 1 GB for 10^6 tensors); it
  cannot see a change that misses every window (a few rows of a large tensor): ``full`` can, at
  the disk's read speed (docs/verifier-binding.md has both costs per GB, measured);
- ``values``: for float tensors (F32/F16/BF16), :data:`VALUES_PER_TENSOR` element values at
  fixed strata of each tensor, so that a copy in another float dtype is accepted as a
  ``variant`` only when its values agree within that dtype's rounding (:func:`compare`); a
  GGUF of llama's layout records the same values dequantized, under the HF names, each with
  its block's grid step as tolerance (:func:`gguf_values`); a packed GPTQ/AWQ copy records
  none, so its weights are not compared and :func:`bind` refuses it unless the flag accepts it;
- ``tokenizer_sha256`` / ``chat_template_sha256``: the vocabulary, added tokens, special ids and
  the ids of a fixed probe text; the chat template string.

``extract`` records it in its manifest, ``train`` carries it in ``drafter_config.json``,
``export`` in ``provenance.json``; ``export``, ``eval`` and ``doctor`` compare the verifier they
are given with :func:`compare` and, when ``RUN/extract`` rows are at hand, recompute a few of
them with :func:`specdraft.artifacts.hidden_states.probe_hidden_states`, which catches a
change of hidden basis that leaves the logits (and so every logit-level check) unchanged. See
docs/verifier-binding.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from specdraft.core.errors import ConfigError

IDENTITY_VERSION = 2
STRATA = 4                # windows per tensor, one per equal stratum of its bytes
WINDOW = 256              # bytes per window
VALUES_PER_TENSOR = 4     # element values recorded per float tensor (the variant check)
# Relative tolerance of a value re-stored in each float dtype: one round-to-nearest moves a
# value by at most half an ulp, 2^-(mantissa bits + 1) of it (bf16: 7 bits, 2^-8; f16: 10 bits,
# 2^-11, doubled for subnormal-adjacent values; f32: 23 bits). A variant's value must be within
# the coarser dtype's of the recorded one: a 1 % fine-tune re-stored in bf16 is not.
FLOAT_RTOL = {"F32": 2 ** -23, "F16": 2 ** -10, "BF16": 2 ** -8}
_V1_SAMPLE_TENSORS, _V1_SAMPLE_BYTES = 8, 4096  # identity version 1 (records made before v2)
# Keys of a normalised config that say how or where the weights are stored, not which model.
STORAGE_KEYS = ("quantization_config", "torch_dtype", "dtype", "_name_or_path",
                "transformers_version", "_commit_hash", "architectures", "use_cache",
                "_attn_implementation", "_attn_implementation_autoset", "output_attentions",
                "output_hidden_states", "return_dict", "auto_map")
PROBE_TEXT = "Verifier identity probe: 12,345 × ½ = ? Привет 你好 <think> def f(x): return x**2\n"
Scheme = Literal["sampled", "full"]
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


def describe_quantization(q: dict[str, Any] | None, dtype: str | None = None,
                          stored: dict[str, int] | None = None) -> str:
    """``"gptq 4-bit, group 128"``, ``"gguf MOSTLY_Q4_1"``, or the float dtype (``stored``: the
    fingerprint's tensors per dtype, named when config.json's dtype is not what is stored)."""
    if q is None:
        kinds = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
        held = [kinds.get(k, k) for k in (stored or {})]
        if held and held != [dtype]:
            return f"unquantized (stored {'/'.join(held)}; config says {dtype})"
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


def _windows(t: _Tensor) -> list[tuple[int, int]]:
    """``(offset, length)`` of the bytes of ``t`` that the sampled scheme reads: the whole
    tensor when it is at most ``2 * STRATA * WINDOW`` bytes, else one :data:`WINDOW` in each of
    :data:`STRATA` equal strata, at an offset drawn from the tensor's name (deterministic, and
    not the same place in every tensor)."""
    if t.nbytes <= 2 * STRATA * WINDOW:
        return [(t.start, t.nbytes)]
    out, seed = [], hashlib.sha256(t.name.encode()).digest()
    for s in range(STRATA):
        lo, hi = s * t.nbytes // STRATA, (s + 1) * t.nbytes // STRATA
        jitter = int.from_bytes(seed[4 * s:4 * s + 4], "little") % (hi - lo - WINDOW + 1)
        out.append((t.start + lo + jitter, WINDOW))
    return out


def _full_ranges(t: _Tensor, chunk: int = 1 << 23) -> list[tuple[int, int]]:
    return [(t.start + o, min(chunk, t.nbytes - o)) for o in range(0, t.nbytes, chunk)] or \
        [(t.start, 0)]


_LAYER = re.compile(r"(?:^|\.)(?:layers|blk|h|block|blocks)\.(\d+)\.")


def layer_group(name: str) -> str:
    """``"layer 29"`` for a decoder layer's tensor (HF ``model.layers.29.…``, GGUF ``blk.29.…``),
    else ``"other"`` (embeddings, final norm, head)."""
    m = _LAYER.search(name)
    return f"layer {m.group(1)}" if m else "other"


def weights_fingerprint(directory: Path, gguf: Any = None, *,
                        scheme: Scheme = "sampled") -> dict[str, Any]:
    """The weights' fingerprint (module doc): ``{"scheme", "sha256", "groups": {layer group:
    sha256[:16]}, "n_tensors", "bytes_read", "values"}``. Every tensor contributes; ``scheme``
    ``"full"`` reads every byte; ``dtypes``: tensors per stored dtype (how the weights are
    stored, whatever config.json says). Raises :class:`ConfigError` when no weights file is
    found."""
    table = _gguf_table(gguf) if gguf is not None else _safetensors_table(directory)
    if not table:
        raise ConfigError(f"--verifier {directory}: no *.safetensors weights to fingerprint")
    table.sort(key=lambda t: t.name)
    groups: dict[str, Any] = {}
    read, values = 0, {}
    ranges = _full_ranges if scheme == "full" else _windows
    handles: dict[Path, Any] = {}
    try:
        for t in table:
            fh = handles.get(t.file) or handles.setdefault(t.file, open(t.file, "rb"))
            h = groups.setdefault(layer_group(t.name), hashlib.sha256())
            h.update(json.dumps([t.name, t.dtype, list(t.shape)]).encode())
            for offset, length in ranges(t):
                fh.seek(offset)
                h.update(fh.read(length))
                read += length
            if gguf is None and t.dtype in FLOAT_RTOL:
                values[t.name] = [t.dtype, _values(fh, t)]
        if gguf is not None:
            values = gguf_values(gguf)
    finally:
        for fh in handles.values():
            fh.close()
    digests = {g: h.hexdigest()[:16] for g, h in sorted(groups.items())}
    dtypes: dict[str, int] = {}
    for t in table:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
    return {"scheme": scheme, "sha256": _sha256(digests), "groups": digests,
            "n_tensors": len(table), "dtypes": dict(sorted(dtypes.items())),
            "bytes_read": read, "values": values}


def _values(fh: Any, t: _Tensor) -> list[float]:
    """:data:`VALUES_PER_TENSOR` elements of a float tensor, one at the middle of each equal
    stratum of its elements, as Python floats (rounded to 9 significant digits for JSON)."""
    size = {"F32": 4, "F16": 2, "BF16": 2}[t.dtype]
    n = t.nbytes // size
    out = []
    for i in range(min(VALUES_PER_TENSOR, n)):
        fh.seek(t.start + size * ((2 * i + 1) * n // (2 * min(VALUES_PER_TENSOR, n))))
        raw = fh.read(size)
        if t.dtype == "F32":
            v = struct.unpack("<f", raw)[0]
        elif t.dtype == "F16":
            v = struct.unpack("<e", raw)[0]
        else:  # bfloat16: the high half of a float32
            v = struct.unpack("<f", b"\x00\x00" + raw)[0]
        out.append(float(f"{v:.9g}"))
    return out


# GGUF block types -> grid levels of a block (2^bits): a dequantized value lies within one grid
# step, (max - min) / (levels - 1) of its 32-value block (or max|x| / (levels / 2) for the
# symmetric types), of the float it was quantized from: half a step from rounding, doubled for
# the k-quants' own 6/8-bit quantized scales and mins (ggml-quants.c's block layouts).
GGUF_LEVELS = {"Q4_0": 16, "Q4_1": 16, "Q4_K": 16, "Q5_0": 32, "Q5_1": 32, "Q5_K": 32,
               "Q6_K": 64, "Q8_0": 256, "Q8_1": 256, "Q8_K": 256, "Q2_K": 4, "Q3_K": 8}
_HF_LLAMA_LAYER = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                   "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                   "input_layernorm", "post_attention_layernorm")


def _gguf_hf_names(reader: Any) -> dict[str, str] | None:
    """GGUF tensor name -> the HF (transformers Llama) name of the same tensor, by gguf-py's
    own ``TensorNameMap``; None for an architecture other than ``llama`` (only its layout,
    q/k rows permuted by llama.cpp's converter, is undone here)."""
    import gguf as gg

    arch = reader.get_field("general.architecture")
    if arch is None or arch.contents() != "llama":
        return None
    n = int(reader.get_field("llama.block_count").contents())
    names = ["model.embed_tokens", "model.norm", "lm_head"] + [
        f"model.layers.{i}.{p}" for i in range(n) for p in _HF_LLAMA_LAYER]
    table = gg.get_tensor_name_map(gg.MODEL_ARCH.LLAMA, n)
    out = {}
    for hf in names:
        g = table.get_name(hf)
        if g is not None:
            out[g + ".weight"] = hf + ".weight"
    return out


def _unpermuted_row(reader: Any, hf_name: str, row: int) -> int:
    """The GGUF row holding HF row ``row`` of ``hf_name``: llama.cpp's converter permutes the
    rows of ``q_proj``/``k_proj`` per head (``[heads, 2, d/2]`` → ``[heads, d/2, 2]``, for its
    rotary layout), so HF row ``h·d + half·d/2 + j`` is GGUF row ``h·d + 2j + half``."""
    if not hf_name.endswith(("q_proj.weight", "k_proj.weight")):
        return row
    heads = int(reader.get_field("llama.attention.head_count").contents())
    hidden = int(reader.get_field("llama.embedding_length").contents())
    d = hidden // heads
    h, rem = divmod(row, d)
    half, j = divmod(rem, d // 2)
    return h * d + 2 * j + half


def gguf_values(reader: Any) -> dict[str, list[Any]]:
    """The variant check's values of a GGUF file, comparable with a safetensors record's
    (:func:`_values`): under the HF tensor names, at the same element indices of the HF layout,
    dequantized by gguf-py (``gguf.quants.dequantize``, only the rows holding them), with a
    third list, each value's absolute tolerance (one grid step of its block,
    :data:`GGUF_LEVELS`; 0 for float tensors, compared within :data:`FLOAT_RTOL`). Empty (the
    weights then cannot be compared: said) for an architecture other than llama or a block
    type outside :data:`GGUF_LEVELS`."""
    names = _gguf_hf_names(reader)
    if names is None:
        return {}
    out: dict[str, list[Any]] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        hf = names.get(t.name)
        if hf is None or (kind not in GGUF_LEVELS and kind not in FLOAT_RTOL):
            return {}
        out[hf] = _gguf_tensor_values(reader, t, hf, kind)
    return out


def _gguf_tensor_values(reader: Any, t: Any, hf: str, kind: str) -> list[Any]:
    from gguf.quants import dequantize

    width = int(t.shape[0])  # GGUF ne[0]: the HF row length
    n = int(t.n_elements)
    k = min(VALUES_PER_TENSOR, n)
    vals, tols = [], []
    for i in range(k):
        r, c = divmod((2 * i + 1) * n // (2 * k), width)
        g = _unpermuted_row(reader, hf, r)
        data = t.data[g:g + 1] if t.data.ndim > 1 else t.data
        row = dequantize(data, t.tensor_type).reshape(-1)
        vals.append(float(f"{float(row[c]):.9g}"))
        if kind in GGUF_LEVELS:
            block = row[c // 32 * 32:c // 32 * 32 + 32].astype("float64")
            levels = GGUF_LEVELS[kind]
            step = max((block.max() - block.min()) / (levels - 1),
                       abs(block).max() / (levels // 2))
            tols.append(float(f"{step:.6g}"))
        else:
            tols.append(0.0)
    return [kind, vals, tols]


def _v1_fingerprint(directory: Path, gguf: Any = None) -> dict[str, Any]:
    """Identity version 1's fingerprint (8 tensors evenly spaced over the sorted names, 4 KiB
    at the start, middle and end of each), kept to compare with drafters recorded before
    version 2."""
    table = _gguf_table(gguf) if gguf is not None else _safetensors_table(directory)
    if not table:
        raise ConfigError(f"--verifier {directory}: no *.safetensors weights to fingerprint")
    table.sort(key=lambda t: t.name)
    k = min(_V1_SAMPLE_TENSORS, len(table))
    picked = [table[round(i * (len(table) - 1) / max(k - 1, 1))] for i in range(k)]
    h = hashlib.sha256(_sha256([[t.name, t.dtype, list(t.shape)] for t in table]).encode())
    read = 0
    for t in dict.fromkeys(picked):
        with open(t.file, "rb") as fh:
            n = min(_V1_SAMPLE_BYTES, t.nbytes)
            for start in sorted({0, max(0, (t.nbytes - n) // 2), t.nbytes - n}):
                fh.seek(t.start + start)
                h.update(fh.read(n))
                read += n
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
             trust_remote_code: bool = False, scheme: Scheme | Literal["v1"] = "sampled"
             ) -> dict[str, Any]:
    """The identity record of ``verifier`` (HF directory, ``.gguf`` file or ``smollm2``):
    config hash and normalised config, quantization, weight fingerprint (``scheme``: sampled,
    full, or ``v1`` to compare with a version-1 record), tokenizer and chat template hashes.
    Reads config, tokenizer and a sample of the weights; never loads the model.
    ``tokenizer``: an already loaded tokenizer of the same path (saves loading it again).
    Cached per process by the files' sizes and mtimes."""
    from specdraft.core.verifier import resolve_verifier

    directory, gguf_file = resolve_verifier(verifier)
    key = (str(Path(directory).resolve()), gguf_file, trust_remote_code, scheme,
           _stamp(directory, gguf_file))
    if key not in _CACHE:
        _CACHE[key] = _identify(directory, gguf_file, verifier, tokenizer, trust_remote_code,
                                scheme)
    return {**_CACHE[key], "path": str(verifier)}


def recorded_scheme(recorded: dict[str, Any] | None) -> str:
    """The fingerprint scheme of a record: ``v1`` for version-1 records, else its ``scheme``."""
    if not recorded or recorded.get("version", 1) < 2:
        return "v1"
    return (recorded.get("weights") or {}).get("scheme", "sampled")


def identify_like(recorded: dict[str, Any] | None, verifier: str | os.PathLike,
                  **kw: Any) -> dict[str, Any]:
    """:func:`identify` ``verifier`` with the fingerprint scheme ``recorded`` was made with, so
    that :func:`compare` compares like with like."""
    return identify(verifier, scheme=recorded_scheme(recorded), **kw)


def _identify(directory: str, gguf_file: str | None, verifier: str | os.PathLike,
              tokenizer: Any, trust_remote_code: bool, scheme: str) -> dict[str, Any]:
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
    # ``dtype`` (transformers >= 4.56; ``torch_dtype`` is its deprecated alias, which warns on
    # every read); a config of an older transformers holds ``torch_dtype`` as a plain attribute
    dtype = getattr(hf, "dtype", None) or vars(hf).get("torch_dtype")
    weights = _v1_fingerprint(Path(directory), gguf) if scheme == "v1" else \
        weights_fingerprint(Path(directory), gguf, scheme=scheme)
    return {"version": 1 if scheme == "v1" else IDENTITY_VERSION, "path": str(verifier),
            "config_sha256": _sha256(config), "config": config,
            "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
            "quantization": quantization(hf, gguf), "weights": weights,
            **tokenizer_hashes(tokenizer)}


@dataclass
class Comparison:
    """How a given verifier relates to the recorded one.

    ``kind``: ``same`` (config, quantization, tokenizer, template and weight fingerprint equal),
    ``variant`` (same config, tokenizer and template, stored in another dtype or quantization;
    ``weights_checked``: its float values agreed with the recorded ones within the coarser
    dtype's rounding, else they could not be compared: packed quantization, renamed tensors,
    and only the hidden-state probe vouches for it), ``other`` (anything else, a variant whose
    values disagree included: ``differences`` names it), or ``unknown`` (nothing recorded: a
    drafter made before identities existed).
    """

    kind: Kind
    differences: list[str] = field(default_factory=list)
    recorded: str = ""  # describe_quantization of each side
    given: str = ""
    weights_checked: bool = True
    requantized: bool = False  # the sides' quantization differs (the probe's loose tier)

    def line(self) -> str:
        """The one line the stages print."""
        if self.kind == "same" and not self.weights_checked:
            return ("verifier: config, tokenizer and storage of the model the drafter was "
                    "trained on; weights not compared (fingerprinted by another specdraft "
                    "version)")
        if self.kind == "same":
            return "verifier: the model the drafter was trained on (config, tokenizer, weights)"
        if self.kind == "variant":
            how = ("its float values agree with the recorded ones within the dtype's rounding "
                   "(a GGUF's dequantized values within one step of its block's grid)"
                   if self.weights_checked else "its weights could not be compared with the "
                   "recorded ones (packed or renamed tensors): only the hidden-state probe "
                   "vouches for it")
            return (f"verifier: a variant of the model the drafter was trained on (served "
                    f"{self.given}; trained on {self.recorded}); allowed: same config and "
                    f"tokenizer, {how}")
        if self.kind == "unknown":
            return "verifier: no identity recorded with the drafter (made before specdraft " \
                   "recorded one): not checked"
        return "verifier: not the model the drafter was trained on: " + "; ".join(
            self.differences)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "differences": self.differences, "recorded": self.recorded,
                "given": self.given, "weights_checked": self.weights_checked,
                "requantized": self.requantized, "line": self.line()}


def _config_differences(a: dict[str, Any], b: dict[str, Any], limit: int = 8) -> list[str]:
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    shown = [f"{k} {json.dumps(a.get(k), default=str)} != {json.dumps(b.get(k), default=str)}"
             for k in keys[:limit]]
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return [f"config fields {', '.join(shown)}{more} (trained on != given)"] if keys else []


def _groups_named(groups: list[str], limit: int = 6) -> str:
    more = f" (+{len(groups) - limit} more)" if len(groups) > limit else ""
    return ", ".join(groups[:limit]) + more


def value_differences(recorded: dict[str, Any], given: dict[str, Any]
                      ) -> tuple[list[str], bool]:
    """``(groups whose float values disagree, comparable)`` between two fingerprints'
    ``values``: comparable when every recorded float tensor has values in ``given``; a pair
    agrees when ``|a - b| <= rtol * max(|a|, |b|) + 1e-7 + tol`` with ``rtol`` the coarser
    float dtype's (:data:`FLOAT_RTOL`) and ``tol`` the larger absolute tolerance a dequantized
    GGUF value carries (:func:`gguf_values`: one grid step of its block; 0 for floats)."""
    rv, gv = recorded.get("values") or {}, given.get("values") or {}
    if not rv or any(name not in gv for name in rv):
        return [], False
    bad = set()
    for name, (rdt, rvals, *rtols) in rv.items():
        gdt, gvals, *gtols = gv[name]
        rtol = max(FLOAT_RTOL.get(rdt, 0.0), FLOAT_RTOL.get(gdt, 0.0))
        absolute = [max(x) for x in zip(*(rtols or [[0.0] * len(rvals)]),
                                        *(gtols or [[0.0] * len(gvals)]))]
        if len(rvals) != len(gvals) or any(
                abs(a - b) > rtol * max(abs(a), abs(b)) + 1e-7 + tol
                for a, b, tol in zip(rvals, gvals, absolute)):
            bad.add(layer_group(name))
    return sorted(bad, key=_group_order), True


def _group_order(g: str) -> tuple[int, int]:
    return (0, int(g.split()[1])) if g.startswith("layer ") else (1, 0)


def compare(recorded: dict[str, Any] | None, given: dict[str, Any]) -> Comparison:
    """:func:`_classify`, with ``requantized`` set when the two records' ``quantization``
    differ (a packed quantization on either side: the hidden-state probe expects its noise)."""
    c = _classify(recorded, given)
    c.requantized = bool(recorded) and (recorded or {}).get("quantization") != \
        given.get("quantization")
    return c


def _classify(recorded: dict[str, Any] | None, given: dict[str, Any]) -> Comparison:
    """Classify ``given`` against ``recorded`` (both :func:`identify` records; a fresh ``given``
    is made with the recorded scheme, :func:`identify_like`). Two records of different
    fingerprint schemes (a drafter recorded by an older specdraft against a newer run) compare
    everything but the weights, and say so (``weights_checked`` false)."""
    if not recorded:
        return Comparison("unknown")
    diffs = _config_differences(recorded.get("config", {}), given["config"])
    if recorded.get("tokenizer_sha256") != given["tokenizer_sha256"]:
        diffs.append("tokenizer (vocabulary, added/special tokens or how the probe text "
                     "encodes)")
    if recorded.get("chat_template_sha256") != given["chat_template_sha256"]:
        diffs.append("chat template")
    rw, gw = recorded.get("weights") or {}, given["weights"]
    rq = describe_quantization(recorded.get("quantization"), recorded.get("dtype"),
                               rw.get("dtypes"))
    gq = describe_quantization(given.get("quantization"), given.get("dtype"), gw.get("dtypes"))
    storage_same = (recorded.get("quantization") == given.get("quantization")
                    and recorded.get("dtype") == given.get("dtype")
                    and (rw.get("dtypes") == gw.get("dtypes")
                         or None in (rw.get("dtypes"), gw.get("dtypes"))))  # v1: none
    if recorded_scheme(recorded) != recorded_scheme(given) and not diffs:
        return Comparison("same" if storage_same else "variant", recorded=rq, given=gq,
                          weights_checked=False)
    weights_same = rw.get("sha256") == gw["sha256"]
    if not diffs and storage_same and weights_same:
        return Comparison("same", recorded=rq, given=gq)
    if not diffs and not storage_same:
        bad, comparable = value_differences(rw, gw)
        if not bad:
            return Comparison("variant", recorded=rq, given=gq, weights_checked=comparable)
        diffs.append(f"weights: float values differ beyond the stored dtypes' rounding in "
                     f"{_groups_named(bad)} (served {gq}: a fine-tune stored in another "
                     f"dtype?)")
    elif not weights_same:
        diffs.append(_weights_difference(rw, gw, gq))
    return Comparison("other", diffs, recorded=rq, given=gq)


def _weights_difference(rw: dict[str, Any], gw: dict[str, Any], storage: str) -> str:
    """The weights clause of a refusal: the layer groups whose fingerprint differs."""
    rg, gg = rw.get("groups") or {}, gw.get("groups") or {}
    groups = sorted((g for g in set(rg) | set(gg) if rg.get(g) != gg.get(g)), key=_group_order)
    what = f"in {_groups_named(groups)}" if groups else \
        f"{(rw.get('sha256') or '?')[:12]} != {gw['sha256'][:12]}"
    scheme = gw.get("scheme", "v1 sample")
    return (f"weights ({scheme} fingerprint of {gw['n_tensors']} tensors differs {what}; "
            f"same config and storage {storage})")


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
    given = identify_like(recorded, verifier, tokenizer=tokenizer,
                          trust_remote_code=trust_remote_code)
    c = compare(recorded, given)
    refusal = None
    unchecked = c.kind == "variant" and not c.weights_checked  # packed: values not compared
    if c.kind == "other" and not allow_other:
        refusal = (f"--verifier {verifier}: not the model the drafter was trained on "
                   f"({(recorded or {}).get('path')}): {'; '.join(c.differences)}. Use the "
                   f"verifier the drafter was trained on, or pass {flag} to go on anyway "
                   f"(recorded in the results)")
    elif unchecked and not allow_other:
        refusal = (f"--verifier {verifier}: a quantized copy ({c.given}) of the model the "
                   f"drafter was trained on ({c.recorded}) whose weights specdraft cannot "
                   f"compare with the recorded ones (packed GPTQ/AWQ/compressed-tensors "
                   f"tensors, or a GGUF other than llama's layout): nothing but the hidden-state "
                   f"probe vouches for it. Pass {flag} to accept it (recorded in the results), "
                   f"or give the unquantized checkpoint")
    else:
        print(c.line() + (f" [{flag}]" if c.kind == "other" or unchecked else ""),
              file=sys.stderr)
    return {**c.to_dict(), "allowed_by_flag": (c.kind == "other" or unchecked) and allow_other,
            "refusal": refusal, "served": {"path": str(verifier), "dtype": given["dtype"],
                                           "quantization": given["quantization"]}}


# ---------------------------------------------------------------- hidden-state probe
