"""The verifier profile: every verifier-family convention a stage depends on, resolved once here.

A drafter trains to a good loss and then does not accept when served when one of these is
resolved wrongly (issue #12): the final norm's gain convention, whether a stored final state is
before or after that norm, the rotary type and its parameters, ``max_position_embeddings``, tied
embeddings, and the MoE / MLA facts that change the drafter's shape. Stages read them from here,
never from a raw HF config.

Norm gain conventions (transformers 5.24 ``modeling_*.py``):

- ``"w"``: ``w * x / rms(x)`` — Llama, Qwen2/3, Qwen3-MoE, Mistral, gpt-oss, DeepSeek-V3/Kimi-K2;
- ``"1+w"``: ``(1 + w) * x / rms(x)`` — Gemma 1/2/3 (``GemmaRMSNorm``), Qwen3-Next, Qwen3.5
  (their checkpoints store the gain as an offset from 1).
"""

from __future__ import annotations

from typing import Literal

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
