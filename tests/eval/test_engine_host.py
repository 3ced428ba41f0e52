"""The host side of `eval --engine vllm` without vLLM: figures from counters, the offline/engine
agreement, the python lookup, the worker always stopped, the summary and plot lines."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

from specdraft.engines import python as verifier
from specdraft.core.errors import ConfigError
from specdraft.engines.python import vllm_python
from specdraft.eval import engine
from specdraft.eval.acceptance import AcceptanceStats
from specdraft.engines.process import EngineError
from specdraft.eval.engine import agreement, figures, run_worker


def test_figures_from_counters():
    f = figures({"drafts": 4, "draft_tokens": 12, "accepted": 6, "per_pos": [3, 2, 1]})
    assert f["tau"] == pytest.approx(1 + 6 / 4) and f["acceptance_rate"] == pytest.approx(0.5)
    assert f["per_position"] == pytest.approx([0.75, 0.5, 0.25])
    with pytest.raises(EngineError, match="did not move"):
        figures({"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []})


def test_offline_counts_match_engine_counter_definitions():
    s = AcceptanceStats()
    for acc in (3, 0, 1, 2):  # k = 3; committed = acc + 1
        s.add(3, acc, acc + 1)
    off = s.summary()
    assert off["per_position_accepted"] == [3, 2, 1] and off["accepted"] == 6
    eng = figures({"drafts": 4, "draft_tokens": 12, "accepted": 6, "per_pos": [3, 2, 1]})
    a = agreement(off, eng, [[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6, 7]], ["p0", "p1"])
    assert a["tau_offline_minus_engine"] == pytest.approx(0.0) and a["counts_identical"]
    assert a["prompts"] == [{"id": "p0", "identical": True, "first_difference": None},
                            {"id": "p1", "identical": False, "first_difference": 1}]
    eng2 = figures({"drafts": 4, "draft_tokens": 12, "accepted": 5, "per_pos": [3, 2, 0]})
    a2 = agreement(off, eng2, [[1]], [[1, 2]], ["p"])
    assert not a2["counts_identical"] and a2["tau_offline_minus_engine"] == pytest.approx(0.25)
    assert a2["prompts"][0]["first_difference"] == 1  # a prefix is not identical


def test_engine_python_lookup(tmp_path, monkeypatch):
    py = tmp_path / "python"
    py.write_text("")
    monkeypatch.setenv(verifier.VLLM_PYTHON_ENV, str(py))
    assert vllm_python() == str(py)
    assert vllm_python(str(py)) == str(py)
    with pytest.raises(ConfigError, match="no such file"):
        vllm_python(str(tmp_path / "nope"))
    monkeypatch.delenv(verifier.VLLM_PYTHON_ENV)
    monkeypatch.setattr(verifier.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(verifier, "REPO", tmp_path)
    with pytest.raises(ConfigError, match="make install-vllm"):
        vllm_python()


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie awaiting its reaper)."""
    status = Path(f"/proc/{pid}/status")
    try:
        return "\nState:\tZ" not in status.read_text()
    except FileNotFoundError:
        return False


def fake_python(path: Path, body: str) -> str:
    """An executable standing in for the engine's python: it is called as ``PY -m
    specdraft.eval.engine_worker JOB OUT`` and runs ``body`` (``sys.argv[-1]`` is OUT)."""
    path.write_text(f"#!{sys.executable}\nimport sys\nassert sys.argv[1:3] == "
                    f"['-m', 'specdraft.eval.engine_worker'], sys.argv\n{body}")
    path.chmod(0o755)
    return str(path)


def test_worker_stopped_on_timeout_and_failure_reported(tmp_path):
    """A worker that never finishes is killed (with the child it spawned); a failing one
    raises with its log tail."""
    hangs = fake_python(tmp_path / "hangs", (
        "import subprocess, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "open(sys.argv[-1] + '.pid', 'w').write(str(c.pid))\n"
        "time.sleep(60)\n"))
    with pytest.raises(EngineError, match="ran past 3 s"):
        run_worker(hangs, {"runs": []}, tmp_path / "w", timeout_s=3)
    child = int((tmp_path / "w" / "engine-out.json.pid").read_text())
    time.sleep(0.5)
    assert not _alive(child)
    fails = fake_python(tmp_path / "fails", "print('boom: bad drafter'); sys.exit(3)\n")
    with pytest.raises(EngineError, match="exited with status 3: boom: bad drafter") as err:
        run_worker(fails, {"runs": []}, tmp_path / "w2")
    assert str(tmp_path / "w2" / "engine.log") in str(err.value)
    works = fake_python(tmp_path / "works",
                        "import json; json.dump({'ok': 1}, open(sys.argv[-1], 'w'))\n")
    assert run_worker(works, {"runs": []}, tmp_path / "w3") == {"ok": 1}
    assert json.loads((tmp_path / "w3" / "engine-job.json").read_text()) == {"runs": []}


def test_summary_shows_both_figures():
    from specdraft.core.manifest import EvalManifest

    def _eval(facts):
        return EvalManifest(stage="eval", config={}, config_hash="x", started_at="t",
                            finished_at="t", elapsed_s=0.0, **facts).figures()

    m = {"tau": 1.6, "acceptance_rate": 0.2, "per_position": [0.4, 0.15, 0.05],
         "verify_steps": 10, "tokens_per_s": 3.0,
         "engine": {"version": "vllm 0.32.0 (torch 2.13.0+cpu, cpu)", "tau": 1.6,
                    "acceptance_rate": 0.2, "per_position": [0.4, 0.15, 0.05],
                    "tau_offline_minus_engine": 0.0, "identical_prompts": "4/4"}}
    text = _eval(m)
    assert "offline τ 1.600" in text and "engine vllm 0.32.0" in text
    assert "offline - engine +0.000, identical prompts 4/4" in text
    assert "engine" not in _eval({k: v for k, v in m.items() if k != "engine"})


def test_plot_two_series(tmp_path):
    from PIL import Image

    from specdraft.eval.plot import plot_acceptance

    one = plot_acceptance([0.5, 0.2], tmp_path / "a.png", title="t")
    two = plot_acceptance([0.5, 0.2], tmp_path / "b.png", title="t", engine=[0.5, 0.2],
                          engine_label="vllm")
    orange = (0xe0, 0x7b, 0x39)

    def has_orange(p: Path) -> bool:
        return any(px[:3] == orange for px in Image.open(p).convert("RGB").getdata())
    assert not has_orange(one) and has_orange(two)


def test_gap_beyond_tolerance_fails_with_the_doctors_hints(tmp_path, six_layer_verifier,
                                                          six_layer_verifier_dir):
    """A planted τ gap with a shuffled-d2t export: the error names the gap and the doctor's
    failing check; within the tolerance, or above temperature 0, nothing is raised."""
    import torch
    from safetensors.torch import load_file, save_file

    from export_kit import make_drafter, make_run
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.engine import EngineDisagreement, check_agreement
    from specdraft.export.config import ExportConfig
    from specdraft.export.run import run as export

    run_dir = make_run(tmp_path / "run", six_layer_verifier, make_drafter(six_layer_verifier))
    export(ExportConfig(run_dir=run_dir, format="sglang"))
    good = run_dir / "export" / "sglang"
    t = load_file(str(good / "model.safetensors"))
    idx = torch.arange(len(t["d2t"]))
    target = (idx + t["d2t"])[torch.randperm(len(idx), generator=torch.Generator().manual_seed(0))]
    t["d2t"] = (target - idx).contiguous()  # the same target ids, shuffled
    save_file(t, str(good / "model.safetensors"), metadata={"format": "pt"})
    config = EvalConfig(drafter=good, verifier=str(six_layer_verifier_dir), prompts=tmp_path,
                        out=tmp_path / "out", engine="vllm", engine_tolerance=0.05)
    engine_result = {"name": "vllm", "drafter_dir": str(good), "agreement": {
        "tau_offline_minus_engine": 0.3, "identical_prompts": 1, "prompts": [{}, {}]}}
    with pytest.raises(EngineDisagreement) as err:
        check_agreement(config, engine_result, six_layer_verifier)
    msg = str(err.value)
    assert "tau offline - engine = +0.300 (tolerance 0.05), 1/2 prompts identical" in msg
    assert "doctor d2t/t2d" in msg and "re-run `specdraft vocab`" in msg
    engine_result["agreement"]["tau_offline_minus_engine"] = -0.05
    check_agreement(config, engine_result, six_layer_verifier)  # within tolerance
    del engine_result["agreement"]  # temperature > 0: no agreement to check
    check_agreement(config, engine_result, six_layer_verifier)


def test_engine_auto_is_vllm_only_when_found(tmp_path, monkeypatch):
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import resolve_engine

    cfg = EvalConfig(drafter=tmp_path, prompts=tmp_path, out=tmp_path, engine="auto")
    monkeypatch.delenv(verifier.VLLM_PYTHON_ENV, raising=False)
    monkeypatch.setattr(verifier.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(verifier, "REPO", tmp_path)
    assert resolve_engine(cfg) == "none"
    (tmp_path / ".venv-vllm" / "bin").mkdir(parents=True)
    (tmp_path / ".venv-vllm" / "bin" / "python").write_text("")
    assert resolve_engine(cfg) == "vllm"
    assert resolve_engine(cfg.model_copy(update={"engine": "none"})) == "none"
    with pytest.raises(ValueError, match="exclude each other"):
        EvalConfig(server="http://x", prompts=tmp_path, out=tmp_path, engine="vllm")
