"""The `speculators` package (its own loader, in a separate venv because its pins clash with
ours: it pulls torchvision/torchaudio that break transformers' import here) loads our
speculators export with no missing or unexpected key. The venv: the ``speculators_python``
fixture of tests/conftest.py (speculators 0.9.0; a failure under CI when it cannot be built)."""

import json
import subprocess
from pathlib import Path

import pytest

from export_kit import make_drafter, make_run
from specdraft.export.config import ExportConfig
from specdraft.export.run import run


def _sh(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_speculators_loads_our_export(tmp_path, six_layer_verifier, six_layer_verifier_dir,
                                      speculators_python):
    drafter = make_drafter(six_layer_verifier)
    run_dir = make_run(tmp_path / "run", six_layer_verifier, drafter)
    run(ExportConfig(run_dir=run_dir, format="speculators",
                     verifier_name=str(six_layer_verifier_dir)))
    out = run_dir / "export" / "speculators"
    done = _sh(str(speculators_python), str(Path(__file__).parent / "speculators_check.py"),
               str(out), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["class"] == "Eagle3DraftModel"
    assert report["missing"] == [] and report["unexpected"] == [] and report["differ"] == []
    assert report["aux_ids"] == [2, 3, 4] and report["norm_before_residual"] is False
    assert report["fc_in"] == 3 * 64


@pytest.mark.slow
@pytest.mark.parametrize("fields", [{"norm_before_fc": True, "norm_output": True},
                                    {"fc_norm": True}, {"draft_layer": "qwen3"}],
                         ids=["norm_before_fc+norm_output", "fc_norm", "qwen3"])
def test_speculators_loads_our_drafter_variants(tmp_path, six_layer_verifier,
                                                six_layer_verifier_dir, speculators_python,
                                                fields):
    """EAGLE-3.1 norms and the Qwen3 layer (docs/drafters.md): speculators 0.9's own loader
    builds every tensor we wrote, by the same names, with equal values (it refuses
    norm_before_fc together with fc_norm, so they are checked apart)."""
    drafter = make_drafter(six_layer_verifier, **fields)
    run_dir = make_run(tmp_path / "run", six_layer_verifier, drafter)
    run(ExportConfig(run_dir=run_dir, format="speculators",
                     verifier_name=str(six_layer_verifier_dir)))
    done = _sh(str(speculators_python), str(Path(__file__).parent / "speculators_check.py"),
               str(run_dir / "export" / "speculators"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["missing"] == [] and report["unexpected"] == [] and report["differ"] == []
