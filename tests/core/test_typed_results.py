"""Every stage's ``run()`` returns its typed manifest (``write_manifest`` returns what it wrote,
parsed by its stage's class), readable as attributes and, for callers written against the old
plain dict, through a read-only mapping view equal to ``manifest.json``."""

import json

import pytest

from specdraft.core.config import StageConfig
from specdraft.core.manifest import (ExtractManifest, GenerateManifest, Manifest, StageClock,
                                     build_manifest, parse_manifest, write_manifest)


class _Cfg(StageConfig):
    run_dir: str


def test_write_manifest_returns_the_typed_manifest_it_wrote(tmp_path):
    d = tmp_path / "extract"
    d.mkdir()
    m = write_manifest(d, stage="extract", config=_Cfg(run_dir=str(tmp_path)),
                       clock=StageClock(), counts={"rows_out": 2},
                       extra={"aux_layer_ids": [2, 3, 4], "n_layers": 6, "hidden_size": 64,
                              "vocab_size": 100, "storage": {"format": "bf16"},
                              "convention": "hf"})
    assert isinstance(m, ExtractManifest)
    assert (m.aux_layer_ids, m.n_layers, m.storage.format) == ([2, 3, 4], 6, "bf16")
    on_disk = json.loads((d / "manifest.json").read_text())
    assert m.to_dict() == on_disk  # no default of the class added
    assert (m.storage.bytes_total, m.profile) == (0, None)  # the defaults, as attributes
    assert (m["aux_layer_ids"], m["storage"], m["convention"]) == ([2, 3, 4],
                                                                    {"format": "bf16"}, "hf")
    assert m.get("missing", 7) == 7 and "convention" in m and "missing" not in m
    assert dict(m)["counts"] == {"rows_out": 2}
    with pytest.raises(KeyError):
        m["missing"]


def test_another_rank_s_manifest_is_the_one_rank_0_writes(tmp_path):
    """``build_manifest`` (what a rank other than 0 returns) parses to the same class and facts,
    and ``parse_manifest`` of a typed manifest is that manifest."""
    cfg = _Cfg(run_dir=str(tmp_path))
    built = build_manifest(stage="generate", config=cfg, clock=StageClock(),
                           extra={"summary": {"generated": 3}})
    typed = parse_manifest(built, tmp_path)
    assert isinstance(typed, GenerateManifest) and typed.summary == {"generated": 3}
    assert parse_manifest(typed, tmp_path) is typed
    fake = parse_manifest({**built, "stage": "fake"}, tmp_path)
    assert type(fake) is Manifest
