"""`specdraft run`'s own rules, with every stage replaced by a recorder (fast, no models): each
stage gets the verifier loaded the way ITS section says (shared only between equal settings),
and an input file edited in place reruns its stage and everything after it."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from specdraft.core.manifest import StageClock, input_hash, path_sha256, write_manifest
from specdraft.core.verifier import VerifierSpec
from specdraft.pipeline import stages
from specdraft.pipeline.config import PipelineConfig
from specdraft.pipeline.run import run

SKIPPED = "skipped (complete)"


class Calls(list):
    """``(stage, verifier=)`` of each stage entry called; ``sources``: ``(stage, source=)``."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[tuple[str, object]] = []


@pytest.fixture
def recorder(monkeypatch):
    """Replace stage entries and the verifier loader; return the calls made."""
    calls = Calls()

    def fake_load(self):
        return SimpleNamespace(spec=self), f"tokenizer of {self.path}"

    def load_entry(spec):
        def entry(cfg, ctx=None, *, verifier=None, **kw):  # the entry contract: run(config, ctx)
            calls.append((spec.name, verifier))
            if "source" in kw:
                calls.sources.append((spec.name, kw["source"]))
            out = Path(cfg.run_dir) / spec.name
            out.mkdir(parents=True, exist_ok=True)
            inputs = {up: input_hash(Path(cfg.run_dir) / up) for up in spec.upstream
                      if (Path(cfg.run_dir) / up / "manifest.json").exists()}
            inputs |= {name: path_sha256(p) for name, p in spec.input_files(cfg).items()}
            # a "fake-" stage name: the manifest is typed as plain provenance
            return write_manifest(out, stage=f"fake-{spec.name}", config=cfg,
                                  clock=StageClock(), inputs=inputs)
        return entry

    monkeypatch.setattr(VerifierSpec, "load", fake_load)
    monkeypatch.setattr(stages.StageSpec, "load_entry", load_entry)
    return calls


def config(tmp_path: Path, **sections) -> PipelineConfig:
    prompts = tmp_path / "prompts.jsonl"
    if not prompts.exists():
        prompts.write_text('{"question": "What is 2 + 2?"}\n')
    cfg = {"run_dir": str(tmp_path / "run"), "verifier": "/models/v",
           "generate": {"prompts": str(prompts)}, "train": {"max_steps": 1},
           "eval": {"prompts": str(prompts)}}
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return PipelineConfig.from_yaml(path)


def test_each_stage_gets_the_verifier_its_section_asks_for(tmp_path, recorder):
    stream = io.StringIO()
    run(config(tmp_path, eval={"dtype": "bfloat16"}), stream=stream)
    got = {name: v for name, v in recorder if v is not None}
    assert sorted(got) == ["eval", "extract", "generate", "train"]  # train: its teacher check
    gen_model, _ = got["generate"]
    assert got["extract"] is gen_model and got["train"] is gen_model  # equal settings: one model
    assert gen_model.spec == VerifierSpec(path="/models/v", dtype="float32", device="cpu")
    assert got["eval"].spec.dtype == "bfloat16"               # eval's own setting is honoured
    assert "eval: loading the verifier its own way (dtype float32 -> bfloat16)" in \
        stream.getvalue()


def test_an_engine_backed_stage_gets_no_in_process_verifier(tmp_path, recorder):
    """``extract.backend: vllm`` runs the verifier in the engine: the pipeline hands extract
    nothing, and with train's teacher check off no stage loads the verifier in transformers."""
    run(config(tmp_path, generate={"backend": "openai", "endpoint": ["http://127.0.0.1:9/v1"]},
               extract={"backend": "vllm"}, train={"teacher_check": False},
               eval={"server": "http://127.0.0.1:9/v1"}), stream=io.StringIO())
    assert [name for name, v in recorder if v is not None] == []
    assert [name for name, _ in recorder] == list(stages.STAGE_NAMES)


def test_a_stage_with_its_own_verifier_path(tmp_path, recorder):
    run(config(tmp_path, extract={"verifier": "/models/other", "trust_remote_code": True}),
        stream=io.StringIO())
    got = {name: v for name, v in recorder if v is not None}
    assert got["generate"][0].spec.path == "/models/v"
    assert got["extract"].spec == VerifierSpec(path="/models/other", trust_remote_code=True)
    assert got["eval"].spec.path == "/models/v"


def test_an_edited_input_file_reruns_its_stage(tmp_path, recorder):
    cfg = config(tmp_path)
    first = run(cfg, stream=io.StringIO())
    assert set(first["actions"].values()) == {"ran"}
    assert set(run(cfg, stream=io.StringIO())["actions"].values()) == {SKIPPED}
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question": "What is 3 + 3?"}\n')       # same path, new content
    third = run(cfg, stream=io.StringIO())
    assert set(third["actions"].values()) == {"ran"}            # generate reruns, and all after

    eval_prompts = tmp_path / "eval.jsonl"
    eval_prompts.write_text('{"question": "Name a prime."}\n')
    cfg = config(tmp_path, eval={"prompts": str(eval_prompts)})
    assert run(cfg, stream=io.StringIO())["actions"]["eval"] == "ran"
    eval_prompts.write_text('{"question": "Name an even prime."}\n')
    fourth = run(cfg, stream=io.StringIO())["actions"]
    assert fourth["eval"] == "ran"
    assert {v for k, v in fourth.items() if k != "eval"} == {SKIPPED}


def test_an_offline_only_eval_reruns_once_vllm_is_installed(tmp_path, recorder, monkeypatch):
    """`engine: auto` ran offline because no vLLM was found (the fake manifest has no `engine`);
    with a python that has vLLM now (SPECDRAFT_VLLM_PYTHON), only eval reruns. An explicit
    `engine: none` never does."""
    import specdraft.engines.python as verifier

    monkeypatch.delenv(verifier.VLLM_PYTHON_ENV, raising=False)
    monkeypatch.setattr(verifier, "REPO", tmp_path / "no-checkout")   # no .venv-vllm there
    monkeypatch.setattr(verifier.importlib.util, "find_spec", lambda name: None)
    cfg = config(tmp_path, eval={"engine": "auto"})
    assert set(run(cfg, stream=io.StringIO())["actions"].values()) == {"ran"}
    assert set(run(cfg, stream=io.StringIO())["actions"].values()) == {SKIPPED}
    fake_python = tmp_path / "python"
    fake_python.write_text("")
    monkeypatch.setenv(verifier.VLLM_PYTHON_ENV, str(fake_python))
    actions = run(cfg, stream=io.StringIO())["actions"]
    assert actions["eval"] == "ran"
    assert {v for k, v in actions.items() if k != "eval"} == {SKIPPED}
    offline = config(tmp_path, eval={"engine": "none"})
    assert run(offline, stream=io.StringIO())["actions"]["eval"] == "ran"   # config changed
    assert run(offline, stream=io.StringIO())["actions"]["eval"] == SKIPPED


def test_a_moved_run_directory_skips_its_complete_stages(tmp_path, recorder):
    # Where a run lies is not what it produced: `run_dir` is left out of the config hash, so a
    # run moved (or copied, stage by stage) to another directory keeps its complete stages.
    # (Planted fault: with `run_dir` back in the hash, every stage reruns.)
    cfg = config(tmp_path)
    run(cfg, stream=io.StringIO())
    (tmp_path / "run").rename(tmp_path / "moved")
    moved = PipelineConfig.from_yaml(_with_run_dir(tmp_path, tmp_path / "moved"))
    actions = run(moved, stream=io.StringIO())["actions"]
    # eval alone reruns: the pipeline hands it the drafter by path (RUN/export/sglang)
    assert actions == {**{name: SKIPPED for name in stages.STAGE_NAMES}, "eval": "ran"}


def _with_run_dir(tmp_path: Path, run_dir: Path) -> Path:
    path = tmp_path / "run.yaml"
    cfg = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**cfg, "run_dir": str(run_dir)}))
    return path


def test_online_training_needs_no_extract_stage(tmp_path, recorder):
    """``train.online``: extract is not run (nothing on disk) and the trainer gets the verifier;
    an extract directory an earlier, offline run left does not make train stale."""
    offline = run(config(tmp_path, train={"teacher_check": False}), stream=io.StringIO())
    assert offline["actions"]["extract"] == "ran"
    recorder.clear()
    cfg = config(tmp_path, train={"teacher_check": False, "online": True})
    stream = io.StringIO()
    first = run(cfg, stream=stream)
    assert first["actions"]["extract"].startswith("not needed (train is online")
    assert [name for name, _ in recorder] == ["train", "export", "eval"]
    assert dict(recorder)["train"] is not None  # online without servers: in this process
    assert "[run] extract: not needed" in stream.getvalue()
    again = run(cfg, stream=io.StringIO())["actions"]
    assert again["train"] == SKIPPED and again["eval"] == SKIPPED


def test_running_servers_hold_the_verifier(tmp_path, recorder):
    """``extract.endpoint`` / ``train.endpoint``: the servers run the verifier, so neither
    stage loads it here (a 1T-parameter verifier would not fit the client)."""
    url = ["http://127.0.0.1:9"]
    run(config(tmp_path, extract={"endpoint": url}, train={"teacher_check": False}),
        stream=io.StringIO())
    got = dict(recorder)
    assert got["extract"] is None and got["train"] is None and got["generate"] is not None
    recorder.clear()
    run(config(tmp_path, train={"teacher_check": False, "online": True, "endpoint": url}),
        stream=io.StringIO())
    assert dict(recorder)["train"] is None and "extract" not in dict(recorder)
    from specdraft.extract.live_source import open_live_source

    assert recorder.sources == [("train", open_live_source)]  # as the CLI passes it
