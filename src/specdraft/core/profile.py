"""The verifier profile: every verifier-family convention a stage depends on, resolved once here.

A drafter trains to a good loss and then does not accept when served when one of these is
resolved wrongly (issue #12): the final norm's gain convention, whether a stored final state is
before or after that norm, the rotary type and its parameters, ``max_position_embeddings``, tied
embeddings, and the MoE / MLA facts that change the drafter's shape. Stages read them from here,
never from a raw HF config: this module is the only reader of a verifier's HF config
(:func:`load_hf_config` for ``AutoConfig``, :func:`config_json` for the raw ``config.json`` an
engine reads), checked by ``tests/architecture/test_imports.py``.

Norm gain conventions (transformers 5.24 ``modeling_*.py``):

- ``"w"``: ``w * x / rms(x)`` — Llama, Qwen2/3, Qwen3-MoE, Mistral, gpt-oss, DeepSeek-V3/Kimi-K2;
- ``"1+w"``: ``(1 + w) * x / rms(x)`` — Gemma 1/2/3 (``GemmaRMSNorm``), Qwen3-Next, Qwen3.5
  (their checkpoints store the gain as an offset from 1).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from specdraft.core.conventions import AUX_CONVENTION
from specdraft.core.errors import ConfigError

NormGain = Literal["w", "1+w"]

# model_type -> gain convention of its RMSNorm. A model_type not listed is refused, never guessed.
NORM_GAIN: dict[str, NormGain] = {
    **{t: "w" for t in ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe",
                        "gpt_oss", "deepseek_v3", "kimi_k2", "olmo2", "granite", "phi3")},
    **{t: "1+w" for t in ("gemma", "gemma2", "gemma3", "gemma3_text", "qwen3_next", "qwen3_5",
                          "qwen3_5_moe", "vaultgemma")},
}


def norm_gain(model_type: str) -> NormGain:
    """The RMSNorm gain convention of verifier family ``model_type`` (HF ``config.model_type``).

    Raises :class:`ConfigError` naming ``model_type`` for a family not in :data:`NORM_GAIN`.
    """
    try:
        return NORM_GAIN[model_type]
    except KeyError:
        raise ConfigError(f"verifier config: model_type {model_type!r} has no known final-norm "
                          f"gain convention (known: {sorted(NORM_GAIN)}); specdraft refuses to "
                          f"guess whether its norm is w*x or (1+w)*x") from None


# ---------------------------------------------------------------- the profile

FinalState = Literal["post_norm", "engine_pre_norm+verifier_norm"]
# What the stored final hidden state is, per extraction backend: the transformers backend stores
# the verifier's own ``last_hidden_state`` (after its final norm); the vLLM backend gets the last
# layer's output *before* the final norm (vLLM 0.32 ``model_executor/models/llama.py``) and
# specdraft applies the verifier's final norm to it once (``extract/vllm_backend.py``).
FINAL_STATES: dict[str, FinalState] = {"transformers": "post_norm",
                                       "vllm": "engine_pre_norm+verifier_norm"}

# Rope types transformers 5.24 computes (``modeling_rope_utils.ROPE_INIT_FUNCTIONS`` + default).
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
_ROPE_META = ("rope_type", "type", "rope_theta", "partial_rotary_factor")

# model_type of an MoE verifier -> what its ``intermediate_size`` is (transformers 5.24 configs):
# "dense": the width of its dense MLP layers (experts use ``moe_intermediate_size``) —
#          Qwen2/3-MoE (``mlp_only_layers``), DeepSeek-V3/Kimi-K2 (``first_k_dense_replace``),
#          Qwen3-Next/3.5-MoE;
# "per_expert": the width of one expert; no dense MLP exists — gpt-oss.
MOE_LAYOUT: dict[str, Literal["dense", "per_expert"]] = {
    **{t: "dense" for t in ("qwen2_moe", "qwen3_moe", "deepseek_v3", "kimi_k2", "qwen3_next",
                            "qwen3_5_moe")},
    "gpt_oss": "per_expert",
}
_N_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")

# model_type -> the MoE routing keys an engine must read from config.json to route as transformers
# does. transformers 5.24's DeepseekV3 router always scores experts with a sigmoid and picks the
# top-k of ``score + e_score_correction_bias`` (``modeling_deepseek_v3.DeepseekV3TopkRouter``);
# vLLM 0.32 reads both keys (``model_executor/models/deepseek_v2.py``): measured on the
# tests/kimi_fixture.py verifier, without ``scoring_func`` it scores with softmax and its hidden
# states silently leave transformers', without ``topk_method: noaux_tc`` it fails to load the
# checkpoint's correction bias (``KeyError: ...e_score_correction_bias``).
ENGINE_ROUTING: dict[str, dict[str, str]] = {
    t: {"scoring_func": "sigmoid", "topk_method": "noaux_tc"} for t in ("deepseek_v3", "kimi_k2")}
_ROUTING_WITHOUT = {
    "scoring_func": "vLLM then scores experts with softmax (its default) and routes tokens to "
                    "other experts, silently",
    "topk_method": "vLLM then has no e_score_correction_bias and fails to load the checkpoint's",
}


def check_engine_routing(config: dict[str, Any], source: str) -> None:
    """Refuse a verifier config an engine would route differently from transformers.

    ``config``: the verifier's ``config.json`` as a dict (a VL model's ``text_config`` merged
    over it); ``source``: the file named in the message. Raises :class:`ConfigError` naming the
    first routing key of :data:`ENGINE_ROUTING` that is missing or has another value.
    """
    model_type = str(config.get("model_type", ""))
    for key, want in ENGINE_ROUTING.get(model_type, {}).items():
        got = config.get(key)
        if got != want:
            raise ConfigError(
                f"{source}: model_type {model_type} has {key} {json.dumps(got)}, expected "
                f"{json.dumps(want)}: transformers routes this family's experts by sigmoid "
                f"scores plus the correction bias, and {_ROUTING_WITHOUT[key]}; "
                f'add "{key}": "{want}" to the config (DeepSeek-V3 and Kimi-K2 checkpoints '
                f"ship it)")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RotaryProfile(_Frozen):
    """The verifier's rotary embedding, as transformers' ``rope_parameters`` spell it.

    ``params``: every scaling parameter besides type, theta and partial factor (``factor``,
    ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``,
    ``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim``, ``attention_factor``,
    ``truncate``, ...), verbatim. ``interleaved``: the verifier rotates interleaved pairs
    (DeepSeek-V3 ``rope_interleave``) rather than halves. ``layer_type``: which entry of a
    per-layer-type ``rope_parameters`` this is (Gemma 3: ``full_attention``), else None.
    """

    rope_type: str
    theta: float
    partial_rotary_factor: float = 1.0
    params: dict[str, Any] = {}
    interleaved: bool = False
    layer_type: str | None = None

    def rope_parameters(self) -> dict[str, Any]:
        """transformers' ``rope_parameters`` dict (what vLLM's ``get_rope`` reads)."""
        d = {"rope_type": self.rope_type, "rope_theta": self.theta, **self.params}
        if self.partial_rotary_factor != 1.0:
            d["partial_rotary_factor"] = self.partial_rotary_factor
        return d


class MoEProfile(_Frozen):
    """Mixture-of-experts facts: ``expert_intermediate_size`` is one expert's MLP width;
    ``dense_intermediate_size`` the dense MLP layers' width, None when the family has none."""

    n_experts: int
    experts_per_token: int | None = None
    expert_intermediate_size: int
    dense_intermediate_size: int | None = None


class MLAProfile(_Frozen):
    """Multi-head latent attention facts (DeepSeek-V3 / Kimi-K2 configs)."""

    kv_lora_rank: int
    q_lora_rank: int | None = None
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


class VerifierProfile(_Frozen):
    """Every verifier-family fact a stage depends on (module doc), resolved once by
    :func:`resolve_profile`, stored in the extract manifest, the drafter's config and the
    export's provenance, JSON round-trip exact (:meth:`to_dict` / :meth:`from_dict`).

    ``head_dim``: the verifier's q/k head width (MLA: ``qk_nope_head_dim + qk_rope_head_dim``).
    ``intermediate_size``: its dense MLP width, None when it has none (gpt-oss).
    ``vocab_size``: rows of its LM head (the loaded model's when it was given).
    """

    model_type: str
    architecture: str
    n_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int | None
    rms_norm_eps: float
    norm_type: Literal["rmsnorm"] = "rmsnorm"
    norm_gain: NormGain
    final_state: FinalState = "post_norm"
    final_logit_softcapping: float | None = None
    rotary: RotaryProfile
    max_position_embeddings: int
    tie_word_embeddings: bool
    moe: MoEProfile | None = None
    mla: MLAProfile | None = None
    aux_convention: str = AUX_CONVENTION

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each verifier head that are rotated."""
        if self.mla is not None:
            return self.mla.qk_rope_head_dim
        return int(self.head_dim * self.rotary.partial_rotary_factor)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "verifier profile") -> "VerifierProfile":
        """Parse a stored profile; :class:`ConfigError` naming ``source`` and the first bad key."""
        from pydantic import ValidationError

        try:
            return cls.model_validate(d)
        except ValidationError as err:
            e = err.errors()[0]
            key = ".".join(str(x) for x in e["loc"]) or "(top level)"
            raise ConfigError(f"{source}: key `{key}`: {e['msg']}") from None

    def mismatches(self, other: "VerifierProfile",
                   ignore: tuple[str, ...] = ("final_state", "architecture")) -> list[str]:
        """``"field: mine != other's"`` for each top-level field that differs. Ignored by
        default: the final state (it depends on the extraction backend, not the verifier) and
        the architecture name (a GGUF's config has none; ``model_type`` names the family)."""
        a, b = self.to_dict(), other.to_dict()
        return [f"{k}: {json.dumps(a[k])} != {json.dumps(b.get(k))}" for k in a
                if k not in ignore and a[k] != b.get(k)]


# ---------------------------------------------------------------- reading HF configs


def load_hf_config(path: str | os.PathLike, *, trust_remote_code: bool = False) -> Any:
    """The verifier's ``AutoConfig`` (HF directory, ``.gguf`` file or ``smollm2``), refusing
    remote code unless ``trust_remote_code``
    (:func:`specdraft.core.verifier.require_trust`)."""
    from transformers import AutoConfig

    from specdraft.core.verifier import resolve_trusted

    directory, gguf_file = resolve_trusted(path, trust_remote_code)
    return AutoConfig.from_pretrained(directory, gguf_file=gguf_file,
                                      trust_remote_code=trust_remote_code)


def config_json(hf_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``hf_dir/config.json`` as an engine reads it: a dict with a VL model's ``text_config``
    merged over the top level; None when the file does not exist. Raises
    :class:`~specdraft.core.errors.InputError` naming the file when it is not a JSON object."""
    from specdraft.core.errors import InputError
    from specdraft.core.jsonl import read_json

    path = Path(hf_dir) / "config.json"
    if not path.exists():
        return None
    config = read_json(path, what="verifier config")
    if not isinstance(config, dict):
        raise InputError(f"{path}: not a JSON object")
    return {**config, **(config.get("text_config") or {})}


def quant_method(hf_dir: str | os.PathLike) -> str | None:
    """``quantization_config.quant_method`` of ``hf_dir/config.json`` (a VL model's
    ``text_config`` merged, :func:`config_json`), ``"unknown"`` without the key, None when the
    checkpoint is not quantized or has no readable config."""
    try:
        config = config_json(hf_dir)
    except ValueError:
        return None
    q = (config or {}).get("quantization_config")
    return str(q.get("quant_method", "unknown")) if isinstance(q, dict) else None


# ---------------------------------------------------------------- resolution


def text_config(hf_config: Any) -> Any:
    """The language model's config: ``text_config`` for VL models, else ``hf_config``."""
    return getattr(hf_config, "text_config", None) or hf_config


def _field(c: Any, name: str, kind: type = int) -> Any:
    value = getattr(c, name, None)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"verifier config: field `{name}` is missing or not a number "
                          f"({value!r}); specdraft refuses to guess it")
    return kind(value)


def _rope_dict(c: Any) -> tuple[dict[str, Any], str | None]:
    """``(rope dict, layer type)`` from ``rope_parameters`` (or legacy ``rope_scaling``)."""
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"verifier config: field `rope_parameters` is {type(rope).__name__}, "
                          f"expected a dict")
    if rope and all(isinstance(v, dict) or v is None for v in rope.values()):
        if not isinstance(rope.get("full_attention"), dict):
            raise ConfigError(f"verifier config: field `rope_parameters` is per layer type "
                              f"{sorted(rope)} without a `full_attention` entry; specdraft "
                              f"does not know which rotary the drafter should follow")
        return dict(rope["full_attention"]), "full_attention"
    return dict(rope), None


def resolve_rotary(c: Any) -> RotaryProfile:
    """The verifier's rotary from its (text) config. :class:`ConfigError` naming the field for
    an unknown rope type, a partial factor outside (0, 1] or a missing theta."""
    rope, layer_type = _rope_dict(c)
    where = "rope_parameters" + (f".{layer_type}" if layer_type else "")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"verifier config: field `{where}.rope_type` = {rope_type!r} is not a "
                          f"rope type specdraft knows ({', '.join(ROPE_TYPES)}); refusing to "
                          f"guess the drafter's rotary")
    theta = rope.get("rope_theta", getattr(c, "rope_theta", None))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ConfigError(f"verifier config: field `{where}.rope_theta` is missing or not a "
                          f"number ({theta!r})")
    partial = rope.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", None))
    partial = 1.0 if partial is None else partial
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or \
            not 0.0 < partial <= 1.0:
        raise ConfigError(f"verifier config: field `partial_rotary_factor` = {partial!r} must "
                          f"be a number in (0, 1]")
    params = {k: v for k, v in rope.items() if k not in _ROPE_META}
    return RotaryProfile(rope_type=rope_type, theta=float(theta),
                         partial_rotary_factor=float(partial), params=params,
                         interleaved=bool(getattr(c, "rope_interleave", False)),
                         layer_type=layer_type)


def resolve_moe(c: Any, model_type: str) -> MoEProfile | None:
    """MoE facts, None for a dense verifier. :class:`ConfigError` for an MoE family whose
    ``intermediate_size`` meaning is not in :data:`MOE_LAYOUT`."""
    n = next((getattr(c, k) for k in _N_EXPERT_KEYS if getattr(c, k, None)), None)
    if not n:
        return None
    layout = MOE_LAYOUT.get(model_type)
    if layout is None:
        raise ConfigError(f"verifier config: model_type {model_type!r} is a mixture of experts "
                          f"({n} experts) whose `intermediate_size` specdraft cannot classify "
                          f"as dense or per-expert (known: {sorted(MOE_LAYOUT)})")
    top_k = getattr(c, "num_experts_per_tok", None)
    if layout == "per_expert":
        return MoEProfile(n_experts=int(n), experts_per_token=top_k,
                          expert_intermediate_size=_field(c, "intermediate_size"))
    return MoEProfile(n_experts=int(n), experts_per_token=top_k,
                      expert_intermediate_size=_field(c, "moe_intermediate_size"),
                      dense_intermediate_size=_field(c, "intermediate_size"))


def resolve_mla(c: Any) -> MLAProfile | None:
    """MLA facts (``kv_lora_rank`` set), else None."""
    if getattr(c, "kv_lora_rank", None) is None:
        return None
    q_rank = getattr(c, "q_lora_rank", None)
    return MLAProfile(kv_lora_rank=_field(c, "kv_lora_rank"),
                      q_lora_rank=None if q_rank is None else int(q_rank),
                      qk_rope_head_dim=_field(c, "qk_rope_head_dim"),
                      qk_nope_head_dim=_field(c, "qk_nope_head_dim"),
                      v_head_dim=_field(c, "v_head_dim"))


def _model_facts(model: Any, vocab_size: int, tied: bool) -> tuple[int, bool]:
    """``(LM head rows, tied)`` of a loaded HF model; :class:`ConfigError` when its final norm
    is not an RMSNorm (the only norm the profile describes)."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    if norm is not None and not type(norm).__name__.endswith("RMSNorm"):
        raise ConfigError(f"verifier model: final norm {type(norm).__name__} is not an RMSNorm; "
                          f"specdraft knows only RMSNorm final norms")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return vocab_size, tied
    embed = model.get_input_embeddings().weight
    return int(head.weight.shape[0]), head.weight.data_ptr() == embed.data_ptr()


def resolve_profile(hf_config: Any, *, model: Any = None,
                    backend: Literal["transformers", "vllm"] = "transformers") -> VerifierProfile:
    """The verifier profile from its HF config (``text_config`` for VL) and, when given, the
    loaded HF ``model`` (LM head rows, tying, final norm class).

    Raises :class:`ConfigError` naming the field for anything not understood: an unknown
    ``model_type`` norm (:func:`norm_gain`), rope type or MoE layout, a missing size.
    """
    c = text_config(hf_config)
    model_type = str(getattr(c, "model_type", "") or "")
    gain = norm_gain(model_type)
    heads = _field(c, "num_attention_heads")
    hidden = _field(c, "hidden_size")
    mla = resolve_mla(c)
    head_dim = (mla.qk_nope_head_dim + mla.qk_rope_head_dim if mla is not None
                else int(getattr(c, "head_dim", None) or hidden // heads))
    moe = resolve_moe(c, model_type)
    vocab = _field(c, "vocab_size")
    tied = bool(getattr(c, "tie_word_embeddings", False))
    if model is not None:
        vocab, tied = _model_facts(model, vocab, tied)
    softcap = getattr(c, "final_logit_softcapping", None)
    archs = getattr(hf_config, "architectures", None) or getattr(c, "architectures", None)
    return VerifierProfile(
        model_type=model_type, architecture=(archs or [model_type])[0],
        n_layers=_field(c, "num_hidden_layers"), hidden_size=hidden, vocab_size=vocab,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(c, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        intermediate_size=(moe.dense_intermediate_size if moe is not None
                           else _field(c, "intermediate_size")),
        rms_norm_eps=_field(c, "rms_norm_eps", float), norm_gain=gain,
        final_state=FINAL_STATES[backend],
        final_logit_softcapping=None if softcap is None else float(softcap),
        rotary=resolve_rotary(c),
        max_position_embeddings=_field(c, "max_position_embeddings"),
        tie_word_embeddings=tied, moe=moe, mla=mla)
