"""Settings of ``specdraft train``: one frozen config, field names = CLI flag names."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidatorFunctionWrapHandler, field_validator, model_validator

from specdraft import kinds
from specdraft.core.config import StageConfig


class TrainConfig(StageConfig):
    """Settings of the training stage (defaults follow the EAGLE-3 official recipe where one
    exists: AdamW β 0.9/0.95, grad clip 0.5, 7 TTT steps weighted ``0.8**k``; arXiv 2503.01840 and
    SafeAILab/EAGLE ``eagle/traineagle3/``).

    Batching: a micro-batch holds at most ``batch_tokens`` padded tokens (rows × longest row);
    one optimizer step consumes ``grad_accum`` micro-batches on each of the ``world_size`` ranks,
    so the global batch is ``world_size * grad_accum`` micro-batches (1 process with
    ``grad_accum=2`` and 2 processes with ``grad_accum=1`` see the same global batch).
    """

    run_dir: Path = Field(description="Run directory; reads RUN/extract/ (or RUN/prepare/ "
                                      "online) and RUN/vocab/, writes RUN/train/.")
    epochs: int = Field(1, ge=1, description="Passes over the training rows.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps.")
    ttt_steps: int = Field(7, ge=1, description="Training-time-test steps K per position.")
    step_weight: float = Field(0.8, gt=0, description="Loss weight of TTT step k is this ** k.")
    loss: Literal["soft", "hard"] = Field("soft", description="soft: cross-entropy to the "
                                                              "verifier's distribution; hard: "
                                                              "to its token.")
    align_topk: int = Field(0, ge=0, description="Step k's loss counts a column only while the "
                                                 "label of every earlier step was in that "
                                                 "step's top-N draft logits (1: the chain's "
                                                 "argmax; 0: every column). GRIFFIN, "
                                                 "arXiv 2502.11018; speculators masks at 1. "
                                                 "The steps out of the loss are not computed: "
                                                 "a cheaper step.")
    oov_policy: Literal["mask", "keep"] = Field(
        "mask", description="Labels outside the draft vocabulary: mask them out of the loss, "
                            "or keep them with the restricted target (needs --loss soft).")
    lm_head_init: Literal["verifier", "verifier-frozen", "random"] = Field(
        "verifier", description="Draft lm_head at step 0: verifier (the verifier's lm_head rows "
                                "of the draft vocabulary, then trained), verifier-frozen (the "
                                "same, never trained) or random.")
    lr: float = Field(1e-4, gt=0, description="Peak learning rate.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine decay ends at this "
                                                             "fraction of --lr.")
    warmup_steps: int = Field(100, ge=0, description="Linear warmup steps.")
    warmup_ratio: float | None = Field(None, ge=0, lt=1, description="Linear warmup as a "
                                       "fraction of the run's optimizer steps, rounded up "
                                       "(transformers' warmup_ratio; SpecForge's DFlash configs "
                                       "use 0.04); replaces --warmup-steps.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    hidden_noise: float = Field(0.0, ge=0, description="Training only: each aux hidden state x "
                                                       "gets x + this * rms(x) * N(0, I) "
                                                       "(specdraft.train.augment).")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(0.95, ge=0, lt=1, description="AdamW beta2.")
    grad_clip: float = Field(0.5, ge=0, description="Max gradient norm; 0 disables clipping.")
    batch_tokens: int = Field(8192, ge=2, description="Padded tokens per micro-batch (rows x "
                                                      "longest row).")
    grad_accum: int = Field(1, ge=1, description="Micro-batches per optimizer step per rank.")
    length_window: int = Field(64, ge=1, description="Rows are sorted by length within "
                                                     "shuffled windows of this many rows.")
    val_fraction: float = Field(0.05, ge=0, lt=1, description="Fraction of rows held out for "
                                                              "validation.")
    eval_every: int = Field(500, ge=1, description="Validate every N steps.")
    save_every: int = Field(500, ge=1, description="Checkpoint every N steps.")
    keep_checkpoints: int = Field(3, ge=1, description="Newest checkpoints kept in "
                                                       "RUN/train/checkpoints/.")
    log_every: int = Field(10, ge=1, description="Log training metrics every N steps.")
    seed: int = Field(0, description="Seed of the initialization, split and shuffling.")
    attn_impl: Literal["dense", "split", "fused"] = Field(
        "fused", description="TTT attention: fused (a fused causal kernel plus per-step "
                             "diagonal terms; CPU and CUDA, split elsewhere or where the CUDA "
                             "kernel fails its check), split (explicit scores) or dense (one "
                             "masked SDPA).")
    norm_before_residual: bool = Field(False, description="Take the residual after the hidden "
                                                          "norm (written to the exported "
                                                          "config).")
    norm_before_fc: bool = Field(False, description="EAGLE-3.1: one RMSNorm over the "
                                                    "concatenated aux features before fc.")
    fc_norm: bool = Field(False, description="EAGLE-3.1: one RMSNorm per aux feature before "
                                             "fc.")
    norm_output: bool = Field(False, description="EAGLE-3.1: feed the next draft step the "
                                                 "normed output instead of the prenorm one.")
    drafter_layer: Literal["llama", "qwen3", "mla", "auto"] = Field(
        "llama", description="Drafter decoder layer: llama (reference EAGLE-3; every format "
                             "serves it), qwen3 (q/k norms; vLLM only), mla (multi-head latent "
                             "attention for MLA verifiers: vLLM's Eagle3DeepseekV2ForCausalLM) "
                             "or auto (qwen3 for Qwen3 verifiers, llama otherwise; "
                             "docs/drafters.md).")
    drafter: Literal["eagle3", "dflash"] = Field(
        "eagle3", description="eagle3 (one draft layer unrolled over TTT steps; EAGLE-3.1 and "
                              "the Qwen3/MLA layers through the flags above) or dflash (block "
                              "drafting: Qwen3 layers draft a whole block in one forward, "
                              "reading the run's aux layers as target_layer_ids + 1; vLLM "
                              "only; docs/drafters.md).")
    dflash_block_size: int = Field(kinds.DFLASH_BLOCK_SIZE, ge=2,
                                   description="DFlash: block size, the anchor plus K mask "
                                               "slots (serve with num_speculative_tokens = K).")
    dflash_layers: int = Field(2, ge=1, description="DFlash: the drafter's decoder layers.")
    dflash_anchors: int = Field(512, ge=1, description="DFlash: anchors per row per step: at "
                                                       "most this many distinct ones (--dflash-"
                                                       "anchor-draw distinct), or exactly this "
                                                       "many drawn with replacement.")
    dflash_gamma: float | None = Field(None, gt=0, description="DFlash --dflash-weights exp: "
                                                               "slot j's loss weight is "
                                                               "exp(-(j-1)/gamma) (none: "
                                                               "block size / 2).")
    dflash_mask_token_id: int | None = Field(None, ge=0, description="DFlash: the mask slots' "
                                                                     "token id (none: the "
                                                                     "verifier's last "
                                                                     "vocabulary id).")
    dflash_anchor_draw: Literal["replacement", "distinct"] = Field(
        "distinct", description="DFlash: distinct (up to --dflash-anchors distinct anchors per "
                                "row, only where vLLM anchors: a generated token, loss_mask[a] "
                                "== 1, whose next token is supervised; with 512, every such "
                                "position of a row up to 512 of them: the default since "
                                "2026-12-06, docs/benchmarks.md 'Issue 37: every "
                                "anchorable position as DFlash's default') or replacement "
                                "(--dflash-anchors blocks per row drawn "
                                "with replacement among positions a with loss_mask[a+1] == 1, "
                                "the recipe before, 32 per row).")
    dflash_weights: Literal["exp", "dpace"] = Field(
        "dpace", description="DFlash slot weights: dpace (D-PACE, arXiv 2605.18810: each slot "
                             "weighted by the expected accepted length it can still add, from "
                             "the drafter's own detached probabilities; the default since "
                             "2026-12-05, docs/benchmarks.md 'DFlash ablation') or exp "
                             "(exp(-(j-1)/gamma), the recipe before).")
    dflash_dpace_alpha: float = Field(0.5, gt=0, le=1, description="DFlash --dflash-weights "
                                                                   "dpace: confidence smoothing "
                                                                   "(1 - alpha) p + alpha.")
    dflash_labels: Literal["row", "verifier", "soft"] = Field(
        "row", description="DFlash slot targets: row (the row's own tokens), verifier (the "
                           "verifier's argmax at the previous position) or soft (the "
                           "verifier's full-vocabulary distribution there: forward KL).")
    dflash_init_std: float | None = Field(None, gt=0, description="DFlash: draw every trained "
                                                                  "linear weight from N(0, "
                                                                  "std^2), as HF/z-lab's "
                                                                  "initializer_range 0.02 "
                                                                  "(none: torch's defaults).")
    dflash_target_layers: Literal["extract", "spread"] = Field(
        "extract", description="DFlash target layers: extract (the run's aux layers) or spread "
                               "(z-lab/SpecForge's rule: as many as draft layers, spread from "
                               "layer 1 to L-3; the run must have extracted them).")
    loss_focal_weight: float = Field(0.0, ge=0, description="Weight of the first-error focal "
                                                            "term: (1-p)^gamma * -log p at each "
                                                            "chain's or block's first wrong "
                                                            "step (0: off; docs/drafters.md).")
    loss_focal_gamma: float = Field(2.0, ge=0, description="Focusing exponent gamma of the "
                                                           "first-error focal term.")
    loss_expected_length_weight: float = Field(
        0.0, ge=0, description="Weight of the expected-accepted-length term: sum_k (1 - "
                               "prod_{j<=k} p_j) per chain or block, p_j the drafter's "
                               "probability of step j's target (0: off; docs/drafters.md).")
    parallel: Literal["ddp", "fsdp"] = Field("ddp", description="Data parallelism under "
                                                                "torchrun.")
    device: str | None = Field(None, description="cpu, cuda, cuda:1 (none: cuda:LOCAL_RANK when "
                                                 "CUDA is available, else cpu).")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Compute precision (master weights stay fp32). auto: bf16 autocast "
                        "on GPU, and on a CPU with avx512_bf16/amx_bf16 for a drafter at least "
                        "512 wide (measured faster, same tau); float32 otherwise.")
    online: bool = Field(False, description="Run the verifier inside the training step "
                                            "instead of reading RUN/extract.")
    verifier: str | None = Field(None, description="HF model dir, .gguf file or smollm2 "
                                                   "(needed with --online).")
    aux_layers: tuple[int, ...] | None = Field(
        None, description="--online: aux layer ids, comma-separated (none: 2,N//2,N-3); "
                          "offline, RUN/extract's ids are used.")
    endpoint: list[str] = Field(
        default_factory=list, description="--online: running `specdraft serve` URLs (repeat or "
                                          "comma-separate): rows' hidden states captured "
                                          "through them ahead of each step, nothing stored "
                                          "(no verifier in this process).")
    capture_dir: Path | None = Field(
        None, description="--endpoint: where the servers write each row's states, each file "
                          "deleted once read (storage both see; none: RUN/train/live).")
    endpoint_concurrency: int = Field(4, ge=1, description="--endpoint: requests in flight per "
                                                          "server.")
    endpoint_timeout_s: float = Field(
        600.0, gt=0, description="--endpoint: seconds one row may take on a server before its "
                                 "rows go to the others; with no server left, how long to "
                                 "wait for one.")
    online_prefetch: int = Field(
        64, ge=1, description="--endpoint: rows captured per prefetch chunk; at most 3 chunks "
                              "are held (one trained on, one ready, one in capture): about "
                              "3 x N x row tokens x (aux ids + 1) x hidden x storage bytes.")
    online_storage: Literal["fp32", "bf16", "fp8", "bf16-zstd", "fp8-zstd"] = Field(
        "bf16", description="--endpoint: the rounding of the captured states, that of an "
                            "extract stored in this format (the same values as training on "
                            "that extract).")
    teacher_check: bool = Field(True, description="Before training, compare the stored teacher "
                                                  "of a few rows with a fresh verifier forward "
                                                  "and refuse out-of-band hidden states.")
    teacher_check_rows: int = Field(4, ge=1, description="Rows the teacher check runs the "
                                                         "verifier on.")
    report_to: str = Field("tensorboard", description="Experiment trackers, comma-separated: "
                                                      "tensorboard, wandb, trackio, mlflow, or "
                                                      "none (rank 0; the resolved config as "
                                                      "hyper-parameters; docs/stages.md).")
    resume: bool = Field(False, description="Continue from the newest readable checkpoint.")
    overwrite: bool = Field(False, description="Delete RUN/train and start over.")

    @field_validator("drafter", mode="wrap")
    @classmethod
    def _registered_kind(cls, value: object, handler: ValidatorFunctionWrapHandler) -> str:
        """The built-in kinds are the flag's choices; a kind registered from outside
        (:func:`specdraft.kinds.register`) is accepted from a config as well."""
        if isinstance(value, str) and value in kinds.KINDS:
            return value
        return handler(value)

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.loss == "hard" and self.oov_policy == "keep":
            raise ValueError("--oov-policy keep needs --loss soft: a hard label outside the "
                             "draft vocabulary has no class to train")
        if self.online and not self.verifier:
            raise ValueError("--online needs --verifier (the model run inside the training step)")
        if self.endpoint and not self.online:
            raise ValueError("--endpoint trains from running servers: add --online")
        from specdraft.core.config import check_http_urls

        check_http_urls(self.endpoint)
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite exclude each other")
        from specdraft.core.errors import ConfigError
        from specdraft.train.trackers import parse_report_to

        try:
            parse_report_to(self.report_to)
        except ConfigError as err:  # said as a pydantic error on the flag
            raise ValueError(str(err)) from None
        given = {f for f in self.model_fields_set  # a default spelled out (a dumped config)
                 if getattr(self, f) != type(self).model_fields[f].default}
        # each kind's own options (its row of specdraft.kinds): another kind's, set, is refused
        # (a setting silently ignored would train something else than asked)
        # a knob of an unused setting: said, not ignored
        idle = {"dflash_dpace_alpha": (self.dflash_weights != "dpace", "--dflash-weights dpace"),
                "dflash_gamma": (self.dflash_weights != "exp", "--dflash-weights exp"),
                "loss_focal_gamma": (self.loss_focal_weight == 0, "--loss-focal-weight > 0")}
        if self.warmup_ratio is not None and "warmup_steps" in given:
            raise ValueError("--warmup-steps and --warmup-ratio both set the warmup; give one")
        for name in sorted(f for f in given if idle.get(f, (False,))[0]):
            needs = idle[name][1]
            raise ValueError(f"--{name.replace('_', '-')} is read only with {needs}")
        other = sorted(kinds.other_kinds_options(self.drafter) & given)
        if other:
            flags = ", ".join("--" + f.replace("_", "-") for f in other)
            raise ValueError(f"{flags}: not an option of the {self.drafter} drafter "
                             f"(--drafter {self.drafter}; docs/drafters.md)")
        return self

    def gamma(self) -> float:
        """DFlash's slot-weight decay: ``dflash_gamma``, else ``dflash_block_size / 2`` (the
        DFlash paper's 5 and 4 for blocks of 10 and 8; 7 for 16)."""
        return self.dflash_gamma or self.dflash_block_size / 2
