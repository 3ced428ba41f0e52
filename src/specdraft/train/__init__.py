"""``specdraft train``: the EAGLE-3 training-time-test objective, acceptance-aware metrics,
checkpoints with exact resume, and torchrun DDP/FSDP2 (see :mod:`specdraft.train.run`)."""
