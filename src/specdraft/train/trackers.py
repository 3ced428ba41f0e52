"""Experiment trackers behind one option, ``--report-to`` (spelled as transformers' Trainer
spells its ``report_to``): ``tensorboard``, ``wandb``, ``trackio``, ``mlflow``, comma-separated.

Every tracker gets the same scalars the trainer logs to ``metrics.jsonl`` (loss, per-step
accuracy and conditional accuracy, validation ``τ̂``, tokens/s, learning rate; lists become one
scalar per TTT step, ``{split}/{name}/step{k}``) and the resolved train config as
hyper-parameters. Rank 0 only (the :class:`~specdraft.train.loop.Logger` opens them there).

None is a hard dependency: a tracker whose package is missing is refused when the stage starts,
naming the package (``pip install wandb``), before any step. Where each one writes, and its
offline/local mode (the tests run each for real in that mode):

- ``tensorboard``: ``RUN/train/tb`` (event files; ``purge_step`` drops a resumed run's
  stale tail), the config as a text summary;
- ``wandb``: ``RUN/train/wandb``; ``WANDB_MODE=offline`` keeps it on disk (``wandb sync`` later);
- ``trackio``: its local SQLite store (``TRACKIO_DIR``, default ``$HF_HOME/trackio``), project
  ``specdraft``, run named after the run directory;
- ``mlflow``: ``MLFLOW_TRACKING_URI`` when set, else the file store ``RUN/train/mlruns``
  (MLflow 3 keeps that store behind ``MLFLOW_ALLOW_FILE_STORE=true``, which is then set).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any, Protocol

from specdraft.core.errors import ConfigError

TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow")
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio",
             "mlflow": "mlflow"}
PROJECT = "specdraft"


class Tracker(Protocol):
    """One experiment tracker: scalars at an optimizer step, then close."""

    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def parse_report_to(value: str | None) -> tuple[str, ...]:
    """``"tensorboard,wandb"`` -> ``("tensorboard", "wandb")``; ``"none"`` or empty -> ``()``.
    Raises :class:`ConfigError` naming an unknown tracker and the known ones."""
    names = tuple(dict.fromkeys(n.strip() for n in (value or "").split(",") if n.strip()))
    if names in ((), ("none",)):
        return ()
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ConfigError(f"--report-to {value}: unknown tracker(s) {unknown}; choose from "
                          f"{', '.join(TRACKERS)} (comma-separated) or none")
    return names


def check_installed(names: tuple[str, ...]) -> None:
    """Refuse, before any step, a tracker whose package is not importable."""
    missing = [n for n in names if importlib.util.find_spec(_PACKAGES[n]) is None]
    if missing:
        pkgs = " ".join("mlflow-skinny" if n == "mlflow" else _PACKAGES[n] for n in missing)
        raise ConfigError(f"--report-to {','.join(names)}: {', '.join(missing)} not installed "
                          f"(pip install {pkgs})")


def scalars(split: str, values: dict[str, Any]) -> dict[str, float]:
    """One record's numbers as tracker scalars: ``{split}/{name}``, and a list (one value per
    TTT step) as ``{split}/{name}/step{k}``; non-numbers are left out."""
    out: dict[str, float] = {}
    for name, v in values.items():
        if isinstance(v, list):
            out.update({f"{split}/{name}/step{k}": float(x) for k, x in enumerate(v)
                        if isinstance(x, (int, float)) and not isinstance(x, bool)})
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{split}/{name}"] = float(v)
    return out


def hyperparameters(config: dict[str, Any]) -> dict[str, Any]:
    """The resolved config, flat and JSON-safe (paths and tuples as strings/lists)."""
    return json.loads(json.dumps(config, default=str))


def open_trackers(names: tuple[str, ...], out: Path, *, run_name: str,
                  config: dict[str, Any], start_step: int) -> list[Tracker]:
    """Open each named tracker (module doc) with the config as hyper-parameters."""
    check_installed(names)
    params = hyperparameters(config)
    return [_OPEN[n](out, run_name, params, start_step) for n in names]


class _TensorBoard:
    def __init__(self, out: Path, run_name: str, params: dict, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(str(out / "tb"), purge_step=start_step + 1)
        self.w.add_text("config", "```\n" + json.dumps(params, indent=2) + "\n```", start_step)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for k, v in scalars.items():
            self.w.add_scalar(k, v, step)

    def close(self) -> None:
        self.w.close()


class _Wandb:
    def __init__(self, out: Path, run_name: str, params: dict, start_step: int) -> None:
        import wandb

        (out / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=run_name,
                              dir=str(out), config=params, reinit="create_new")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class _Trackio:
    def __init__(self, out: Path, run_name: str, params: dict, start_step: int) -> None:
        import trackio

        self.t = trackio
        self.run = trackio.init(project=PROJECT, name=run_name, config=params,
                                resume="allow" if start_step else "never")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class _Mlflow:
    def __init__(self, out: Path, run_name: str, params: dict, start_step: int) -> None:
        import mlflow

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # the local file store, which MLflow 3 keeps behind an opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (out / "mlruns").resolve().as_uri()
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(PROJECT)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(PROJECT)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        flat = {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in
                params.items()}
        self.client.log_batch(self.run_id, params=[
            mlflow.entities.Param(k, str(v)[:6000]) for k, v in flat.items()])
        self.mlflow = mlflow

    def log(self, scalars: dict[str, float], step: int) -> None:
        ts = int(1000 * time.time())
        metrics = [self.mlflow.entities.Metric(k, v, ts, step) for k, v in scalars.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


_OPEN = {"tensorboard": _TensorBoard, "wandb": _Wandb, "trackio": _Trackio,
         "mlflow": _Mlflow}
