"""The rules a drafter is held to wherever it is read, one function each, called by eval (its
drafter load, :func:`specdraft.artifacts.drafter.build_model`, and its start), export
(:func:`specdraft.artifacts.validate.check_export`) and doctor
(:mod:`specdraft.artifacts.checks`), so that no stage lets through what another refuses
(``tests/artifacts/test_rules.py`` plants each mismatch once and sees all three refuse it):

- :func:`tensor_problems`: the tensors are exactly the ones the drafter's config describes,
  name and shape (e.g. EAGLE-3.1's ``norm_before_fc`` flag and ``input_norm.weight`` present
  together or absent together);
- :func:`aux_id_problems`: the aux ids are in ``[1, N-1]`` for the N-layer verifier
  (:func:`specdraft.core.conventions.check_aux_layer_ids`: id N, HF's final boundary, is the
  post-norm state in HF and not what the engines capture).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from specdraft import kinds
from specdraft.core.conventions import check_aux_layer_ids
from specdraft.core.errors import ConfigError


def _model_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of the drafter ``config`` describes (its kind's model,
    built on the meta device: nothing allocated), rotary tables left out (never stored)."""
    with torch.device("meta"):
        model = kinds.of(config).hooks().model(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()
            if not k.startswith("rotary.")}


def tensor_problems(config: Any, state: dict[str, torch.Tensor],
                    shared: Sequence[str] = ()) -> list[str]:
    """Every tensor of ``state`` (our checkpoint names) that the drafter ``config`` describes
    differently: ``missing tensor X``, ``unexpected tensor X (...)``, ``X: shape [..], expected
    [..]``; ``shared`` tables (the verifier's, which engines share) may be absent. A
    ``norm_before_fc`` flag that disagrees with ``input_norm.weight`` is named as such."""
    want = _model_shapes(config)
    problems = [f"missing tensor {n}" for n in want if n not in state and n not in shared]
    problems += [f"unexpected tensor {n} (the drafter's config does not describe it)"
                 for n in state if n not in want]
    problems += [f"{n}: shape {list(state[n].shape)}, expected {list(s)}" for n, s in
                 want.items() if n in state and tuple(state[n].shape) != s]
    flag = getattr(config, "norm_before_fc", None)
    if flag is not None and flag != ("input_norm.weight" in state):
        problems.insert(0, f"norm_before_fc is {str(flag).lower()} but input_norm.weight is "
                           f"{'absent' if flag else 'present'}: the config's flag and the "
                           f"weights disagree (EAGLE-3.1's norm over the aux concatenation); "
                           f"re-export from the trained drafter")
    return problems


def aux_id_problems(ids: Sequence[int], n_layers: int, *, source: str) -> list[str]:
    """The aux ids against the N-layer verifier (:func:`check_aux_layer_ids`: ``[1, N-1]``,
    increasing, no duplicate), as a list of problems (empty: valid)."""
    try:
        check_aux_layer_ids(list(ids), n_layers, source=source)
    except ConfigError as err:
        return [str(err)]
    return []
