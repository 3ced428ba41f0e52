"""The EAGLE-3 draft model (arXiv 2503.01840, Sec. 3), in one readable file.

    aux features a [B, T, n_aux*Ht]
    a = input_norm(a)                     (norm_before_fc: one RMSNorm over all n_aux*Ht)
    a = cat([fc_norm[i](a_i)], -1)        (fc_norm: one RMSNorm per aux chunk a_i [B, T, Ht])
    h = fc(a)                                                   [B, T, H]  (step 0 only)
    x = input_layernorm(embed_tokens(ids))                      [B, T, H]
    a = self_attn(cat([x, hidden_norm(h)], -1))                 q/k/v read width 2H
    r = h + a                   (h taken *before* hidden_norm, unless norm_before_residual)
    out = r + mlp(post_attention_layernorm(r))                  [B, T, H]  "prenorm"
    logits = lm_head(norm(out))                                 [B, T, K]  over the draft vocab
    next h = norm(out) if norm_output else out                  (:meth:`feedback`)

``norm_before_fc``, ``fc_norm`` and ``norm_output`` are EAGLE-3.1's three switches, computed as
vLLM 0.32 ``model_executor/models/llama_eagle3.py`` does (``combine_hidden_states``: the single
norm first, then the per-chunk norms; ``LlamaModel.forward``: the post-norm state as the aux
output when ``norm_output``). ``draft_layer`` picks the decoder layer's attention: ``"llama"``
(the reference EAGLE-3 layer) or ``"qwen3"`` (per-head RMSNorm ``q_norm``/``k_norm`` on q and k
before rotary, vLLM ``qwen3.py`` ``Qwen3Attention`` as used by ``qwen3_eagle3.py``).

Attribute names equal the checkpoint keys that vLLM (``vllm/model_executor/models/
llama_eagle3.py``) and SGLang (``python/sglang/srt/models/llama_eagle3.py``) load, so export is a
rename-free ``state_dict`` save: ``fc.weight``, ``midlayer.{input_layernorm,hidden_norm,
post_attention_layernorm}.weight``, ``midlayer.self_attn.{q,k,v,o}_proj.weight``,
``midlayer.mlp.{gate,up,down}_proj.weight``, ``norm.weight``, ``lm_head.weight``, with
EAGLE-3.1 ``input_norm.weight`` [n_aux*Ht] and ``fc_norm.{i}.weight`` [Ht], with the Qwen3 layer
``midlayer.self_attn.{q,k}_norm.weight`` [d] (vLLM's names), buffers ``d2t``
(int64 [K], ``target_id = draft_id + d2t[draft_id]``) and ``t2d`` (bool [V]), plus the frozen
``embed_tokens.weight`` copied from the verifier.

Two ways to run the layer:
- :meth:`Eagle3DraftModel.ttt_step` for training-time test: step ``k`` sees the step-0 keys
  causally plus, for each query, its own keys from steps 1..k (the diagonal). Rotary position of
  step ``k`` at column ``t`` is ``t + k``: at inference the engines place the ``k``-th drafted
  token one position after the previous one (vLLM ``v1/spec_decode/eagle.py`` increments
  ``positions`` per draft step), so query/key offsets in training equal those at serving time.
  :meth:`Eagle3DraftModel.ttt_step_live` is the same step computed only at the columns a
  supervised step reads (what training runs).
- :meth:`Eagle3DraftModel.forward_cached` for inference with a :class:`DraftKVCache`.

Model files never import ``torch.distributed``; parallelism is applied from outside.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from specdraft.core.conventions import AUX_CONVENTION  # noqa: F401  (re-exported)
from specdraft.core.errors import ConfigError
from specdraft.core.profile import VerifierProfile, resolve_profile



@dataclass(frozen=True, kw_only=True)
class Eagle3Config:
    """Shape of a drafter; layer fields come from the verifier's profile (:meth:`from_profile`).

    ``max_position_embeddings`` is the verifier's, never the training length: a smaller value
    crushes acceptance on long contexts at serving time (rotary scaling and cache sizing read it).
    ``aux_layer_ids`` follow :data:`AUX_CONVENTION`. Rotary: ``rope_theta``, ``rope_scaling``
    (``{"rope_type": ..., params}`` as transformers spells them, None for the default rotary) and
    ``partial_rotary_factor`` (only the first ``rotary_dim`` of each head are rotated).
    ``verifier_profile``: the :class:`~specdraft.core.profile.VerifierProfile` the drafter was
    built from, as a dict (None for drafters made before profiles existed).
    ``verifier_identity``: the identity record of the verifier the drafter was trained on
    (:mod:`specdraft.core.verifier_identity`; None when unknown), compared by export, eval and
    doctor with the verifier they are given.
    ``norm_before_residual``, ``norm_before_fc``, ``fc_norm``, ``norm_output`` and
    ``draft_layer`` change the computation (module docstring); :data:`COMPUTATION_FIELDS` lists
    them and every export writes each one explicitly.
    """

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]
    rope_scaling: dict[str, Any] | None = None
    partial_rotary_factor: float = 1.0
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    draft_layer: str = "llama"
    hidden_act: str = "silu"
    attn_impl: str = "fused"
    verifier_profile: dict[str, Any] | None = None
    verifier_identity: dict[str, Any] | None = None
    #: the drafter kind (:mod:`specdraft.kinds`), written as ``"kind"`` by :meth:`to_dict`
    kind: ClassVar[str] = "eagle3"
    #: an export of this layer holds ``t2d`` (the MLA layout does not: it is ``d2t``'s image)
    export_t2d: ClassVar[bool] = True
    #: the engines that load an export of this layer (SGLang's reading of the ids is checked)
    served_by: ClassVar[tuple[str, ...]] = ("sglang", "vllm", "speculators")

    def __post_init__(self) -> None:
        object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in self.aux_layer_ids))
        if self.rope_scaling is not None:  # legacy ``{"type": ...}`` spelling -> rope_type
            rope = dict(self.rope_scaling)
            rope.setdefault("rope_type", rope.pop("type", "default"))
            rope.pop("type", None)
            object.__setattr__(self, "rope_scaling", rope)
        if self.attn_impl not in TTT_ATTENTION:
            raise ValueError(f"attn_impl {self.attn_impl!r} not in {sorted(TTT_ATTENTION)}")
        if self.draft_layer not in DRAFT_LAYERS:
            raise ValueError(f"draft_layer {self.draft_layer!r} not in {list(DRAFT_LAYERS)}")
        if (self.draft_layer == "mla") != hasattr(self, "kv_lora_rank"):
            raise ValueError("draft_layer 'mla' comes with the MLA widths (kv_lora_rank, "
                             "qk_nope_head_dim, qk_rope_head_dim, v_head_dim), and only with it")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r}: only silu is implemented")
        if not 0.0 < self.partial_rotary_factor <= 1.0 or self.rotary_dim % 2:
            raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor} must be in "
                             f"(0, 1] and give an even rotary_dim (head_dim {self.head_dim})")

    @property
    def n_aux(self) -> int:
        return len(self.aux_layer_ids)

    @property
    def rotary_dim(self) -> int:
        """Rotated dimensions of each head: ``int(head_dim * partial_rotary_factor)`` (vLLM
        ``get_rope``, SGLang ``LlamaAttention`` and transformers compute it the same way)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def rope_type(self) -> str:
        return (self.rope_scaling or {}).get("rope_type", "default")

    def rope_parameters(self) -> dict[str, Any]:
        """The full transformers ``rope_parameters`` dict (type, theta, params, partial)."""
        rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        if self.partial_rotary_factor != 1.0:
            rope["partial_rotary_factor"] = self.partial_rotary_factor
        return rope

    def attention_shapes(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint name -> shape of the draft layer's attention tensors (Llama; the Qwen3
        layer adds per-head q/k norms, :data:`DRAFT_LAYERS`)."""
        H, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        q, at = self.num_attention_heads * self.head_dim, "midlayer.self_attn."
        out = {at + "q_proj.weight": (q, 2 * H), at + "k_proj.weight": (kv, 2 * H),
               at + "v_proj.weight": (kv, 2 * H), at + "o_proj.weight": (H, q)}
        if DRAFT_LAYERS[self.draft_layer]:  # per-head q/k norms
            out.update({f"{at}{n}_norm.weight": (self.head_dim,) for n in "qk"})
        return out

    def layout_problems(self, fmt: str, cfg: dict[str, Any]) -> list[str] | None:
        """The problems of an exported ``config.json`` in a layout of this layer's own, or None
        when the layer is written in the format table's layout
        (:mod:`specdraft.artifacts.formats`), checked there."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """The fields, with the declared ``kind`` first (``drafter_config.json``)."""
        d = {"kind": self.kind, **asdict(self)}
        d["aux_layer_ids"] = list(self.aux_layer_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Eagle3Config":
        """Strict: ValueError naming every key that is not a field (a field specdraft does
        not implement must not be dropped silently), or a ``kind`` other than this one's (a
        config without it predates the field)."""
        d = dict(d)
        kind = d.pop("kind", cls.kind)
        if kind != cls.kind:
            raise ValueError(f"kind {kind!r}: not an {cls.kind} drafter config")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"drafter config key(s) {unknown}: specdraft does not implement "
                             f"them")
        return cls(**d)

    @classmethod
    def from_verifier(cls, hf_config: Any, *, draft_vocab_size: int,
                      aux_layer_ids: tuple[int, ...], **overrides: Any) -> "Eagle3Config":
        """:meth:`from_profile` of the profile resolved from a verifier's HF config
        (``text_config`` for VL models); :class:`ConfigError` for a config not understood."""
        return cls.from_profile(resolve_profile(hf_config), draft_vocab_size=draft_vocab_size,
                                aux_layer_ids=aux_layer_ids, **overrides)

    @classmethod
    def from_profile(cls, profile: VerifierProfile, *, draft_vocab_size: int,
                     aux_layer_ids: tuple[int, ...], **overrides: Any) -> "Eagle3Config":
        """The drafter's shape from the verifier's profile. Shape rules (docs/stages.md "The
        verifier profile and the drafter's shape"):

        - one standard EAGLE-3 Llama-style layer over the verifier's ``hidden_size``, with its
          ``num_attention_heads``, ``num_key_value_heads`` and ``head_dim``; for an MLA verifier
          (DeepSeek-V3, Kimi-K2) ``head_dim = v_head_dim`` (128): a Llama layer has one head width
          for q, k and v, and MLA's q/k width (``qk_nope + qk_rope`` = 192) exists only inside
          its latent attention (public Kimi-K2.5 EAGLE-3 drafters for vLLM/SGLang use 64 heads
          of 128); vLLM's own MLA drafter (``Eagle3DeepseekV3ForCausalLM``) is not produced;
        - MLP width: the verifier's *dense* ``intermediate_size`` (Qwen3-MoE, DeepSeek-V3/Kimi-K2:
          never ``moe_intermediate_size``); a family whose ``intermediate_size`` is per expert
          and that has no dense MLP (gpt-oss) gets ``experts_per_token x`` that width, the MLP
          width active per token (gpt-oss-20b: 4 x 2880 = 11520), never one expert's;
        - rotary exactly the verifier's: type, theta, every scaling parameter (llama3, yarn with
          its attention factor / mscale) and ``partial_rotary_factor``, applied to the drafter's
          own heads (neox halves, as the engines' Llama drafter layers do); MLA verifiers rotate
          only ``qk_rope_head_dim`` of their 192-wide heads, the drafter rotates its whole head;
        - ``max_position_embeddings`` and ``vocab_size`` are the verifier's; the exported
          ``tie_word_embeddings`` is always false (the drafter's lm_head is its own, over K ids).
        """
        p = profile
        rope = p.rotary
        values = dict(
            hidden_size=p.hidden_size, num_attention_heads=p.num_attention_heads,
            num_key_value_heads=p.num_key_value_heads,
            head_dim=p.mla.v_head_dim if p.mla is not None else p.head_dim,
            intermediate_size=drafter_mlp_width(p), rms_norm_eps=p.rms_norm_eps,
            rope_theta=rope.theta,
            rope_scaling=None if rope.rope_type == "default" else
            {"rope_type": rope.rope_type, **rope.params},
            partial_rotary_factor=rope.partial_rotary_factor,
            max_position_embeddings=p.max_position_embeddings, vocab_size=p.vocab_size,
            draft_vocab_size=draft_vocab_size, target_hidden_size=p.hidden_size,
            aux_layer_ids=tuple(aux_layer_ids), verifier_profile=p.to_dict())
        values.update(overrides)
        return cls(**values)

    def rotary_config(self) -> LlamaConfig:
        """A LlamaConfig carrying only what transformers' rotary embedding reads."""
        return LlamaConfig(hidden_size=self.hidden_size,
                           num_attention_heads=self.num_attention_heads, head_dim=self.head_dim,
                           max_position_embeddings=self.max_position_embeddings,
                           rope_parameters=self.rope_parameters())


# Decoder-layer kinds of the drafter: the value of ``Eagle3Config.draft_layer`` -> whether the
# attention has per-head q/k RMSNorms (the only difference between llama and qwen3; module
# docstring). ``mla`` is multi-head latent attention, built only from the MLA widths of
# :class:`specdraft.models.eagle3_mla.Eagle3MLAConfig`.
DRAFT_LAYERS: dict[str, bool] = {"llama": False, "qwen3": True, "mla": False}

# The fields of Eagle3Config that change what the drafter computes (not its shape), each written
# explicitly by every export (specdraft.artifacts.formats) and read back by
# specdraft.artifacts.drafter.
COMPUTATION_FIELDS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
                      "draft_layer")

# The documented rule of the default drafter layer per verifier family (``train
# --drafter-layer auto``; docs/drafters.md): Qwen3 verifiers get the Qwen3 layer (q/k norms, as
# their own attention has), every other family the reference Llama layer.
DRAFT_LAYER_BY_FAMILY: dict[str, str] = {"qwen3": "qwen3", "qwen3_moe": "qwen3"}


def default_draft_layer(model_type: str) -> str:
    """The drafter layer :data:`DRAFT_LAYER_BY_FAMILY` gives a verifier ``model_type``."""
    return DRAFT_LAYER_BY_FAMILY.get(model_type, "llama")


def resolve_draft_layer(choice: str, model_type: str) -> str:
    """``TrainConfig.drafter_layer`` made concrete: ``auto`` is :func:`default_draft_layer` of
    the verifier's ``model_type``, any other choice is itself."""
    return default_draft_layer(model_type) if choice == "auto" else choice


def drafter_mlp_width(p: VerifierProfile) -> int:
    """The drafter's MLP width for verifier profile ``p`` (rules in
    :meth:`Eagle3Config.from_profile`); :class:`ConfigError` when neither a dense width nor
    ``experts_per_token`` is known."""
    if p.intermediate_size is not None:
        return p.intermediate_size
    if p.moe is None or not p.moe.experts_per_token:
        raise ConfigError(f"verifier {p.model_type}: no dense intermediate_size and no "
                          f"num_experts_per_tok; the drafter's MLP width cannot be derived")
    return p.moe.experts_per_token * p.moe.expert_intermediate_size


class DraftRotaryEmbedding(LlamaRotaryEmbedding):
    """transformers' Llama rotary (every rope type of ``ROPE_INIT_FUNCTIONS``, attention factor
    included) whose *default* type also honours ``partial_rotary_factor``: transformers 5.24's
    ``LlamaRotaryEmbedding.compute_default_rope_parameters`` spans the whole head, while its
    scaled types, vLLM ``get_rope`` and SGLang rotate ``int(head_dim * factor)`` dims.
    transformers up to 5.17 passes ``device`` as a second positional argument."""

    @staticmethod
    def compute_default_rope_parameters(config: LlamaConfig, device: Any = None, **kwargs: Any
                                        ) -> tuple[torch.Tensor, float]:
        rope = config.rope_parameters
        dim = int(config.head_dim * rope.get("partial_rotary_factor", 1.0))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
        return 1.0 / (rope["rope_theta"] ** exponents), 1.0


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary on the first ``cos.shape[-1]`` dims of each head, the rest passed through.

    q [B, h, T, d], k [B, kvh, T, d], cos/sin [B, T, rotary_dim] (from transformers'
    ``LlamaRotaryEmbedding``, scaled by its attention factor). Neox halves (``rotate_half``),
    as vLLM ``get_rope(is_neox_style=True)`` and SGLang's Llama layer apply it.
    """
    rd = cos.shape[-1]
    if rd == q.shape[-1]:
        return apply_rotary_pos_emb(q, k, cos, sin)
    q_rot, k_rot = apply_rotary_pos_emb(q[..., :rd], k[..., :rd], cos, sin)
    return torch.cat([q_rot, q[..., rd:]], dim=-1), torch.cat([k_rot, k[..., rd:]], dim=-1)


class RMSNorm(nn.Module):
    """Llama RMSNorm, computed in fp32: ``w * x / sqrt(mean(x^2) + eps)``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, kvh, S, d] -> [B, kvh*n_rep, S, d] for grouped-query attention."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def _scatter_columns(x: torch.Tensor, b: torch.Tensor, t: torch.Tensor, B: int, L: int
                     ) -> torch.Tensor:
    """Packed columns x [1, h, N, d] -> [B, h, L, d] with column ``(b[i], t[i])`` = ``x[0, :, i]``
    and zeros elsewhere (differentiable)."""
    _, h, _, d = x.shape
    return x.new_zeros(B, L, h, d).index_put((b, t), x[0].transpose(0, 1)).permute(0, 2, 1, 3)


def ttt_mask(T: int, steps: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Bool [T, steps*T] mask of the query columns of the last of ``steps`` TTT steps.

    Key block 0 (step-0 keys) is causal (``s <= t``); key blocks 1..steps-1 are the identity
    (query ``t`` sees only its own column's key from each earlier step). True = attend.
    """
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    eye = torch.eye(T, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * (steps - 1), dim=1)


def ttt_attention_dense(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                        scale: float) -> torch.Tensor:
    """TTT attention with an explicit mask and SDPA (reference path, O(k·T²) memory).

    q [B, h, T, d]; keys/values: one [B, h, T, d] per step 0..k. Query t sees step-0 keys
    s <= t and, for every step j >= 1, only key t. Returns [B, h, T, d].
    """
    mask = ttt_mask(q.shape[2], len(keys), device=q.device)  # [T, (k+1)T]
    k = torch.cat(keys, dim=2)
    v = torch.cat(values, dim=2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def ttt_attention_split(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                        scale: float) -> torch.Tensor:
    """The same attention as :func:`ttt_attention_dense` in O(T² + k·T) memory.

    Scores against step-0 keys ([B, h, T, T], causal) and against each query's own earlier-step
    keys ([B, h, T, k], a row-wise dot product) share one softmax.
    """
    T = q.shape[2]
    s0 = torch.matmul(q, keys[0].transpose(-1, -2)) * scale  # [B, h, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    s0 = s0.masked_fill(~causal, float("-inf"))
    diag = [(q * kj).sum(-1, keepdim=True) * scale for kj in keys[1:]]  # k x [B, h, T, 1]
    probs = torch.softmax(torch.cat([s0, *diag], dim=-1).float(), dim=-1).to(q.dtype)
    out = torch.matmul(probs[..., :T], values[0])  # [B, h, T, d]
    for j, vj in enumerate(values[1:]):
        out = out + probs[..., T + j: T + j + 1] * vj
    return out


@dataclass(frozen=True)
class LSEKernel:
    """A fused causal attention kernel that returns its log-sum-exp, and its backward.

    ``forward(q, k, v, scale) -> (out [B, h, T, d], lse [B, h, T], saved)``: ``lse`` the natural
    log of the sum of ``exp(scale * q.k)`` over keys ``s <= t``; ``saved`` what the backward
    needs besides q, k, v and out. ``backward(d_out, q, k, v, out, saved, scale) -> (dq, dk, dv)``
    the kernel's own backward (it treats the log-sum-exp as a constant). ``pad``: columns
    appended to the head dimension for the log-sum-exp's gradient
    (:class:`_CausalAttentionWithLSE`), 8 where the kernel wants the head dimension aligned.
    """

    forward: Callable[..., tuple[torch.Tensor, torch.Tensor, tuple]]
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    pad: int


def _cpu_forward(q, k, v, scale):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, True, scale=scale)
    return out, lse, (lse,)


def _cpu_backward(d_out, q, k, v, out, saved, scale):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        d_out, q, k, v, out, saved[0], 0.0, True, scale=scale)


def _cuda_forward(q, k, v, scale):
    # The memory-efficient kernel: float32, float16 and bfloat16 (flash: no float32). Its
    # log-sum-exp comes padded to a multiple of 32 query rows: [B, h, ceil(T/32)*32].
    out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, True, scale=scale)
    return out, lse[..., :q.shape[2]], (lse, seed, offset)


def _cuda_backward(d_out, q, k, v, out, saved, scale):
    lse, seed, offset = saved
    dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        d_out, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False], True,
        scale=scale)
    return dq, dk, dv


#: The fused causal kernels that return their log-sum-exp, per device type: PyTorch's CPU flash
#: kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``) and its CUDA memory-efficient
#: kernel (``aten::_scaled_dot_product_efficient_attention``, which
#: ``F.scaled_dot_product_attention`` picks for float32). Both return the log-sum-exp as a
#: non-differentiable output.
LSE_KERNELS: dict[str, LSEKernel] = {
    "cpu": LSEKernel(_cpu_forward, _cpu_backward, pad=1),
    "cuda": LSEKernel(_cuda_forward, _cuda_backward, pad=8),
}


def _widen(x: torch.Tensor, col: torch.Tensor | float, pad: int) -> torch.Tensor:
    """x [..., d] -> [..., d + pad]: the first new column ``col`` ([..., 1] or a constant), the
    others zero."""
    col = torch.as_tensor(col, dtype=x.dtype, device=x.device).expand(*x.shape[:-1], 1)
    return torch.cat([x, col, x.new_zeros(*x.shape[:-1], pad - 1)], dim=-1)


class _CausalAttentionWithLSE(torch.autograd.Function):
    """Causal attention and its log-sum-exp, both differentiable, through a fused kernel of
    :data:`LSE_KERNELS` (which treats the log-sum-exp as non-differentiable).

    Forward: q, k, v [B, h, T, d] -> out [B, h, T, d], lse [B, h, T]. Backward: the kernel's
    own backward computes ``dS = P * (dO V^T - D)`` with ``D = rowsum(dO * out)`` taken from the
    ``out`` it is given; the log-sum-exp's gradient adds ``P * dlse`` to ``dS``. Both are
    obtained in one call by appending columns (:func:`_widen`): zeros to q, k and v (scores and
    P unchanged), ``-1`` to ``out`` and ``dlse`` to ``dO`` in the first, so that ``D`` becomes
    ``D - dlse`` and ``dO V^T`` is unchanged; the rest zero (alignment).
    """

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                kernel: LSEKernel) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse, saved = kernel.forward(q, k, v, scale)
        ctx.save_for_backward(q, k, v, out, *saved)
        ctx.scale, ctx.kernel = scale, kernel
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor | None, d_lse: torch.Tensor | None):
        q, k, v, out, *saved = ctx.saved_tensors
        kernel, scale = ctx.kernel, ctx.scale
        if d_out is None:
            d_out = torch.zeros_like(out)
        if d_lse is None:
            dq, dk, dv = kernel.backward(d_out.contiguous(), q, k, v, out, saved, scale)
            return dq, dk, dv, None, None
        p, d = kernel.pad, q.shape[-1]
        dq, dk, dv = kernel.backward(_widen(d_out, d_lse.unsqueeze(-1), p), _widen(q, 0.0, p),
                                     _widen(k, 0.0, p), _widen(v, 0.0, p), _widen(out, -1.0, p),
                                     saved, scale)
        return dq[..., :d], dk[..., :d], dv[..., :d], None, None


@functools.cache
def fused_kernel(device: torch.device, dtype: torch.dtype = torch.float32,
                 head_dim: int = 64) -> LSEKernel | None:
    """The kernel ``fused`` runs on ``device`` for q/k/v of ``dtype`` and ``head_dim``, or None
    (it then runs ``split``; a warning says so once). On CUDA the kernel is first checked, once
    per (device, dtype, head_dim), against :func:`ttt_attention_split` (:func:`check_fused_kernel`,
    run outside the caller's autocast and no-grad modes); if it raises or disagrees, ``fused``
    runs ``split`` there, with a warning naming why. The check sees one small problem: a fault
    of the kernel that shows only at other lengths or batch shapes would pass it."""
    kernel = LSE_KERNELS.get(device.type)
    if kernel is None:
        warnings.warn(f"TTT attention 'fused' has no kernel on {device.type}: it runs 'split' "
                      "(O(T^2) memory per row)", stacklevel=3)
        return None
    if device.type == "cpu":
        return kernel
    reason = check_fused_kernel(kernel, device, dtype, head_dim)
    if reason:
        warnings.warn(f"TTT attention 'fused' runs 'split' on {device} ({dtype}, head dim "
                      f"{head_dim}): {reason}", stacklevel=3)
        return None
    return kernel


#: Relative error allowed between the kernel and ``split`` (both in the checked dtype).
CHECK_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 5e-2,
                   torch.float16: 1e-2}


def check_fused_kernel(kernel: LSEKernel, device: torch.device, dtype: torch.dtype = torch.float32,
                       head_dim: int = 64) -> str | None:
    """None when ``kernel`` gives :func:`ttt_attention_split`'s output and q/k/v gradients
    through the log-sum-exp merge (2 TTT steps, B 1, 4 heads, T 37; inputs of ``dtype`` and
    ``head_dim``; relative error within :data:`CHECK_TOLERANCE`), else why not. Runs with
    autocast off and gradients on, whatever the caller's mode (the first call comes from inside
    a training step's autocast, or from a no-grad validation)."""
    g = torch.Generator().manual_seed(0)
    shape = (1, 4, 37, head_dim)
    leaves = [torch.randn(shape, generator=g).to(device, dtype).requires_grad_()
              for _ in range(5)]
    probe = torch.randn(shape, generator=g).to(device, dtype)
    results = []
    try:
        with torch.autocast(device.type, enabled=False), torch.enable_grad():
            for run in ("fused", "split"):
                q, k0, v0, k1, v1 = leaves
                if run == "split":
                    out = ttt_attention_split(q, [k0, k1], [v0, v1], head_dim ** -0.5)
                else:
                    out = _merge_lse(q, [k0, k1], [v0, v1], head_dim ** -0.5, kernel)
                grads = torch.autograd.grad((out.float() * probe.float()).sum(), leaves)
                results.append([out.detach().float(), *(x.float() for x in grads)])
    except Exception as e:  # noqa: BLE001 (any failure of the kernel means: do not use it)
        return f"the kernel raised {type(e).__name__}: {e}"
    tol = CHECK_TOLERANCE.get(dtype, 1e-2)
    for name, a, b in zip(("out", "dq", "dk0", "dv0", "dk1", "dv1"), *results):
        err = ((a - b).norm() / b.norm().clamp_min(1e-12)).item()
        if not err <= tol:
            return f"{name} differs from 'split' by {err:.2e} (relative, tolerance {tol:g})"
    return None


def _merge_lse(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
               scale: float, kernel: LSEKernel) -> torch.Tensor:
    """:func:`ttt_attention_fused` with a given kernel (shapes as there)."""
    out0, lse0 = _CausalAttentionWithLSE.apply(q, keys[0], values[0], scale, kernel)
    if len(keys) == 1:
        return out0
    diag = [(q * kj).sum(-1) * scale for kj in keys[1:]]  # k x [B, h, T]
    lse = torch.logsumexp(torch.stack([lse0, *diag]), dim=0)  # [B, h, T]
    out = torch.exp(lse0 - lse).unsqueeze(-1) * out0
    for s, vj in zip(diag, values[1:]):
        out = out + torch.exp(s - lse).unsqueeze(-1) * vj
    return out


def ttt_attention_fused(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                        scale: float) -> torch.Tensor:
    """The same attention as :func:`ttt_attention_dense` in O(k·T) memory, with a fused causal
    kernel for the step-0 block (it skips the masked half and never materialises the ``[T, T]``
    scores): ``out = (e^{lse0}·out0 + Σ_j e^{s_j}·v_j) / (e^{lse0} + Σ_j e^{s_j})`` with ``s_j``
    each query's score against its own key of step ``j >= 1``.

    q [B, h, T, d]; keys/values: one [B, h, T, d] per step 0..k. Returns [B, h, T, d]. The
    kernel is :func:`fused_kernel`'s for q's device (CPU, CUDA); elsewhere, or where the CUDA
    kernel fails its check, this runs :func:`ttt_attention_split` (with a warning).
    """
    kernel = fused_kernel(q.device, q.dtype, q.shape[-1])
    if kernel is None:
        return ttt_attention_split(q, keys, values, scale)
    return _merge_lse(q, keys, values, scale, kernel)


TTT_ATTENTION: dict[str, Callable[..., torch.Tensor]] = {
    "dense": ttt_attention_dense,
    "split": ttt_attention_split,
    "fused": ttt_attention_fused,
}


class DraftKVCache:
    """Key/value cache of the draft layer for inference: [B, kvh, S, d] each, croppable."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (drop rejected drafts)."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]


class Eagle3Attention(nn.Module):
    """Llama attention whose q/k/v read the 2H-wide ``[embed; hidden]`` input; with
    ``draft_layer="qwen3"`` also ``q_norm``/``k_norm`` (RMSNorm over each head's d dims, before
    rotary: vLLM ``qwen3.py`` ``Qwen3Attention.forward``)."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        if DRAFT_LAYERS[c.draft_layer]:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def qkv(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]):
        """x [B, T, 2H] -> q [B, h, T, d], k and v [B, kvh, T, d] (q/k norms, then rotary)."""
        B, T, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim)
        k = self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        if DRAFT_LAYERS[c.draft_layer]:
            q, k = self.q_norm(q), self.k_norm(k)  # per head, over d
        q, k = apply_rotary(q.transpose(1, 2), k.transpose(1, 2), *cos_sin)
        # Under autocast q/k/v leave the projections in bf16 but the fp32 rotary tables promote
        # q and k back to fp32; the fused CPU kernel takes one dtype, so all three share v's.
        return q.to(v.dtype), k.to(v.dtype), v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        """o [B, h, T, d] -> [B, T, H]."""
        B, h, T, d = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, T, h * d))  # T may be 0


class Eagle3MLP(nn.Module):
    """SwiGLU MLP ``down(silu(gate(x)) * up(x))``, [.., H] -> [.., H]; ``c`` needs only
    ``hidden_size`` and ``intermediate_size`` (the DFlash layers use it too)."""

    def __init__(self, c: Any) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3DecoderLayer(nn.Module):
    """The single draft decoder layer ("midlayer")."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Eagle3Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = Eagle3MLP(c)

    def attn_input(self, embeds: torch.Tensor, hidden: torch.Tensor):
        """-> (x [B, T, 2H] = [input_layernorm(embeds); hidden_norm(hidden)],
        residual [B, T, H])."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.c.norm_before_residual else hidden
        return torch.cat([self.input_layernorm(embeds), normed], dim=-1), residual

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Residual add, then the MLP block. -> prenorm output [B, T, H]."""
        r = residual + attn_out
        return r + self.mlp(self.post_attention_layernorm(r))


class Eagle3DraftModel(nn.Module):
    """EAGLE-3 drafter. See the module docstring for the data flow and checkpoint names."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        if c.norm_before_fc:
            self.input_norm = RMSNorm(c.n_aux * c.target_hidden_size, c.rms_norm_eps)
        if c.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(c.target_hidden_size, c.rms_norm_eps)
                                         for _ in range(c.n_aux))
        self.fc = nn.Linear(c.n_aux * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool)
                             if c.draft_vocab_size == c.vocab_size
                             else torch.zeros(c.vocab_size, dtype=torch.bool))
        self.rotary = DraftRotaryEmbedding(c.rotary_config())

    def fuse_aux(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """aux [B, T, n_aux*Ht] -> h [B, T, H] (step 0's feature input): ``input_norm`` over
        the whole concatenation (``norm_before_fc``), then ``fc_norm[i]`` on each aux chunk
        (``fc_norm``), then ``fc`` (vLLM ``combine_hidden_states``, in this order)."""
        a = aux_hidden.to(self.fc.weight.dtype)
        if self.config.norm_before_fc:
            a = self.input_norm(a)
        if self.config.fc_norm:
            chunks = a.chunk(self.config.n_aux, dim=-1)  # n_aux x [B, T, Ht]
            a = torch.cat([norm(x) for norm, x in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(a)

    def logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """prenorm [B, T, H] -> draft-vocab logits [B, T, K]."""
        return self.lm_head(self.norm(prenorm))

    def head_parts(self, prenorm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`logits` unapplied, for a fused head and loss
        (:func:`specdraft.train.fused_head.head_soft_ce`): ``(norm(prenorm) [..., H],
        lm_head.weight [K, H])``, whose product is the logits."""
        return self.norm(prenorm), self.lm_head.weight

    def feedback(self, prenorm: torch.Tensor) -> torch.Tensor:
        """prenorm [B, T, H] -> the hidden state fed to the next draft step [B, T, H]:
        ``norm(prenorm)`` with ``norm_output`` (EAGLE-3.1), else ``prenorm`` (EAGLE-3). vLLM
        ``llama_eagle3.py`` returns it as the aux output the proposer feeds back."""
        return self.norm(prenorm) if self.config.norm_output else prenorm

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocab ids -> verifier-vocab ids (``id + d2t[id]``), any shape, int64."""
        return draft_ids + self.d2t[draft_ids]

    def ttt_step(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                 history: list[tuple[torch.Tensor, torch.Tensor]]):
        """One training-time-test step over all T columns at once.

        input_ids [B, T] int64 (token at column t for this step), hidden [B, T, H] (``fuse_aux``
        output at step 0, :meth:`feedback` of the previous step's output after), position_ids [B, T]
        (``t + step``), ``history``: (k, v) of the earlier steps, each [B, kvh, T, d]; the new
        step's (k, v) is appended to it. Right padding needs no mask: a valid query never
        sees a later (pad) column. Returns prenorm [B, T, H]; ``logits(prenorm)`` gives [B, T, K].
        """
        layer = self.midlayer
        x, residual = layer.attn_input(self.embed_tokens(input_ids), hidden)
        q, k, v = layer.self_attn.qkv(x, self.rotary(x, position_ids))
        history.append((k, v))
        n_rep = self.config.num_attention_heads // self.config.num_key_value_heads
        keys = [repeat_kv(kj, n_rep) for kj, _ in history]
        values = [repeat_kv(vj, n_rep) for _, vj in history]
        o = TTT_ATTENTION[self.config.attn_impl](q, keys, values, self.config.head_dim ** -0.5)
        return layer.finish(layer.self_attn.out(o), residual)

    def ttt_step_live(self, input_ids: torch.Tensor, hidden: torch.Tensor,
                      position_ids: torch.Tensor, history: list[tuple[torch.Tensor, torch.Tensor]],
                      live: tuple[torch.Tensor, torch.Tensor], width: tuple[int, int]
                      ) -> torch.Tensor:
        """:meth:`ttt_step` computed only at the live columns ``live = (b, t)`` (int64 [N]
        each, row-major, the same every step) of the ``width = (B, L)`` grid: the columns whose
        output some later supervised step reads. Step 0 (``history`` empty): input_ids
        [B, L], hidden [B, L, H], position_ids [B, L]; every column's key and value are
        computed (each later query attends to the step-0 keys of its whole prefix), the
        attention output, ``o_proj`` and MLP only at the live columns. Later steps: input_ids
        [N], hidden [N, H], position_ids [N]; everything at the live columns only; their keys
        and values go to ``history`` scattered once to [B, kvh, L, d] (zeros elsewhere), so the
        live queries see exactly what they see in :meth:`ttt_step`. Returns prenorm [N, H]:
        :meth:`ttt_step`'s rows at ``(b, t)`` up to float rounding
        (``tests/train/test_objective.py``).

        A prompt or padding column none of whose steps is supervised costs only its step-0
        key/value here: on short-answer rows about half the layer's multiply-adds.
        """
        layer = self.midlayer
        b, t = live
        B, L = width
        if not history:
            x, residual = layer.attn_input(self.embed_tokens(input_ids), hidden)  # [B, L, *]
            q, k, v = layer.self_attn.qkv(x, self.rotary(x, position_ids))  # [B, h, L, d]
            history.append((k, v))
            residual = residual[b, t]  # [N, H]
        else:
            x, residual = layer.attn_input(self.embed_tokens(input_ids)[None], hidden[None])
            q, k, v = layer.self_attn.qkv(x, self.rotary(x, position_ids[None]))  # [1, h, N, d]
            history.append((_scatter_columns(k, b, t, B, L), _scatter_columns(v, b, t, B, L)))
            q, residual = _scatter_columns(q, b, t, B, L), residual[0]
        n_rep = self.config.num_attention_heads // self.config.num_key_value_heads
        keys = [repeat_kv(kj, n_rep) for kj, _ in history]
        values = [repeat_kv(vj, n_rep) for _, vj in history]
        o = TTT_ATTENTION[self.config.attn_impl](q, keys, values, self.config.head_dim ** -0.5)
        o = o[b, :, t].transpose(0, 1).unsqueeze(0)  # [B, h, L, d] -> [1, h, N, d]
        return layer.finish(layer.self_attn.out(o)[0], residual)

    def forward_cached(self, input_ids: torch.Tensor, hidden: torch.Tensor,
                       position_ids: torch.Tensor, cache: DraftKVCache,
                       key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Inference: T new columns attend to the cache and causally to each other.

        input_ids [B, T], hidden [B, T, H], position_ids [B, T]; the new keys are appended to
        ``cache``. ``key_mask`` (bool [B, S] over the cached + new columns, None = all) hides
        padding and holes of rows batched together; a column always sees its own key, so a
        padding query stays finite. Returns prenorm [B, T, H].
        """
        layer = self.midlayer
        x, residual = layer.attn_input(self.embed_tokens(input_ids), hidden)
        q, k, v = layer.self_attn.qkv(x, self.rotary(x, position_ids))
        past = cache.length
        k_all, v_all = cache.append(k, v)
        n_rep = self.config.num_attention_heads // self.config.num_key_value_heads
        T, S = q.shape[2], k_all.shape[2]
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=past)
        if key_mask is not None:
            own = mask & ~mask.tril(diagonal=past - 1)  # [T, S]: each column's own key
            mask = (mask & key_mask[:, None, None, :]) | own  # [B, 1, T, S]
        o = F.scaled_dot_product_attention(q, repeat_kv(k_all, n_rep), repeat_kv(v_all, n_rep),
                                           attn_mask=mask, scale=self.config.head_dim ** -0.5)
        return layer.finish(layer.self_attn.out(o), residual)

    def checkpoint_state(self, *, include_embed: bool = False) -> dict[str, torch.Tensor]:
        """The tensors an engine checkpoint holds, by their exported names (no rename)."""
        state = {k: v for k, v in self.state_dict().items() if not k.startswith("rotary.")}
        if not include_embed:
            state.pop("embed_tokens.weight")
        return state
