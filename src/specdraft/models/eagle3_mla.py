"""The EAGLE-3 drafter with a multi-head latent attention layer, for MLA verifiers (DeepSeek-V3,
Kimi-K2/K2.5), in one readable file: the layer vLLM 0.32 serves as
``Eagle3DeepseekV2ForCausalLM`` (``vllm/model_executor/models/deepseek_eagle3.py``).

Data flow as :mod:`specdraft.models.eagle3` (``fc``, ``midlayer``, ``norm``, ``lm_head``,
``d2t``/``t2d``); only the attention differs. Its projections read the 2H-wide
``[input_layernorm(embed); hidden_norm(h)]``:

    q  = q_b_proj(q_a_layernorm(q_a_proj(x)))          [B, T, h·(nope+rope)]  (low-rank query)
    kv = kv_a_proj_with_mqa(x) = [c_kv | k_rope]       [B, T, kv_lora_rank + rope] (one rope key)
    [k_nope | v] = kv_b_proj(kv_a_layernorm(c_kv))     [B, T, h·(nope+v)]
    k  = [k_nope | rotary(k_rope) broadcast to h heads], q = [q_nope | rotary(q_rope)]
    o  = softmax(scale · q·kᵀ) v  -> o_proj            [B, T, H]

Checkpoint names are the engine's (``midlayer.`` is renamed ``layers.0.`` by its loader, which
also fuses ``q_a_proj`` and ``kv_a_proj_with_mqa``): ``midlayer.self_attn.{q_a_proj,
q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}.weight``.

Rotary and scale, as the verifier's own MLA (transformers ``modeling_deepseek_v3``) and vLLM
(``deepseek_v2.py`` ``DeepseekV2MLAAttention``): only the ``qk_rope_head_dim`` part is rotated,
in **interleaved** pairs (vLLM ``get_rope(is_neox_style=False)``; transformers de-interleaves and
rotates halves, which permutes q and k alike and leaves every score equal), with DeepSeek's YaRN
(``transformers`` ``DeepseekV3RotaryEmbedding``); the softmax scale is ``qk_head_dim^-0.5``
times ``yarn_get_mscale(factor, mscale_all_dim)²`` for a scaled rope.

The TTT and cached paths of :class:`~specdraft.models.eagle3.Eagle3DraftModel` are reused as
they are; two facts make that exact: values are zero-padded from ``v_head_dim`` to the q/k width
(PyTorch's fused CPU attention needs one head size; zero columns of v give zero columns of the
output, dropped before ``o_proj``), and q is multiplied by ``scale / qk_head_dim^-0.5`` so the
base class's ``head_dim^-0.5`` gives the MLA scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3RotaryEmbedding, apply_rotary_pos_emb_interleave)

from specdraft.core.errors import ConfigError
from specdraft.core.profile import VerifierProfile
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel, RMSNorm

#: ``model_type`` of the exported config: with ``deepseek_v3`` vLLM 0.32 rewrites a drafter into
#: its MTP model and refuses it; ``deepseek_v2`` loads ``Eagle3DeepseekV2ForCausalLM``.
MLA_MODEL_TYPE = "deepseek_v2"


@dataclass(frozen=True, kw_only=True)
class Eagle3MLAConfig(Eagle3Config):
    """:class:`Eagle3Config` plus the MLA widths; ``head_dim`` is the q/k width
    ``qk_nope_head_dim + qk_rope_head_dim``, ``num_key_value_heads`` equals the heads."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    draft_layer: str = "mla"
    export_t2d: ClassVar[bool] = False
    served_by: ClassVar[tuple[str, ...]] = ("vllm",)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.norm_before_fc:
            raise ValueError("norm_before_fc: vLLM's MLA drafter (deepseek_eagle3.py) does not "
                             "read it, so the served drafter would skip that norm; fc_norm and "
                             "norm_output it reads")
        if self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
            raise ValueError(f"head_dim {self.head_dim} != qk_nope_head_dim "
                             f"{self.qk_nope_head_dim} + qk_rope_head_dim {self.qk_rope_head_dim}")
        if self.num_key_value_heads != self.num_attention_heads:
            raise ValueError("MLA has one key and value per head: num_key_value_heads must equal "
                             "num_attention_heads")
        if self.v_head_dim > self.head_dim:
            raise ValueError(f"v_head_dim {self.v_head_dim} wider than the q/k width "
                             f"{self.head_dim}: the padded values would not fit")

    @classmethod
    def from_profile(cls, profile: VerifierProfile, *, draft_vocab_size: int,
                     aux_layer_ids: tuple[int, ...], **overrides: Any) -> "Eagle3MLAConfig":
        """The Llama-layer shape of :meth:`Eagle3Config.from_profile` with the verifier's MLA
        widths and heads. The query is low-rank always: the verifier's ``q_lora_rank``, else
        (a verifier with a full-rank query, ``q_lora_rank: null``) its ``kv_lora_rank``, because
        vLLM 0.32 cannot load an MLA drafter without one (``deepseek_eagle3.py`` stacks
        ``kv_a_proj_with_mqa`` into ``fused_qkv_a_proj``, a parameter ``DeepseekV2MLAAttention``
        has only with a ``q_lora_rank``). Raises :class:`ConfigError` for a verifier without
        MLA."""
        m = profile.mla
        if m is None:
            raise ConfigError(f"verifier {profile.model_type}: no kv_lora_rank, not an MLA "
                              f"verifier; the MLA drafter needs one")
        base = Eagle3Config.from_profile(profile, draft_vocab_size=draft_vocab_size,
                                         aux_layer_ids=aux_layer_ids).to_dict()
        base.update(head_dim=m.qk_nope_head_dim + m.qk_rope_head_dim,
                    num_key_value_heads=profile.num_attention_heads,
                    kv_lora_rank=m.kv_lora_rank, q_lora_rank=m.q_lora_rank or m.kv_lora_rank,
                    qk_nope_head_dim=m.qk_nope_head_dim, qk_rope_head_dim=m.qk_rope_head_dim,
                    v_head_dim=m.v_head_dim, draft_layer="mla")
        base.update(overrides)
        return cls.from_dict(base)

    def attention_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of :class:`MLAAttention`'s tensors, the names vLLM loads (low-rank query when
        ``q_lora_rank`` is set)."""
        h, wide, qk = self.num_attention_heads, 2 * self.hidden_size, self.head_dim
        at = "midlayer.self_attn."
        out = {at + "q_proj.weight": (h * qk, wide)} if self.q_lora_rank is None else {
            at + "q_a_proj.weight": (self.q_lora_rank, wide),
            at + "q_a_layernorm.weight": (self.q_lora_rank,),
            at + "q_b_proj.weight": (h * qk, self.q_lora_rank)}
        out.update({
            at + "kv_a_proj_with_mqa.weight": (self.kv_lora_rank + self.qk_rope_head_dim, wide),
            at + "kv_a_layernorm.weight": (self.kv_lora_rank,),
            at + "kv_b_proj.weight": (h * (self.qk_nope_head_dim + self.v_head_dim),
                                      self.kv_lora_rank),
            at + "o_proj.weight": (self.hidden_size, h * self.v_head_dim)})
        return out

    def layout_problems(self, fmt: str, cfg: dict[str, Any]) -> list[str]:
        """The MLA drafter's ``config.json``: vLLM's MLA drafter class, and every width and
        computation field it reads equal to the drafter's (``deepseek_eagle3.py``); vLLM only:
        SGLang and speculators load the Llama/Qwen3 layer."""
        if fmt != "vllm":
            return [f"--format {fmt}: the MLA drafter is served by vLLM only "
                    f"({VLLM_MLA_ARCH}); export it with --format vllm"]
        want = vllm_config(self, cfg.get("torch_dtype", "float32"))
        return [f"config.json {k}: {cfg.get(k)!r}, the drafter's is {v!r}"
                for k, v in want.items() if cfg.get(k) != v]

    def deepseek_config(self) -> DeepseekV3Config:
        """A DeepseekV3Config carrying what the MLA rotary reads (rope over the rope dims)."""
        return DeepseekV3Config(
            hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, q_lora_rank=self.q_lora_rank,
            kv_lora_rank=self.kv_lora_rank, qk_nope_head_dim=self.qk_nope_head_dim,
            qk_rope_head_dim=self.qk_rope_head_dim, v_head_dim=self.v_head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters=self.rope_parameters(), rope_interleave=True,
            rms_norm_eps=self.rms_norm_eps)

    def mla_scale(self) -> float:
        """Softmax scale: ``qk_head_dim^-0.5``, times ``mscale²`` for a scaled rope with
        ``mscale_all_dim`` (``mscale = 0.1·mscale_all_dim·ln(factor) + 1`` for factor > 1)."""
        scale = self.head_dim ** -0.5
        rope = self.rope_scaling or {}
        factor, all_dim = float(rope.get("factor", 1.0)), float(rope.get("mscale_all_dim", 0.0))
        if self.rope_type != "default" and all_dim and factor > 1:
            scale *= (0.1 * all_dim * math.log(factor) + 1.0) ** 2
        return scale


class MLAAttention(nn.Module):
    """Multi-head latent attention whose projections read the 2H-wide drafter input."""

    def __init__(self, c: Eagle3MLAConfig) -> None:
        super().__init__()
        self.c = c
        h, wide = c.num_attention_heads, 2 * c.hidden_size
        if c.q_lora_rank is None:
            self.q_proj = nn.Linear(wide, h * c.head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(wide, c.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
            self.q_b_proj = nn.Linear(c.q_lora_rank, h * c.head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(wide, c.kv_lora_rank + c.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, h * (c.qk_nope_head_dim + c.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(h * c.v_head_dim, c.hidden_size, bias=False)
        # q is pre-scaled so that the base class's head_dim^-0.5 gives the MLA scale
        self.q_gain = c.mla_scale() / c.head_dim ** -0.5

    def qkv(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]):
        """x [B, T, 2H], cos/sin [B, T, rope] -> q, k [B, h, T, nope+rope] (q pre-scaled, see
        the module doc), v [B, h, T, nope+rope] (``v_head_dim`` values, then zeros)."""
        c = self.c
        B, T, _ = x.shape
        q = self.q_proj(x) if c.q_lora_rank is None else \
            self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, c.num_attention_heads, c.head_dim).transpose(1, 2)
        q_nope, q_rope = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, c.qk_rope_head_dim],
                                                        dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c_kv))
        kv = kv.view(B, T, c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim)
        kv = kv.transpose(1, 2)
        k_nope, v = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        k_rope = k_rope.view(B, 1, T, c.qk_rope_head_dim)
        q_rope, k_rope = apply_rotary_pos_emb_interleave(q_rope, k_rope, *cos_sin)
        q = torch.cat([q_nope, q_rope], dim=-1) * self.q_gain
        k = torch.cat([k_nope, k_rope.expand(-1, c.num_attention_heads, -1, -1)], dim=-1)
        # Under autocast the fp32 rotary tables promote q and k to fp32 while v stays bf16; the
        # fused kernels take one dtype (as Eagle3Attention.qkv): all three share v's.
        return q.to(v.dtype), k.to(v.dtype), F.pad(v, (0, c.head_dim - c.v_head_dim))

    def out(self, o: torch.Tensor) -> torch.Tensor:
        """o [B, h, T, nope+rope] (padded values) -> [B, T, H]."""
        B, h, T, _ = o.shape
        o = o[..., :self.c.v_head_dim]
        return self.o_proj(o.transpose(1, 2).reshape(B, T, h * self.c.v_head_dim))


class Eagle3MLADraftModel(Eagle3DraftModel):
    """EAGLE-3 drafter whose midlayer attention is :class:`MLAAttention` (module doc)."""

    def __init__(self, config: Eagle3MLAConfig) -> None:
        super().__init__(config)
        self.midlayer.self_attn = MLAAttention(config)
        self.rotary = DeepseekV3RotaryEmbedding(config.deepseek_config())


#: The class vLLM 0.32 loads the MLA drafter as (``deepseek_eagle3.py``).
VLLM_MLA_ARCH = "Eagle3DeepseekV2ForCausalLM"


def vllm_config(c: Eagle3MLAConfig, torch_dtype: str = "float32") -> dict[str, Any]:
    """``config.json`` in the layout vLLM 0.32 loads as ``Eagle3DeepseekV2ForCausalLM``
    (``deepseek_eagle3.py``): ``model_type`` :data:`MLA_MODEL_TYPE`, one layer, the MLA widths,
    the rope as ``rope_parameters``, aux ids top-level and under ``eagle_config`` (HF numbering =
    vLLM's), the computation fields vLLM's MLA drafter reads (``fc_norm``, ``norm_output``,
    ``norm_before_residual``; ``norm_before_fc`` is refused by the config)."""
    rope = c.rope_parameters()
    ids = list(c.aux_layer_ids)
    return {
        "architectures": [VLLM_MLA_ARCH], "model_type": MLA_MODEL_TYPE,
        "hidden_size": c.hidden_size, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "num_hidden_layers": 1,
        "intermediate_size": c.intermediate_size, "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": c.hidden_act, "q_lora_rank": c.q_lora_rank, "kv_lora_rank": c.kv_lora_rank,
        "qk_nope_head_dim": c.qk_nope_head_dim, "qk_rope_head_dim": c.qk_rope_head_dim,
        "v_head_dim": c.v_head_dim, "max_position_embeddings": c.max_position_embeddings,
        "rope_parameters": rope, "rope_theta": rope["rope_theta"], "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        "norm_before_residual": c.norm_before_residual, "fc_norm": c.fc_norm,
        "norm_output": c.norm_output, "tie_word_embeddings": False,
        "eagle_aux_hidden_state_layer_ids": ids,
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": ids},
        "torch_dtype": torch_dtype}


def config_from_vllm(cfg: dict[str, Any]) -> Eagle3MLAConfig:
    """The inverse of :func:`vllm_config` (an exported ``config.json`` read back). Raises
    KeyError naming a missing key, ValueError for widths that do not fit together."""
    rope = dict(cfg["rope_parameters"])
    theta = float(rope.pop("rope_theta", cfg.get("rope_theta")))
    scaling = rope if rope.get("rope_type", "default") != "default" else None
    nope, rope_dim = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
    return Eagle3MLAConfig(
        hidden_size=cfg["hidden_size"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], head_dim=nope + rope_dim,
        intermediate_size=cfg["intermediate_size"], rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=cfg["max_position_embeddings"], vocab_size=cfg["vocab_size"],
        draft_vocab_size=cfg["draft_vocab_size"],
        target_hidden_size=cfg.get("target_hidden_size") or cfg["hidden_size"],
        aux_layer_ids=tuple(cfg["eagle_aux_hidden_state_layer_ids"]),
        hidden_act=cfg.get("hidden_act", "silu"),
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        fc_norm=bool(cfg.get("fc_norm", False)), norm_output=bool(cfg.get("norm_output", False)),
        kv_lora_rank=cfg["kv_lora_rank"], q_lora_rank=cfg.get("q_lora_rank"),
        qk_nope_head_dim=nope, qk_rope_head_dim=rope_dim, v_head_dim=cfg["v_head_dim"])


def vllm_checkpoint(model: Eagle3MLADraftModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(:func:`vllm_config`, tensors): the tensors under the checkpoint's own names (the loader
    renames ``midlayer.`` itself), ``d2t`` and the frozen embedding; ``t2d`` is dropped (the MLA
    layout served in ``tests/engine/test_kimi_mla_drafter.py`` has none; it is ``d2t``'s image).
    ``specdraft export --format vllm`` writes this layout, validated."""
    config = vllm_config(model.config, str(model.fc.weight.dtype).removeprefix("torch."))
    tensors = {k: v.detach().cpu().contiguous()
               for k, v in model.checkpoint_state(include_embed=True).items() if k != "t2d"}
    return config, tensors
