"""Runs in speculators' venv: read a converted offline-data directory with speculators' OWN
dataset class and batch shift, build its teacher as its Eagle3 model does (verifier norm with
the gain, then the draft-vocab head), and save what it sees.

    python peer_read.py DATA_DIR HEAD.safetensors OUT.safetensors
"""

import sys

import torch
from safetensors.torch import load_file, save_file
from speculators.models.eagle3.data import shift_batch
from speculators.train.data import ArrowDataset
from transformers.models.llama.modeling_llama import LlamaRMSNorm

data_dir, head_file, out = sys.argv[1:4]
head = load_file(head_file)  # lm_head_draft [K, H], gain [H], eps [1]
ds = ArrowDataset(max_len=64, datapath=data_dir, on_missing="raise", train_ratio=1.0,
                  hidden_states_dtype=torch.float32)
item = ds[0]
if not isinstance(item, dict):
    raise SystemExit(f"speculators dropped the row: {item}")
b = shift_batch(item)
norm = LlamaRMSNorm(head["gain"].numel(), eps=float(head["eps"]))
with torch.no_grad():
    norm.weight.copy_(head["gain"])
    logits = norm(b["verifier_last_hidden_states"].float()) @ head["lm_head_draft"].T
save_file({"hidden_states": b["hidden_states"].contiguous(), "input_ids": b["input_ids"],
           "loss_mask": b["loss_mask"].long(), "target_probs": torch.softmax(logits, -1)}, out)
