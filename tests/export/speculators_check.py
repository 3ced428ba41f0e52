"""Run inside the separate speculators venv: load an export with the speculators package's own
loader and print a JSON report (missing / unexpected keys, tensors that differ).

Usage: python speculators_check.py EXPORT_DIR
"""

import json
import sys

import torch
from safetensors.torch import load_file
from speculators import SpeculatorModel


def main(path: str) -> None:
    ours = load_file(f"{path}/model.safetensors")
    model = SpeculatorModel.from_pretrained(path)
    state = model.state_dict()
    ignore = set(getattr(model, "_keys_to_ignore_on_load_missing", None) or [])
    ignore |= set(getattr(model, "_keys_to_ignore_on_save", None) or [])
    missing = sorted(k for k in state if k not in ours and k not in ignore)
    unexpected = sorted(k for k in ours if k not in state)
    differ = sorted(k for k in ours if k in state and
                    not torch.equal(state[k].to(ours[k].dtype), ours[k]))
    print(json.dumps({"class": type(model).__name__, "missing": missing,
                      "unexpected": unexpected, "differ": differ,
                      "aux_ids": model.config.eagle_aux_hidden_state_layer_ids,
                      "norm_before_residual": model.config.norm_before_residual,
                      "fc_in": model.fc.weight.shape[1]}))


if __name__ == "__main__":
    main(sys.argv[1])
