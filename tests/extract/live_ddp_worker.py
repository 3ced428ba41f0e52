"""Worker of the ``train --online --endpoint`` DDP test: ``live_ddp_worker.py RUN GRAD_ACCUM
VERIFIER_DIR OUT_JSON`` (under torchrun or not). Every rank loads the tiny verifier, answers
through its own in-process fake server (:mod:`live_fakes`) and records the rows its live source
was told to prefetch and the dataset rows its fake captured."""

import json
import os
import sys
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).parent))

from live_fakes import FakeServer  # noqa: E402
import specdraft.extract.endpoint as ep  # noqa: E402
from specdraft.core.verifier import load_verifier  # noqa: E402
from specdraft.extract.live_source import LiveSource, open_live_source  # noqa: E402
from specdraft.train.config import TrainConfig  # noqa: E402
from specdraft.train.run import run  # noqa: E402

torch.set_num_threads(1)
run_dir, accum, verifier_dir, out = (Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]),
                                     Path(sys.argv[4]))
URL = "http://fake-a:8000"
fake = FakeServer(load_verifier(verifier_dir, dtype="float32", device="cpu"), [1, 2, 3, 4],
                  str(verifier_dir))
ep.make_client = lambda url, timeout_s: httpx.Client(
    base_url=url, timeout=timeout_s, transport=httpx.MockTransport(fake.handle))
orders: list[list[int]] = []
real_expect = LiveSource.expect


def expect(self, order):
    orders.append(list(order))
    return real_expect(self, order)


LiveSource.expect = expect
run(TrainConfig(run_dir=run_dir, epochs=3, max_steps=6, ttt_steps=2, lr=3e-3, warmup_steps=2,
                batch_tokens=60, grad_accum=accum, val_fraction=0.2, eval_every=3, save_every=3,
                log_every=1, seed=7, teacher_check=False, report_to="none", device="cpu",
                dtype="float32", verifier=str(verifier_dir), online=True, endpoint=[URL],
                aux_layers=(1, 2, 3), online_prefetch=3), source=open_live_source)
rank = int(os.environ.get("RANK", "0"))
with open(f"{out}.rank{rank}", "w") as f:
    json.dump({"orders": orders, "captured": fake.rows[1:]}, f)
