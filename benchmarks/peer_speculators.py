"""Run vllm-project/speculators 0.9.0's own trainer on a CPU-only machine (in ITS venv).

    .venv-speculators/bin/python benchmarks/peer_speculators.py [--time-steps N --result F] \
        -- --verifier-name-or-path V --data-path D --speculator-type eagle3 ...

Everything after ``--`` goes to speculators' own argument resolver
(``speculators.train.config.TrainConfig.resolve``) and its ``train.cli.main``: this file only
removes what fails on CPU, as listed in ``../shared/reference/peer-speculators-cpu.md``:

- its trainer uses ``get_local_rank()`` (an int, i.e. an accelerator index) as the device of
  the model and batches: the trainer's name is bound to ``"cpu"``;
- ``torch.accelerator.synchronize()`` in its step timer raises without an accelerator: a no-op;
- its checkpoint loader opens files on ``get_current_device()`` (``"cuda:0"`` without an
  accelerator): bound to ``"cpu"``.

The flags that avoid the other CPU failures (``--draft-attn-impl sdpa``,
``--loss-implementation eager``, ``--num-workers 0``, ``--hidden-states-dtype float32``,
``--mask-token-id``) are the caller's to pass.

``--time-steps N``: record the wall clock at the end of every optimizer step (after its
scheduler step, so a step's time includes fetching its batch from disk, forward, backward,
clipping and AdamW), and after ``N + 1`` steps (the first warms up) write ``{"step_s": [...]}``
to ``--result`` and exit at once (no validation, no checkpoint), so the parent's
``wait4`` max RSS is that of training alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def patch_for_cpu() -> None:
    """Bind the three accelerator-only names of speculators 0.9.0 to CPU (module docstring)."""
    import torch

    import speculators.train.checkpointer as checkpointer
    import speculators.train.trainer as trainer
    import speculators.utils.util as util

    if torch.accelerator.is_available():
        return
    trainer.get_local_rank = lambda: "cpu"
    util.get_current_device = lambda: "cpu"
    checkpointer.get_current_device = lambda: "cpu"
    torch.accelerator.synchronize = lambda *a, **k: None


def time_steps(n: int, result: str) -> None:
    """Stop after ``n + 1`` optimizer steps and write the per-step wall times to ``result``."""
    from speculators.train.trainer import Trainer

    marks = [time.perf_counter()]
    original = Trainer._schedulers_step

    def step_and_mark(self) -> None:
        original(self)
        marks.append(time.perf_counter())
        if len(marks) == n + 2:
            with open(result, "w", encoding="utf-8") as f:
                json.dump({"step_s": [b - a for a, b in zip(marks, marks[1:])]}, f)
            sys.stdout.flush()
            os._exit(0)

    Trainer._schedulers_step = step_and_mark


def main() -> None:
    argv = sys.argv[1:]
    ours, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else ([], argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-steps", type=int, default=0)
    ap.add_argument("--result", default="")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(ours)
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    patch_for_cpu()
    if a.time_steps:
        time_steps(a.time_steps, a.result)
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    train_main(TrainConfig.resolve(theirs))


if __name__ == "__main__":
    main()
