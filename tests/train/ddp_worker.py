"""Worker of the DDP equivalence test: ``ddp_worker.py RUN GRAD_ACCUM [ddp|fsdp]
[eagle3|eagle3-noise|dflash|dflash-recipe]``
(under
torchrun or not).
Every rank rebuilds the same tiny verifier, corpus and source (seeded)."""

import sys
from pathlib import Path

import torch

from memsource import VOCAB, tiny_llama
from memsource import MemorySource, greedy_corpus, write_vocab
from specdraft.train.config import TrainConfig
from specdraft.train.run import run

torch.set_num_threads(1)
run_dir, accum = Path(sys.argv[1]), int(sys.argv[2])
parallel = sys.argv[3] if len(sys.argv) > 3 else "ddp"
drafter = sys.argv[4] if len(sys.argv) > 4 else "eagle3"
kind = {"ttt_steps": 3} if drafter.startswith("eagle3") else {
    "drafter": "dflash", "dflash_block_size": 4, "dflash_anchors": 4}
if drafter == "eagle3-noise":  # the aux-state noise is drawn per row: the split must not matter
    kind["hidden_noise"] = 0.2
if drafter == "dflash-recipe":  # every new DFlash setting and both acceptance terms
    kind.update(dflash_anchor_draw="distinct", dflash_weights="dpace", dflash_labels="soft",
                dflash_init_std=0.02, loss_focal_weight=0.5, loss_expected_length_weight=0.5)
verifier = tiny_llama()
corpus = greedy_corpus(verifier, 16, gen_len=20, vocab_range=VOCAB)
if int(__import__("os").environ.get("RANK", "0")) == 0:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_vocab(run_dir, corpus, VOCAB)
else:
    import time
    while not (run_dir / "vocab" / "manifest.json").exists():
        time.sleep(0.1)
run(TrainConfig(run_dir=run_dir, max_steps=6, epochs=100, lr=3e-3, warmup_steps=2,
                batch_tokens=26 * 2, grad_accum=accum, val_fraction=0.2, eval_every=3,
                save_every=3, log_every=1, device="cpu", parallel=parallel, **kind),
    verifier=verifier, source=MemorySource(verifier, corpus))
