"""The DFlash drafter (block drafting: one forward drafts a whole block), in one readable file.

The contract is vLLM 0.32's, read (for facts only) from
``vllm/model_executor/models/qwen3_dflash.py`` (``DFlashQwen3ForCausalLM``, ``DFlashQwen3Model``,
``DFlashQwen3Attention``), ``vllm/v1/spec_decode/dflash.py`` (``DFlashProposer``),
``vllm/v1/spec_decode/utils.py`` (``copy_and_expand_dflash_inputs_kernel``: the block's ids and
positions) and ``vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py``
(``get_eagle3_aux_layers_from_config``: which target layers are read).

One block, anchored at position ``a`` (the last committed token ``x_a``, whose verifier hidden
state does not exist yet; vLLM calls it the bonus / next token)::

    g_t = cat_i HF hidden_states[target_layer_ids[i] + 1][t]   [T, n*Ht]  context t = 0..a-1
    c   = hidden_norm(fc(g))                                    [T, H]   (fc: combine_hidden_states;
                                                      hidden_norm: precompute_and_store_context_kv)
    per layer l:  Kc_l = rope(k_norm_l(k_proj_l(c)), t)         [T, kvh, d]  (no input_layernorm)
                  Vc_l = v_proj_l(c)                            [T, kvh, d]
    ids = [x_a, m, ..., m]  (m = mask_token_id, K of them)      [K+1]     positions a..a+K
    h   = embed(ids)                       the VERIFIER's embedding (the drafter has none)
    per layer l (Qwen3 pre-norm layer):
        q, k, v = proj(input_layernorm(h)); q_norm / k_norm per head; rope at a..a+K
        attention keys [Kc_l ; k], values [Vc_l ; v]: every block query sees every context
        column and every block column (bidirectional inside the block, unless ``causal``)
        h = h + o_proj(attn);  h = h + mlp(post_attention_layernorm(h))
    logits = lm_head(norm(h))              the VERIFIER's head                [K+1, V]
    draft j (1..K) = argmax logits[j]: slot j predicts x_{a+j}, the token at its own position

``target_layer_ids`` count layer *outputs*: id ``t`` is the output of decoder layer ``t``, i.e.
HF ``hidden_states[t + 1]`` (vLLM adds 1 and captures ``hidden_states + residual`` before layer
``t + 1``, ``interfaces.py`` ``_maybe_add_hidden_state``). Valid ids are ``0..N-2``: id ``N-1``
would be HF's post-norm last state, which the engine captures before the norm.

Training (:meth:`DFlashDraftModel.forward` with several blocks per row) and offline eval
(:func:`draft_block`, one block) run the same forward. Checkpoint keys equal the attribute names
(``fc.weight``, ``hidden_norm.weight``, ``norm.weight``, ``layers.{i}.input_layernorm.weight``,
``layers.{i}.post_attention_layernorm.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``), the
names vLLM's ``DFlashQwen3ForCausalLM.load_weights`` reads (it prefixes ``model.``); the frozen
``embed_tokens`` and ``lm_head`` copies of the verifier's are never exported (vLLM shares the
target's when the checkpoint has none: ``llm_base_proposer.py`` ``_maybe_share_embeddings`` /
``_maybe_share_lm_head``).

Model files never import ``torch.distributed``; parallelism is applied from outside.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig

from specdraft.core.aux_ids import dflash_target_to_hf_ids
from specdraft.core.errors import ConfigError
from specdraft.core.profile import resolve_profile
from specdraft.models.eagle3 import (DraftRotaryEmbedding, Eagle3MLP, RMSNorm, apply_rotary,
                                     repeat_kv)


@dataclass(frozen=True, kw_only=True)
class DFlashConfig:
    """Shape and computation of a DFlash drafter.

    Layer shape (hidden, heads, head_dim, MLP width, eps, rotary theta, max positions, vocab) is
    the verifier's (:meth:`from_verifier`): the block is embedded by the verifier's table and
    read out by its head, so ``hidden_size`` must be the verifier's. ``num_hidden_layers``: the
    drafter's own decoder layers. ``target_layer_ids``: layer-output ids (module doc).
    ``block_size``: K + 1 (anchor + K mask slots) the drafter is trained for; vLLM does not read
    it (``num_speculative_tokens`` = ``block_size - 1`` must be passed). ``causal``: causal
    attention inside the block (vLLM ``dflash_config.causal``; DFlash is non-causal, False).
    """

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    target_hidden_size: int
    target_num_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int
    causal: bool = False
    hidden_act: str = "silu"
    verifier_profile: dict[str, Any] | None = None
    verifier_identity: dict[str, Any] | None = None
    #: the drafter kind (:mod:`specdraft.kinds`), written as ``"kind"`` by :meth:`to_dict`
    kind: ClassVar[str] = "dflash"

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        problems = config_problems(self)
        if problems:
            raise ConfigError("DFlash drafter config: " + "; ".join(problems))

    @property
    def n_target(self) -> int:
        return len(self.target_layer_ids)

    def hf_hidden_ids(self) -> list[int]:
        """The HF ``hidden_states`` indices the drafter reads: ``target_layer_ids + 1``."""
        return dflash_target_to_hf_ids(self.target_layer_ids)

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        """:meth:`hf_hidden_ids` as a tuple: the aux ids (HF convention,
        :data:`specdraft.models.eagle3.AUX_CONVENTION`) a run extracts for this drafter."""
        return tuple(self.hf_hidden_ids())

    def to_dict(self) -> dict[str, Any]:
        """The fields, with the declared ``kind`` first (``drafter_config.json``)."""
        d = {"kind": self.kind, **asdict(self)}
        d["target_layer_ids"] = list(self.target_layer_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DFlashConfig":
        """Strict: ValueError naming every key that is not a field, or a ``kind`` other than
        ``dflash`` (a config without it predates the field)."""
        d = dict(d)
        kind = d.pop("kind", cls.kind)
        if kind != cls.kind:
            raise ValueError(f"kind {kind!r}: not a DFlash drafter config")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"DFlash drafter config key(s) {unknown}: specdraft does not "
                             f"implement them")
        return cls(**d)

    @classmethod
    def from_verifier(cls, hf_config: Any, *, target_layer_ids: Sequence[int],
                      mask_token_id: int, block_size: int, num_hidden_layers: int = 1,
                      **overrides: Any) -> "DFlashConfig":
        """The drafter's shape from the verifier's HF config (its profile,
        :func:`specdraft.core.profile.resolve_profile`). Only the default rotary over whole heads
        is implemented (vLLM's draft layer builds its rope from the draft config): any other is
        refused with :class:`ConfigError` naming it, as is a verifier without a dense MLP width.
        """
        return cls.from_profile(resolve_profile(hf_config), target_layer_ids=target_layer_ids,
                                mask_token_id=mask_token_id, block_size=block_size,
                                num_hidden_layers=num_hidden_layers, **overrides)

    @classmethod
    def from_profile(cls, p: Any, *, target_layer_ids: Sequence[int], mask_token_id: int,
                     block_size: int, num_hidden_layers: int = 1, **overrides: Any
                     ) -> "DFlashConfig":
        """:meth:`from_verifier` from a resolved
        :class:`~specdraft.core.profile.VerifierProfile` (what ``specdraft extract`` stores)."""
        rope = p.rotary
        if rope.rope_type != "default" or rope.partial_rotary_factor != 1.0 or rope.interleaved:
            raise ConfigError(f"verifier rotary {rope.rope_parameters()}: the DFlash drafter "
                              f"implements only the default rotary over whole heads")
        if p.intermediate_size is None or p.mla is not None:
            raise ConfigError(f"verifier {p.model_type}: the DFlash drafter needs a dense "
                              f"intermediate_size and standard attention (no MLA)")
        values = dict(hidden_size=p.hidden_size, num_attention_heads=p.num_attention_heads,
                      num_key_value_heads=p.num_key_value_heads, head_dim=p.head_dim,
                      intermediate_size=p.intermediate_size, num_hidden_layers=num_hidden_layers,
                      rms_norm_eps=p.rms_norm_eps, rope_theta=rope.theta,
                      max_position_embeddings=p.max_position_embeddings,
                      vocab_size=p.vocab_size, target_hidden_size=p.hidden_size,
                      target_num_layers=p.n_layers, target_layer_ids=tuple(target_layer_ids),
                      mask_token_id=int(mask_token_id), block_size=int(block_size),
                      verifier_profile=p.to_dict())
        values.update(overrides)
        return cls(**values)


def spread_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The default target layers of z-lab's DFlash and SpecForge: as many as the drafter has
    layers, spread evenly from layer-output id 1 to ``L - 3`` and rounded (Python's ``round``,
    half to even), or ``[L // 2]`` for a 1-layer drafter; layer-output ids (module doc: HF
    ``hidden_states[id + 1]``). Source: z-lab/dflash ``modeling_dflash.py`` and
    sgl-project/SpecForge ``specforge/modeling/draft/dflash.py`` ``build_target_layer_ids``
    (read for the rule). A 2-layer drafter on a 30-layer verifier reads ``[1, 27]``.

    Raises :class:`ConfigError` when the verifier has fewer than 4 layers (no id 1 below
    ``L - 3``) or the drafter has none."""
    L, n = int(num_target_layers), int(num_draft_layers)
    if n < 1 or L < 4:
        raise ConfigError(f"spread target layers: {n} draft layers on a {L}-layer verifier "
                          f"(needs >= 1 draft layer and >= 4 verifier layers)")
    if n == 1:
        return [L // 2]
    return [int(round(1 + i * (L - 4) / (n - 1))) for i in range(n)]


def init_normal_(model: nn.Module, std: float, generator: torch.Generator | None = None
                 ) -> None:
    """Draw every trainable ``nn.Linear`` weight of ``model`` from N(0, std²) in place (HF's
    ``_init_weights`` with ``initializer_range`` = ``std``; z-lab and SpecForge build their
    drafter with it at 0.02); norms keep their ones, the frozen verifier tables (embedding,
    head) are not touched. ``generator``: None uses torch's global generator."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.weight.requires_grad:
                module.weight.normal_(0.0, std, generator=generator)


def config_problems(c: DFlashConfig) -> list[str]:
    """Every inconsistency of ``c``, each naming the field (empty when valid)."""
    out = []
    ids, n = list(c.target_layer_ids), c.target_num_layers
    if not ids or any(b <= a for a, b in zip(ids, ids[1:])) or ids[0] < 0 or ids[-1] > n - 2:
        out.append(f"target_layer_ids {ids} must increase strictly inside [0, {n - 2}] "
                   f"(layer-output ids of a {n}-layer verifier; id {n - 1} is the post-norm "
                   f"state in HF, pre-norm in vLLM)")
    if c.block_size < 2:
        out.append(f"block_size {c.block_size} must be >= 2 (the anchor and one mask slot)")
    if not 0 <= c.mask_token_id < c.vocab_size:
        out.append(f"mask_token_id {c.mask_token_id} not in the vocabulary [0, {c.vocab_size})")
    if c.num_attention_heads % c.num_key_value_heads:
        out.append(f"num_attention_heads {c.num_attention_heads} not a multiple of "
                   f"num_key_value_heads {c.num_key_value_heads}")
    if c.hidden_size != c.target_hidden_size:
        out.append(f"hidden_size {c.hidden_size} != target_hidden_size {c.target_hidden_size}: "
                   f"the block is embedded and read out by the verifier's own tables")
    if c.hidden_act != "silu":
        out.append(f"hidden_act {c.hidden_act!r}: only silu is implemented")
    if c.num_hidden_layers < 1:
        out.append(f"num_hidden_layers {c.num_hidden_layers} must be >= 1")
    return out


class DFlashAttention(nn.Module):
    """Qwen3 attention (q/k RMSNorm per head before rotary) whose keys/values are the context's
    (made from the fused target states) followed by the block's own."""

    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]
           ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, S, H] -> k, v [B, kvh, S, d]: k normed per head then rotated at x's positions.
        For the context x is ``hidden_norm(fc(g))`` itself, without ``input_layernorm`` (vLLM
        ``DFlashQwen3Model.precompute_and_store_context_kv``)."""
        B, S, _ = x.shape
        c = self.c
        k = self.k_norm(self.k_proj(x).view(B, S, c.num_key_value_heads, c.head_dim))
        v = self.v_proj(x).view(B, S, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        cos, sin = cos_sin
        k = apply_rotary(k.transpose(1, 2), k.transpose(1, 2), cos, sin)[1]
        return k, v

    def forward(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor],
                ctx_kv: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """x [B, Q, H] (normed block states), ctx_kv: k, v [B, kvh, T, d], mask bool
        [B, 1, Q, T+Q] (True = attend) -> [B, Q, H]."""
        B, Q, _ = x.shape
        c = self.c
        q = self.q_norm(self.q_proj(x).view(B, Q, c.num_attention_heads, c.head_dim))
        k, v = self.kv(x, cos_sin)
        q = apply_rotary(q.transpose(1, 2), q.transpose(1, 2), *cos_sin)[0]  # [B, h, Q, d]
        n_rep = c.num_attention_heads // c.num_key_value_heads
        keys = repeat_kv(torch.cat([ctx_kv[0], k], dim=2), n_rep)  # [B, h, T+Q, d]
        values = repeat_kv(torch.cat([ctx_kv[1], v], dim=2), n_rep)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                           scale=c.head_dim ** -0.5)  # [B, h, Q, d]
        return self.o_proj(o.transpose(1, 2).reshape(B, Q, -1))


class DFlashDecoderLayer(nn.Module):
    """One Qwen3 pre-norm decoder layer of the drafter (vLLM ``DFlashQwen3DecoderLayer``)."""

    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DFlashAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = Eagle3MLP(c)  # the same SwiGLU MLP, same keys

    def forward(self, h: torch.Tensor, cos_sin, ctx_kv, mask: torch.Tensor) -> torch.Tensor:
        """h [B, Q, H] -> [B, Q, H] (pre-norm residual stream)."""
        h = h + self.self_attn(self.input_layernorm(h), cos_sin, ctx_kv, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


def block_mask(anchors: torch.Tensor, T: int, Q: int, *, causal: bool = False,
               context_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Bool [B, 1, nb*Q, T + nb*Q] attention mask of ``nb`` blocks of ``Q`` slots (True = attend).

    anchors [B, nb] int64: block ``b`` sits at positions ``anchors[b] .. anchors[b] + Q - 1`` and
    its queries see context columns ``t < anchors[b]`` (the verifier states that exist when
    ``x_{anchor}`` is the last committed token) and every slot of their own block (only the
    earlier ones and itself when ``causal``), never another block. ``context_valid`` [B, T]
    bool hides padding columns of the context.
    """
    B, nb = anchors.shape
    dev = anchors.device
    t = torch.arange(T, device=dev)
    ctx = t[None, None, :] < anchors[:, :, None]  # [B, nb, T]
    if context_valid is not None:
        ctx = ctx & context_valid[:, None, :]
    ctx = ctx[:, :, None, :].expand(B, nb, Q, T).reshape(B, nb * Q, T)
    own = torch.ones(Q, Q, dtype=torch.bool, device=dev)
    if causal:
        own = own.tril()
    blocks = torch.block_diag(*[own] * nb)  # [nb*Q, nb*Q]
    return torch.cat([ctx, blocks[None].expand(B, -1, -1)], dim=-1)[:, None]


class DFlashDraftModel(nn.Module):
    """DFlash drafter (module docstring: data flow, shapes, checkpoint names)."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.embed_tokens.weight.requires_grad_(False)  # the verifier's, frozen
        self.lm_head.weight.requires_grad_(False)
        self.fc = nn.Linear(c.n_target * c.target_hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = DraftRotaryEmbedding(LlamaConfig(
            hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
            head_dim=c.head_dim, max_position_embeddings=c.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta}))

    def set_verifier_tables(self, verifier: Any) -> None:
        """Copy the verifier's input embedding and LM head (HF model) into the frozen tables."""
        with torch.no_grad():
            self.embed_tokens.weight.copy_(verifier.get_input_embeddings().weight)
            self.lm_head.weight.copy_(verifier.get_output_embeddings().weight)

    def context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """target_hidden [B, T, n*Ht] (HF ``hidden_states[i+1]`` of each target layer id,
        concatenated in id order) -> ``hidden_norm(fc(.))`` [B, T, H]."""
        return self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))

    def forward(self, target_hidden: torch.Tensor, block_ids: torch.Tensor,
                anchors: torch.Tensor, context_valid: torch.Tensor | None = None
                ) -> torch.Tensor:
        """The block forward, for training (many blocks per row) and eval (one).

        target_hidden [B, T, n*Ht] float (context positions 0..T-1), block_ids [B, nb, Q] int64
        (``[x_anchor, mask, ..., mask]``), anchors [B, nb] int64 (each block's first position;
        its queries see context ``t < anchor``: :func:`block_mask`). Returns the final-norm
        states [B, nb, Q, H]; ``lm_head`` of them are the logits, slot ``j`` predicting the
        token at position ``anchor + j``.
        """
        B, nb, Q = block_ids.shape
        T = target_hidden.shape[1]
        ctx = self.context(target_hidden)  # [B, T, H]
        ctx_pos = torch.arange(T, device=ctx.device)[None].expand(B, T)
        blk_pos = (anchors[:, :, None] + torch.arange(Q, device=ctx.device)).reshape(B, nb * Q)
        h = self.embed_tokens(block_ids.reshape(B, nb * Q)).to(ctx.dtype)  # [B, nb*Q, H]
        ctx_rot, blk_rot = self.rotary(ctx, ctx_pos), self.rotary(h, blk_pos)
        mask = block_mask(anchors, T, Q, causal=self.config.causal, context_valid=context_valid)
        for layer in self.layers:
            ctx_kv = layer.self_attn.kv(ctx, ctx_rot)  # [B, kvh, T, d] each
            h = layer(h, blk_rot, ctx_kv, mask)
        return self.norm(h).view(B, nb, Q, -1)

    def checkpoint_state(self, *, include_embed: bool = False) -> dict[str, torch.Tensor]:
        """The tensors vLLM's checkpoint holds, by their names: everything but the verifier's
        tables and the rotary buffers. ``include_embed``: also the frozen copies of the
        verifier's ``embed_tokens.weight`` and ``lm_head.weight`` (specdraft's own drafter
        directory, :mod:`specdraft.models.io`, is self-contained)."""
        skip = ("rotary.",) if include_embed else ("rotary.", "embed_tokens.", "lm_head.")
        return {k: v for k, v in self.state_dict().items() if not k.startswith(skip)}


@torch.inference_mode()
def draft_block(model: DFlashDraftModel, target_hidden: torch.Tensor, anchor_token: int,
                k: int) -> torch.Tensor:
    """The K greedy drafts of one block, as vLLM's ``DFlashProposer`` makes them.

    target_hidden [T, n*Ht] float: the verifier's states of the chosen layers at positions
    ``0..T-1`` (every committed token but the last); ``anchor_token``: the last committed token,
    at position T. The query is ``[anchor, mask × k]`` at positions ``T .. T+k``; drafts are the
    argmax of the verifier's head at slots ``1..k`` (the anchor's own logits are not sampled).
    Returns [k] int64 token ids.
    """
    dev = model.fc.weight.device
    T = target_hidden.shape[0]
    ids = torch.tensor([[[anchor_token] + [model.config.mask_token_id] * k]], device=dev)
    out = model(target_hidden[None].to(dev), ids, torch.tensor([[T]], device=dev))  # [1,1,k+1,H]
    return model.lm_head(out[0, 0, 1:]).float().argmax(-1).cpu()  # [k]
