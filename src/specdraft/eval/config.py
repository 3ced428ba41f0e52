"""Settings of ``specdraft eval`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from specdraft.core.config import StageConfig, parse_json_object


class EvalConfig(StageConfig):
    """Settings of the eval stage: the prompts, draft length k, temperature and length limits
    of offline speculative decoding (or a live server to read metrics from).

    The drafter is ``drafter`` or, with only ``run_dir``, ``RUN/train/best``; results go to
    ``RUN/eval/`` or, without a run dir, ``out``. The benchmark prompts are MT-bench
    (``mt_bench/question.jsonl``) and GSM8K test. Prompts are rendered with the run's chat format
    (``RUN/verifier.json``'s), else the verifier's. With ``engine`` the same prompt ids
    are also decoded by a real engine and its figures written beside the offline ones; at
    temperature 0 a τ gap beyond ``engine_tolerance`` fails the eval (in float32 on CPU it is 0).
    """

    run_dir: Path | None = Field(None, description="Run directory; reads RUN/train/best, "
                                                   "writes RUN/eval/.")
    drafter: Path | None = Field(None, description="Drafter directory (specdraft's or an "
                                                   "export) instead of RUN/train/best.")
    verifier: str = Field("smollm2", description="HF model dir, .gguf file or smollm2.")
    prompts: Path = Field(description="Any prompt file generate reads (first user turn, with "
                                      "its system prompt), or builtin:NAME.")
    k: int = Field(4, ge=1, le=64, description="Draft tokens per verify step.")
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy; > 0 = speculative "
                                                        "sampling.")
    max_new_tokens: int = Field(128, ge=1, description="New tokens per prompt.")
    limit: int | None = Field(None, ge=1, description="Use the first N prompts only.")
    batch_size: int = Field(1, ge=1, description="Prompts decoded together offline (one "
                                                 "verifier forward per step for all); same "
                                                 "tokens and counts as 1.")
    seed: int = Field(0, description="Sampling seed.")
    device: str = Field("cpu", description="cpu, cuda or cuda:N.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="Dtype of both "
                                                                              "models.")
    server: str | None = Field(None, description="URL of a running vLLM/SGLang serving the "
                                                 "drafter: read its acceptance counters "
                                                 "instead (no local models).")
    chat_template: str | None = Field(None, description="Template file overriding the run's "
                                                        "chat format (or the tokenizer's).")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="JSON chat_template_kwargs overriding the run's, e.g. "
                          "'{\"enable_thinking\": false}'.")
    engine: Literal["none", "auto", "vllm", "sglang"] = Field(
        "none", description="Also measure in a real engine on the same prompt ids: vllm (a "
                            "subprocess), sglang (a launched server), auto (vllm when a python "
                            "with vLLM is found).")
    engine_python: str | None = Field(None, description="Python with vLLM (none: env "
                                                        "SPECDRAFT_VLLM_PYTHON, this python, "
                                                        "else REPO/.venv-vllm).")
    engine_drafter: Path | None = Field(None, description="Exported directory the engine loads "
                                                          "(none: the run's export, else one "
                                                          "exported into the eval directory).")
    engine_tolerance: float = Field(0.05, ge=0.0, description="Largest offline - engine tau gap "
                                                              "at temperature 0.")
    engine_timeout_s: int = Field(3600, ge=1, description="Seconds the engine may run.")
    engine_tensor_parallel_size: int = Field(
        1, ge=1, description="vLLM's tensor_parallel_size: the GPUs --engine vllm shards the "
                             "verifier over (CUDA only; recorded in the manifest).")
    allow_other_verifier: bool = Field(
        False, description="Evaluate even when --verifier is not the model the drafter was "
                           "trained on, or fails the hidden-state probe (recorded in "
                           "results.json).")
    out: Path | None = Field(None, description="Output directory when there is no --run-dir.")
    overwrite: bool = Field(False, description="Replace earlier results.")
    topk: int = Field(1, ge=1, description="SGLang --speculative-eagle-topk: > 1 evaluates "
                                           "SGLang's draft tree of --k steps (temperature 0).")
    num_draft_tokens: int | None = Field(None, ge=2, description="SGLang "
                                         "--speculative-num-draft-tokens, the root counted "
                                         "(none: k + 1).")
    sweep: str | None = Field(None, description="Serve plan: settings to evaluate on the same "
                                                "prompts, e.g. '2,3,5,5x4x8': K = a vLLM chain "
                                                "of K drafts, SxKxN = an SGLang tree.")
    cost_model: str | None = Field(None, description="Serve plan costs, "
                                                     "'draft=D,verify=A,per_token=B' in any one "
                                                     "unit (none: timed here).")
    draft_sample_method: Literal["greedy", "probabilistic"] = Field(
        "greedy", description="Acceptance rule at temperature > 0 (vLLM's names): greedy = "
                              "drafter argmax accepted with p(draft), the default of vLLM and "
                              "SGLang's only one; probabilistic = draft ~ q, min(1, p/q) "
                              "(vLLM opt-in).")

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def _parse_kwargs(cls, value: Any) -> Any:
        return parse_json_object(value)

    @model_validator(mode="after")
    def _where(self) -> "EvalConfig":
        if self.server is None and self.run_dir is None and self.drafter is None:
            raise ValueError("give --run-dir RUN, --drafter DIR or --server URL")
        if self.server is not None and self.engine != "none":
            raise ValueError("--server and --engine exclude each other (--engine starts one)")
        if self.run_dir is None and self.out is None:
            raise ValueError("--out DIR is required without --run-dir")
        from specdraft.eval.shapes import check_tree_options

        check_tree_options(self)
        if self.engine == "sglang" and self.draft_sample_method != "greedy":
            raise ValueError("--draft-sample-method probabilistic: SGLang verifies sampled "
                             "drafts target-only (eagle_info.py passes zero draft probabilities "
                             "to tree_speculative_sampling_target_only), so it cannot serve "
                             "that rule; use greedy or --engine vllm")
        return self

    @property
    def tree(self) -> bool:
        """An SGLang tree (or an explicit --num-draft-tokens) rather than a plain chain."""
        return self.topk > 1 or self.num_draft_tokens is not None


def drafter_dir(config: EvalConfig) -> Path:
    """The drafter eval measures: ``--drafter``, else the run's best checkpoint
    (``RUN/train/best``, :class:`specdraft.artifacts.layout.RunLayout`). Here, beside the
    settings, so the offline loop (:mod:`specdraft.eval.run`) and the engines
    (:mod:`specdraft.eval.engine`) read it without importing each other."""
    from specdraft.artifacts.layout import RunLayout

    return Path(config.drafter) if config.drafter is not None else RunLayout(config.run_dir).best
