"""--report-to: each tracker run for real in its offline/local mode and read back with the
tracker's own reader (TensorBoard's event reader, wandb's offline run files, trackio's SQLite
store, MLflow's client on a file store); the values equal what was logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdraft.core.errors import ConfigError
from specdraft.train.trackers import open_trackers, parse_report_to, scalars

RECORDS = [(10, "train", {"loss": 2.5, "acc": [0.5, 0.25], "lr": 1e-4}),
           (20, "train", {"loss": 2.0, "acc": [0.625, 0.375], "lr": 9e-5}),
           (20, "val", {"tau": 1.75, "loss": 2.1})]
CONFIG = {"lr": 1e-4, "ttt_steps": 2, "run_dir": Path("/runs/x"), "aux_layers": (2, 3)}


def _log_all(names, out: Path) -> None:
    trackers = open_trackers(names, out, run_name="tiny", config=CONFIG, start_step=0)
    for step, split, values in RECORDS:
        for t in trackers:
            t.log(scalars(split, values), step)
    for t in trackers:
        t.close()


def test_scalars_and_parsing():
    assert scalars("train", {"loss": 2.5, "acc": [0.5, 0.25], "note": "x", "ok": True}) == {
        "train/loss": 2.5, "train/acc/step0": 0.5, "train/acc/step1": 0.25}
    assert parse_report_to("tensorboard, mlflow,mlflow") == ("tensorboard", "mlflow")
    assert parse_report_to("none") == () and parse_report_to("") == ()
    with pytest.raises(ConfigError, match=r"unknown tracker\(s\) \['comet'\]"):
        parse_report_to("wandb,comet")


def test_tensorboard_events_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_all(("tensorboard",), tmp_path)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(10, 2.5), (20, 2.0)]
    assert [e.value for e in acc.Scalars("train/acc/step1")] == [0.25, 0.375]
    assert acc.Scalars("val/tau")[0].value == 1.75


def test_mlflow_file_store_read_back(tmp_path):
    import mlflow

    _log_all(("mlflow",), tmp_path)
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run = client.search_runs([client.get_experiment_by_name("specdraft").experiment_id])[0]
    assert run.data.params["lr"] == "0.0001" and run.data.params["aux_layers"] == "[2, 3]"
    hist = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in hist) == [(10, 2.5), (20, 2.0)]
    assert run.data.metrics["val/tau"] == 1.75


def _wandb_records(path: Path) -> list:
    """The protobuf records of a wandb offline run file (``run-*.wandb``): a 7-byte header
    (``:W&B``, magic, version), then LevelDB-log framing (32 KiB blocks; each chunk: crc32c [4],
    length [2], type [1]: 1 full, 2 first, 3 middle, 4 last). Parsed with wandb's own schema."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, out, parts = path.read_bytes(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(parts)
            out.append(rec)
            parts = b""
    return out


def test_wandb_offline_run_file(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _log_all(("wandb",), tmp_path)
    files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    deadline = time.monotonic() + 120  # wandb-core may still be writing the file: wait for
    while True:                        # its closing record (a bound for a hang, not a timing)
        records = _wandb_records(files[0])
        if any(r.WhichOneof("record_type") == "exit" for r in records) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.5)
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in r.history.item} for r in records
               if r.WhichOneof("record_type") == "history"]
    logged = {(h["_step"], k): v for h in history for k, v in h.items() if "/" in k}
    assert logged[(10, "train/loss")] == 2.5 and logged[(20, "train/loss")] == 2.0
    assert logged[(20, "val/tau")] == 1.75 and logged[(20, "train/acc/step0")] == 0.625
    config = {i.key: i.value_json for r in records if r.WhichOneof("record_type") == "run"
              for i in r.run.config.update}
    assert json.loads(config["ttt_steps"]) == 2 and json.loads(config["run_dir"]) == "/runs/x"


TRACKIO_SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_trackers import _log_all
_log_all(("trackio",), Path({out!r}))
from trackio.sqlite_storage import SQLiteStorage
logs = SQLiteStorage.get_logs("specdraft", "tiny")
print("RESULT", json.dumps({{"logs": logs, "config": SQLiteStorage.get_run_config("specdraft", "tiny")}},
                 default=str))
"""


def test_trackio_local_store(tmp_path):
    # trackio fixes its store directory at import (TRACKIO_DIR): a fresh interpreter
    script = TRACKIO_SCRIPT.format(tests=str(Path(__file__).parent), out=str(tmp_path))
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line.removeprefix("RESULT "))
    by_step = {(r["step"], k): v for r in got["logs"] for k, v in r.items()
               if k.startswith(("train/", "val/"))}
    assert by_step[(10, "train/loss")] == 2.5 and by_step[(20, "train/loss")] == 2.0
    assert by_step[(20, "val/tau")] == 1.75 and by_step[(10, "train/acc/step1")] == 0.25
    assert got["config"]["ttt_steps"] == 2


def test_a_training_run_reports_what_metrics_jsonl_holds(run_dir, verifier, source):
    """`train --report-to tensorboard,mlflow`: MLflow's record of the run equals
    metrics.jsonl (loss and per-step accuracy at each logged step, validation tau, the
    config as parameters); rank 0 only is the single-process case here."""
    import mlflow

    from specdraft.train.config import TrainConfig
    from specdraft.train.run import run

    cfg = TrainConfig(run_dir=run_dir, max_steps=20, ttt_steps=2,
                      batch_tokens=144, val_fraction=0.2, eval_every=10, save_every=10,
                      log_every=5, report_to="tensorboard,mlflow", teacher_check=False)
    run(cfg, verifier=verifier, source=source)
    out = cfg.run_dir / "train"
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    client = mlflow.MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    r = client.search_runs([client.get_experiment_by_name("specdraft").experiment_id])[0]
    loss = {m.step: m.value for m in client.get_metric_history(r.info.run_id, "train/loss")}
    assert loss == {x["step"]: pytest.approx(x["loss"]) for x in recs if x["split"] == "train"}
    tau = {m.step: m.value for m in client.get_metric_history(r.info.run_id, "val/tau")}
    assert tau == {x["step"]: pytest.approx(x["tau"]) for x in recs if x["split"] == "val"}
    assert r.data.params["ttt_steps"] == "2" and r.data.params["report_to"] == \
        "tensorboard,mlflow"
    assert any((out / "tb").iterdir())
