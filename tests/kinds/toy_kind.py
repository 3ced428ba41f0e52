"""A third drafter kind, registered from the tests alone: the proof that a kind costs one module
and one row per table, with no edit under ``src/`` (docs/architecture.md "Kinds").

The toy drafter is a low-rank bigram: the draft after token ``t`` is
``argmax(emb[t] @ out)`` (``emb`` [V, R], ``out`` [R, V]), chained ``k`` times from the last
committed token; it reads no verifier state. Its objective is the cross-entropy of the next
token at the supervised positions (one loss position per column, ``steps = 1``); its export
format ``toy`` is ``config.json`` (``architectures: ["ToyBigram"]``, the config's fields) and
``model.safetensors`` (the two tables under their own names).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from specdraft import kinds
from specdraft.artifacts.export import Candidate, ExportRequest
from specdraft.artifacts.validate import ExportRefused
from specdraft.train.objective import StepOutput

NAME, ARCH, FORMAT = "toy", "ToyBigram", "toy"


@dataclass(frozen=True, kw_only=True)
class ToyConfig:
    """vocab_size V (the verifier's), rank R, the run's aux ids (the verifier states the eval
    loop captures; the toy ignores them)."""

    vocab_size: int
    rank: int
    hidden_size: int
    aux_layer_ids: tuple[int, ...]
    kind: ClassVar[str] = NAME

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self), "aux_layer_ids": list(self.aux_layer_ids)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ToyConfig":
        d = {k: v for k, v in d.items() if k not in ("kind", "architectures")}
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"toy config key(s) {unknown}")
        return cls(**{**d, "aux_layer_ids": tuple(d["aux_layer_ids"])})


class ToyDrafter(nn.Module):
    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.config = config
        self.emb = nn.Parameter(torch.randn(config.vocab_size, config.rank) * 0.1)  # [V, R]
        self.out = nn.Parameter(torch.randn(config.rank, config.vocab_size) * 0.1)  # [R, V]

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """[..., V] next-token logits of ``tokens`` [...]."""
        return self.emb[tokens] @ self.out

    def checkpoint_state(self, *, include_embed: bool = False) -> dict[str, torch.Tensor]:
        return dict(self.state_dict())


# ------------------------------------------------------------------ the kind's objective (train)
class ToyObjective(nn.Module):
    """Next-token cross-entropy at the supervised positions: ``input_ids[p] -> input_ids[p+1]``
    where ``sup[p]`` (``loss_mask[p+1] == 1``)."""

    steps, weights = 1, [1.0]

    def __init__(self, drafter: ToyDrafter) -> None:
        super().__init__()
        self.drafter, self.step = drafter, 0

    def _sup(self, batch: Any) -> torch.Tensor:
        sup = batch.sup.clone()
        sup[:, -1] = False  # no next token in the row
        return sup

    def loss_counts(self, batch: Any) -> torch.Tensor:
        return self._sup(batch).sum().float().view(1)

    def forward(self, batch: Any, norm: torch.Tensor) -> StepOutput:
        sup = self._sup(batch)  # [B, T]
        target = batch.input_ids.roll(-1, dims=1)[sup]  # [N]: input_ids[p + 1]
        logits = self.drafter.logits(batch.input_ids[sup])  # [N, V]: supervised columns only
        ce = F.cross_entropy(logits.float(), target, reduction="sum")
        hits = torch.zeros_like(sup)
        hits[sup] = logits.argmax(-1) == target
        return StepOutput(ce / norm[0], ce.detach().view(1), hits[None], sup[None])


def toy_objective(drafter: ToyDrafter, cfg: Any) -> ToyObjective:
    return ToyObjective(drafter)


# ------------------------------------------------------------ the kind's offline decoder (eval)
class ToyChainDrafter:
    """The eval loop's drafter: ``k`` greedy bigram drafts from the last committed token."""

    def __init__(self, model: ToyDrafter) -> None:
        self.model = model

    def observe(self, start: int, feats: torch.Tensor, tokens: torch.Tensor) -> None:
        pass

    @torch.no_grad()
    def propose(self, context: torch.Tensor, k: int, temperature: float, generator: Any
                ) -> tuple[torch.Tensor, None]:
        return chain(self.model, int(context[-1]), k), None


def chain(model: ToyDrafter, last: int, k: int) -> torch.Tensor:
    """[k] int64: the bigram's greedy chain after token ``last``."""
    out = []
    for _ in range(k):
        last = int(model.logits(torch.tensor(last)).argmax())
        out.append(last)
    return torch.tensor(out, dtype=torch.long)


def decode_toy(config: Any, verifier: Any, model: ToyDrafter, prompt_ids: list[list[int]],
               eos: list[int]) -> list[Any]:
    from specdraft.eval.specdec import VerifierSession, generate

    return [generate(VerifierSession(verifier, model.config.aux_layer_ids), ToyChainDrafter(model),
                     ids, k=config.k, max_new_tokens=config.max_new_tokens, eos_ids=eos)
            for ids in prompt_ids]


# ------------------------------------------------------------------------ the kind's home hooks
def config_from_dict(raw: dict[str, Any]) -> ToyConfig:
    return ToyConfig.from_dict(raw)


def check_keys(path: Path, raw: dict[str, Any]) -> None:
    pass  # from_dict names unknown keys


def model(config: ToyConfig) -> ToyDrafter:
    return ToyDrafter(config)


def build(options: Any, profile: Any, source: Any, head: dict[str, torch.Tensor],
          d2t: torch.Tensor, t2d: torch.Tensor, identity: dict[str, Any] | None) -> ToyDrafter:
    torch.manual_seed(options.seed)
    return ToyDrafter(ToyConfig(vocab_size=profile.vocab_size, rank=8,
                                hidden_size=source.hidden_size,
                                aux_layer_ids=tuple(source.aux_layer_ids)))


def read_export(path: Path, raw: dict[str, Any]) -> tuple[ToyConfig, dict[str, Any], str]:
    return ToyConfig.from_dict(raw), load_file(str(path / "model.safetensors")), FORMAT


def shared_tables() -> tuple[str, ...]:
    return ()


def export_candidate(request: ExportRequest, src: Any, facts: dict[str, Any]) -> Candidate:
    if request.format != FORMAT:
        raise ExportRefused([f"--format {request.format}: the toy kind is exported as {FORMAT}"])
    cfg = {"architectures": [ARCH], **src.config.to_dict()}
    del cfg["kind"]  # the format has no room for it: detect_kind reads the architecture
    tensors = {k: v.contiguous() for k, v in src.state.items()}
    return Candidate(cfg, tensors, facts, None, None, None, {})


def engine_format(config: ToyConfig) -> str:
    return FORMAT


def doctor(drafter: Any) -> str | None:
    return f"{drafter.path}: a toy drafter; no doctor checks"


def engine_hints() -> list[str]:
    return ["toy drafter: no engine serves it"]


def run_defaults(sections: dict[str, dict[str, Any]], path: Any) -> None:
    sections["export"].setdefault("format", FORMAT)


KIND = kinds.Kind(NAME, sys.modules[__name__], objective=toy_objective, decoder=decode_toy,
                  formats=(FORMAT,), architectures=frozenset({ARCH}))
