"""Foundation: atomic writes, torn-tail repair, run-directory rules, config errors, manifests."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from specdraft.core.atomic import (atomic_open, atomic_save_safetensors, atomic_write_json,
                                   remove_stale_tmp)
from specdraft.core.config import StageConfig
from specdraft.core.errors import ConfigError, InputError, StageDirError
from specdraft.core.jsonl import JsonlWriter, iter_jsonl, repair_torn_tail
from specdraft.core.manifest import StageClock, read_manifest, write_manifest
from specdraft.core.rundir import open_stage_dir, require_stage


class _Cfg(StageConfig):
    run_dir: str
    max_tokens: int = 16


def test_atomic_open_leaves_old_file_on_error(tmp_path):
    path = tmp_path / "a.json"
    atomic_write_json(path, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_open(path) as f:
            f.write("half")
            raise RuntimeError("boom")
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_safetensors_killed_mid_write_leaves_only_a_removable_staging_dir(tmp_path):
    """safetensors >= 0.7 writes through its own ``.tmpXXXXXX`` next to the target (seen in CI
    after a kill -9); here that file is made and the writer dies, as ``kill -9`` would."""
    script = f"""
import os, pathlib, safetensors.torch, torch
from specdraft.core.atomic import atomic_save_safetensors
def dying_save(tensors, filename, metadata=None):
    pathlib.Path(filename).parent.joinpath(".tmpAb12Cd").write_bytes(b"half")
    os._exit(9)
safetensors.torch.save_file = dying_save
atomic_save_safetensors({{"x": torch.zeros(4)}}, pathlib.Path({str(tmp_path)!r}) / "s.safetensors")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 1 and left[0].startswith("s.safetensors.tmp-"), left
    assert [p.name for p in remove_stale_tmp(tmp_path)] == left
    assert list(tmp_path.iterdir()) == []
    atomic_save_safetensors({"x": torch.arange(3)}, tmp_path / "s.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["s.safetensors"]
    assert torch.equal(load_file(tmp_path / "s.safetensors")["x"], torch.arange(3))


def test_torn_tail_is_cut(tmp_path):
    path = tmp_path / "s.jsonl"
    with JsonlWriter(path) as w:
        w.write_batch([{"id": "a"}, {"id": "b"}])
    with open(path, "a") as f:
        f.write('{"id": "c", "mess')
    assert repair_torn_tail(path) == len('{"id": "c", "mess')
    assert [r["id"] for _, r in iter_jsonl(path)] == ["a", "b"]
    assert repair_torn_tail(path) == 0


def test_iter_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"a": 1}\n\n[1]\n')
    with pytest.raises(InputError, match=r"p.jsonl:3: expected a JSON object"):
        list(iter_jsonl(path))


def test_stage_dir_refuses_to_clobber(tmp_path):
    d = open_stage_dir(tmp_path, "generate")
    (d / "samples.jsonl").write_text("x\n")
    with pytest.raises(StageDirError, match="--resume .* --overwrite"):
        open_stage_dir(tmp_path, "generate")
    assert open_stage_dir(tmp_path, "generate", resume=True) == d
    assert (d / "samples.jsonl").exists()
    open_stage_dir(tmp_path, "generate", overwrite=True)
    assert not (d / "samples.jsonl").exists()


def test_manifest_roundtrip_and_require(tmp_path):
    cfg = _Cfg(run_dir=str(tmp_path))
    with pytest.raises(StageDirError, match="specdraft generate --run-dir"):
        require_stage(tmp_path, "generate")
    d = open_stage_dir(tmp_path, "generate")
    write_manifest(d, stage="generate", config=cfg, clock=StageClock(), counts={"out": 3})
    m = read_manifest(d)
    assert m["counts"] == {"out": 3} and m["config"] == {"run_dir": str(tmp_path), "max_tokens": 16}
    assert m["config_hash"] == cfg.config_hash() == _Cfg(**m["config"]).config_hash()
    typed = require_stage(tmp_path, "generate")
    assert type(typed).__name__ == "GenerateManifest" and typed.counts == {"out": 3}


def test_typed_manifest_names_the_missing_key(tmp_path):
    import json

    from specdraft.core.errors import InputError

    d = tmp_path / "extract"
    d.mkdir()
    base = {"stage": "extract", "config": {}, "config_hash": "x", "started_at": "t",
            "finished_at": "t", "elapsed_s": 1.0, "n_layers": 4, "aux_layer_ids": [1, 2, 3],
            "vocab_size": 10, "storage": {"format": "bf16"}}
    (d / "manifest.json").write_text(json.dumps(base))      # hidden_size missing
    with pytest.raises(InputError, match=r"extract/manifest.json: key `hidden_size`: "
                                         r"Field required"):
        require_stage(tmp_path, "extract")
    (d / "manifest.json").write_text(json.dumps({**base, "hidden_size": 8}))
    assert require_stage(tmp_path, "extract").aux_layer_ids == [1, 2, 3]
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        require_stage(tmp_path, "extract")


def test_config_error_names_flag():
    with pytest.raises(ConfigError, match=r"--max-tokens \(max_tokens\)"):
        _Cfg.build({"run_dir": "r", "max_tokens": "many"})
    with pytest.raises(ConfigError, match=r"--bogus"):
        _Cfg.build({"run_dir": "r", "bogus": 1})


def test_generate_figures_count_every_sample_after_a_resume():
    """A resumed generate reports all samples on disk and, apart, those made by this run."""
    from specdraft.core.manifest import parse_manifest

    base = {"stage": "generate", "config": {}, "config_hash": "h", "started_at": "t0",
            "finished_at": "t1", "elapsed_s": 1.0}
    resumed = parse_manifest({**base, "counts": {"samples": 240, "already_done": 1},
                              "summary": {"generated": 239, "rejected": {}}}, "m.json")
    assert resumed.figures().startswith("240 samples (239 this run), rejected: none")
    fresh = parse_manifest({**base, "counts": {"samples": 240},
                            "summary": {"generated": 240, "rejected": {"empty": 2}}}, "m.json")
    assert fresh.figures().startswith("240 samples, rejected: empty 2")
