"""Drafting settings and the serve plan's cost model, without torch (the config validates
with them): SGLang's tree shape, a sweep's settings, the cost model of :mod:`specdraft.eval.plan`
(its module doc), and the engine constraints a setting must meet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdraft.core.errors import ConfigError


@dataclass(frozen=True)
class TreeShape:
    """SGLang's ``--speculative-num-steps``, ``--speculative-eagle-topk`` and
    ``--speculative-num-draft-tokens`` (the root, i.e. the last committed token, counted)."""

    steps: int
    topk: int
    num_draft_tokens: int

    @property
    def pool_size(self) -> int:
        """Candidates drafted per verify step: ``K + (S-1)·K²``."""
        return self.topk + (self.steps - 1) * self.topk ** 2

    def check(self) -> "TreeShape":
        """Raise :class:`ConfigError` for a shape SGLang would refuse or silently change."""
        S, K, N = self.steps, self.topk, self.num_draft_tokens
        if S < 1 or K < 1:
            raise ConfigError(f"--k {S} / --topk {K}: SGLang needs --speculative-num-steps >= 1 "
                              "and --speculative-eagle-topk >= 1")
        if K == 1 and N != S + 1:
            raise ConfigError(f"--num-draft-tokens {N} with --topk 1: SGLang replaces it by "
                              f"speculative_num_steps + 1 = {S + 1} for a chain (server_args.py "
                              f"'speculative_num_draft_tokens is adjusted'); give {S + 1}")
        if N < S + 1:
            raise ConfigError(f"--num-draft-tokens {N} is below --k + 1 = {S + 1}: drafts "
                              f"deeper than {N - 1} can never be verified (SGLang verifies N "
                              "tokens, the root included); raise it or lower --k")
        if N - 1 > self.pool_size:
            raise ConfigError(f"--num-draft-tokens {N}: only K + (S-1)·K² = {self.pool_size} "
                              f"candidates are drafted with --k {S} --topk {K} (SGLang's "
                              "torch.topk over the pool fails); give at most "
                              f"{self.pool_size + 1}")
        return self


def check_engine_shape(engine: str, shape: TreeShape) -> None:
    """Refuse a tree for an engine that only drafts chains: vLLM 0.32's ``SpeculativeConfig``
    has ``num_speculative_tokens`` and no tree (``vllm/config/speculative.py``)."""
    if engine in ("vllm", "auto") and shape.topk > 1:
        raise ConfigError(f"--topk {shape.topk} with --engine vllm: vLLM 0.32 drafts a chain "
                          "(speculative_config num_speculative_tokens, no eagle top-k): use "
                          "--topk 1, or --engine sglang for a tree")


@dataclass(frozen=True)
class Setting:
    """One drafting setting: ``topk == 1`` and ``num_draft_tokens == steps + 1`` is a chain."""

    steps: int
    topk: int = 1
    num_draft_tokens: int | None = None

    @property
    def shape(self) -> TreeShape:
        return TreeShape(self.steps, self.topk, self.num_draft_tokens or self.steps + 1)

    @property
    def chain(self) -> bool:
        return self.topk == 1

    @property
    def label(self) -> str:
        s = self.shape
        return f"chain k={s.steps}" if self.chain else \
            f"tree {s.steps}x{s.topk}x{s.num_draft_tokens}"

    @property
    def verify_tokens(self) -> int:
        return self.shape.num_draft_tokens

    def serve_commands(self, export_dir: str, verifier: str, fmt: str = "sglang", *,
                       dtype: str = "float32", python: str = "python") -> list[str]:
        """vLLM's command line for a chain, SGLang's for a chain or a tree when the export
        ``fmt`` is one SGLang loads, at ``dtype`` (vLLM run by ``python``)
        (:func:`specdraft.engines.serve.serve_commands`)."""
        from specdraft.engines.serve import serve_commands

        s = self.shape
        return serve_commands(export_dir, verifier, s.steps, s.topk, s.num_draft_tokens, fmt,
                              dtype=dtype, python=python)


def parse_sweep(text: str) -> list[Setting]:
    """``'2,3,5x4x8'`` -> settings; raises :class:`ConfigError` naming ``--sweep`` and the
    engine's constraint for a shape an engine refuses."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        parts = item.split("x")
        if not item or len(parts) not in (1, 3) or not all(p.isdigit() for p in parts):
            raise ConfigError(f"--sweep {text!r}: {item!r} is neither K (a chain of K drafts) "
                              "nor SxKxN (SGLang steps x topk x num-draft-tokens)")
        nums = [int(p) for p in parts]
        setting = Setting(nums[0]) if len(nums) == 1 else Setting(*nums)
        try:
            setting.shape.check()
        except ConfigError as err:
            raise ConfigError(f"--sweep {item}: {err}") from None
        out.append(setting)
    return out


def check_tree_options(config: Any) -> None:
    """Refuse tree options that cannot be evaluated or served (called by EvalConfig)."""
    if config.tree:
        shape = TreeShape(config.k, config.topk, config.num_draft_tokens or config.k + 1)
        shape.check()
        check_engine_shape(config.engine, shape)
        if config.topk > 1 and config.temperature > 0:
            raise ConfigError(f"--topk {config.topk} with --temperature {config.temperature}: "
                              "the tree eval is greedy only (SGLang's tree sampling is not "
                              "reproduced); use --temperature 0")
        if config.batch_size > 1:
            raise ConfigError("--topk/--num-draft-tokens with --batch-size > 1: trees are "
                              "decoded one prompt at a time; use --batch-size 1")
    if config.sweep is not None:
        parse_sweep(config.sweep)
        if config.temperature > 0:
            raise ConfigError("--sweep is greedy only: use --temperature 0")
    if config.cost_model is not None:
        CostModel.parse(config.cost_model)


@dataclass(frozen=True)
class CostModel:
    """Seconds (or any one unit) of one drafter forward, a verifier forward's fixed part and
    its part per verified token (module doc)."""

    draft: float
    verify: float
    per_token: float
    source: str = "given"

    @classmethod
    def parse(cls, text: str) -> "CostModel":
        """``'draft=0.1,verify=1,per_token=0.02'``; raises :class:`ConfigError`."""
        try:
            values = {k.strip(): float(v) for k, v in (p.split("=") for p in text.split(","))}
            model = cls(values.pop("draft"), values.pop("verify"), values.pop("per_token"))
        except (ValueError, KeyError):
            raise ConfigError(f"--cost-model {text!r}: give draft=D,verify=A,per_token=B "
                              "(numbers in one unit)") from None
        if values or min(model.draft, model.verify, model.per_token) < 0 or \
                model.verify + model.per_token <= 0:
            raise ConfigError(f"--cost-model {text!r}: exactly draft, verify and per_token, "
                              "none negative, verify + per_token > 0")
        return model

    def step(self, setting: Setting) -> float:
        """Cost of one verify step of ``setting``: S drafts + a verify over n tokens."""
        return setting.steps * self.draft + self.verify + self.per_token * setting.verify_tokens

    def speedup(self, setting: Setting, tau: float) -> float:
        """Predicted decode speedup over no speculation: τ tokens per ``step`` against one
        token per ``verify + per_token``."""
        return tau * (self.verify + self.per_token) / self.step(setting)

    def to_dict(self) -> dict[str, Any]:
        return {"draft": self.draft, "verify": self.verify, "per_token": self.per_token,
                "source": self.source}
