"""Each flag reaches its config field through the real ``specdraft`` app, and flags merge with
``--config FILE`` (given flags win, absent ones keep the file's values).

The stage's entry module is replaced in ``sys.modules`` by one whose ``run`` raises the config it
was handed, so nothing runs and no torch is imported.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any, Literal

import pytest
from typer.testing import CliRunner

from specdraft.cli import app
from specdraft.cli.options import PIPELINE_INTERNAL, field_default

#: Arguments every invocation of a verb needs (required fields and its validators).
BASE = {"generate": ["--prompts", "p.jsonl", "--run-dir", "r"], "prepare": ["--run-dir", "r"],
        "vocab": ["--run-dir", "r"], "extract": ["--run-dir", "r"], "train": ["--run-dir", "r"],
        "export": ["--run-dir", "r"], "eval": ["--prompts", "q.jsonl", "--run-dir", "r"],
        "doctor": ["t"], "serve": ["--run-dir", "r"]}

#: ``(verb, field) -> (argv, expected value)`` where a generic sample would be invalid.
SAMPLES: dict[tuple[str, str], tuple[list[str], Any]] = {
    ("generate", "endpoint"): (["--endpoint", "http://a:1/v1,http://b:2/v1", "--endpoint",
                                "http://c:3/v1"], ["http://a:1/v1", "http://b:2/v1",
                                                   "http://c:3/v1"]),
    ("generate", "backend"): (["--backend", "openai", "--endpoint", "http://a:1/v1"], "openai"),
    ("generate", "fields"): (["--field", "question=problem", "--fields", "id=uid"],
                             {"question": "problem", "id": "uid"}),
    ("prepare", "fields"): (["--field", "instruction=task", "--fields", "output=answer"],
                            {"instruction": "task", "output": "answer"}),
    ("generate", "extra_body"): (["--extra-body", '{"top_k": 20}'], {"top_k": 20}),
    ("generate", "chat_template_kwargs"): (["--chat-template-kwargs",
                                            '{"enable_thinking": false}'],
                                           {"enable_thinking": False}),
    ("prepare", "chat_template_kwargs"): (["--chat-template-kwargs", '{"a": [1]}'], {"a": [1]}),
    ("prepare", "think_tokens"): (["--think-tokens", "<t>,</t>"], ("<t>", "</t>")),
    ("generate", "think_tokens"): (["--think-tokens", "<t>,</t>"], ("<t>", "</t>")),
    ("prepare", "stop_tokens"): (["--stop-tokens", "<|im_end|>", "--stop-tokens", "<eos>"],
                                 ("<|im_end|>", "<eos>")),
    ("generate", "stop_tokens"): (["--stop-tokens", "<|im_end|>", "--stop-tokens", "<eos>"],
                                 ("<|im_end|>", "<eos>")),
    ("prepare", "reasoning_format"): (["--reasoning-format", "{reasoning}|{close}"],
                                      "{reasoning}|{close}"),
    ("extract", "aux_layers"): (["--aux-layers", "1, 5,9"], (1, 5, 9)),
    ("extract", "device"): (["--device", "cuda:1"], "cuda:1"),
    ("extract", "endpoint"): (["--endpoint", "http://a:1,http://b:2"], ["http://a:1",
                                                                        "http://b:2"]),
    ("serve", "aux_layers"): (["--aux-layers", "1,2"], (1, 2)),
    ("train", "aux_layers"): (["--aux-layers", "2,3", "--aux-layers", "4"], (2, 3, 4)),
    ("train", "online"): (["--online", "--verifier", "smollm2"], True),
    ("train", "endpoint"): (["--online", "--verifier", "smollm2", "--endpoint",
                             "http://a:1,http://b:2"], ["http://a:1", "http://b:2"]),
    ("export", "aux_layers"): (["--aux-layers", "1,2,3"], (1, 2, 3)),
    # DFlash's settings are refused for the EAGLE-3 drafter (its row: kinds.DFLASH_OPTIONS)
    ("train", "dflash_block_size"): (["--drafter", "dflash", "--dflash-block-size", "9"], 9),
    ("train", "dflash_layers"): (["--drafter", "dflash", "--dflash-layers", "3"], 3),
    ("train", "dflash_anchors"): (["--drafter", "dflash", "--dflash-anchors", "5"], 5),
    ("train", "dflash_gamma"): (["--drafter", "dflash", "--dflash-weights", "exp",
                                 "--dflash-gamma", "3.5"], 3.5),
    ("train", "dflash_mask_token_id"): (["--drafter", "dflash", "--dflash-mask-token-id", "7"],
                                        7),
    ("train", "dflash_anchor_draw"): (["--drafter", "dflash", "--dflash-anchor-draw",
                                       "replacement"], "replacement"),
    ("train", "dflash_weights"): (["--drafter", "dflash", "--dflash-weights", "exp"], "exp"),
    ("train", "dflash_dpace_alpha"): (["--drafter", "dflash", "--dflash-dpace-alpha", "0.3"],
                                      0.3),
    ("train", "loss_focal_gamma"): (["--loss-focal-weight", "1", "--loss-focal-gamma", "1.5"],
                                    1.5),
    ("train", "dflash_labels"): (["--drafter", "dflash", "--dflash-labels", "soft"], "soft"),
    ("train", "dflash_init_std"): (["--drafter", "dflash", "--dflash-init-std", "0.02"], 0.02),
    ("train", "dflash_target_layers"): (["--drafter", "dflash", "--dflash-target-layers",
                                         "spread"], "spread"),
    ("train", "report_to"): (["--report-to", "wandb,mlflow"], "wandb,mlflow"),
    ("extract", "engine_args"): (["--engine-args", '{"max_num_seqs": 8}'], {"max_num_seqs": 8}),
    ("eval", "num_draft_tokens"): (["--num-draft-tokens", "5"], 5),
    ("eval", "sweep"): (["--sweep", "2,3,5x4x8"], "2,3,5x4x8"),
    ("eval", "cost_model"): (["--cost-model", "draft=1,verify=4,per_token=0.5"],
                             "draft=1,verify=4,per_token=0.5"),
    ("eval", "chat_template_kwargs"): (["--chat-template-kwargs", '{"enable_thinking": false}'],
                                       {"enable_thinking": False}),
}

CONFIG_MODULES = {"generate": "generate", "prepare": "prepare", "vocab": "vocab",
                  "extract": "extract", "train": "train", "export": "export", "eval": "eval",
                  "doctor": "doctor"}


class Captured(Exception):
    """Raised by the fake stage entry with the config it received."""

    def __init__(self, config: Any) -> None:
        super().__init__("captured")
        self.config = config


@pytest.fixture
def capture(monkeypatch):
    """Replace every stage's ``specdraft.<stage>.run`` by a module whose ``run`` raises
    :class:`Captured`; returns ``invoke(argv) -> config``."""
    def fake_run(config: Any, **_: Any) -> None:
        raise Captured(config)

    for stage in CONFIG_MODULES.values():
        module = types.ModuleType(f"specdraft.{stage}.run")
        module.run = fake_run
        monkeypatch.setitem(sys.modules, f"specdraft.{stage}.run", module)
    import specdraft.engines.live  # serve's entry (no stage package: it writes no artifact)

    monkeypatch.setattr(specdraft.engines.live, "serve", fake_run)

    def invoke(argv: list[str]) -> Any:
        res = CliRunner().invoke(app, argv)
        assert isinstance(res.exception, Captured), (argv, res.output, res.exception)
        return res.exception.config
    return invoke


def generic_sample(name: str, flag: Any, info: Any) -> tuple[list[str], Any]:
    """A value other than the default, spelled for the command line, and the value expected."""
    default = field_default(info)
    opt = flag.decls[0].split("/")
    typ = flag.annotation.__args__[0]
    if typ is bool:
        return ([opt[1]] if default else [opt[0]]), not default
    if getattr(typ, "__origin__", None) is not None and typ.__origin__.__name__ == "Literal":
        choice = next(c for c in typ.__args__ if c != default)
        return [opt[0], choice], choice
    if typ is int:
        value = (default or 1) + 1
        return [opt[0], str(value)], value
    if typ is float:
        value = default / 2 if default else 0.5
        return [opt[0], repr(value)], value
    if typ is Path:
        return [opt[0], "some/dir"], Path("some/dir")
    return [opt[0], f"x-{name}"], f"x-{name}"


def cases() -> list[tuple[str, str]]:
    out = []
    for info in app.registered_commands:
        cmd = info.callback
        if hasattr(cmd, "config_class"):
            out += [(info.name, f.field) for f in cmd.flags if not f.argument]
    return out


def command_of(verb: str) -> Any:
    return next(i.callback for i in app.registered_commands if i.name == verb)


@pytest.mark.parametrize("verb,field", cases())
def test_each_flag_sets_its_field_and_nothing_else(capture, verb, field):
    cmd = command_of(verb)
    flag = next(f for f in cmd.flags if f.field == field)
    info = cmd.config_class.model_fields[field]
    argv, expected = SAMPLES.get((verb, field)) or generic_sample(field, flag, info)
    base = capture([verb, *BASE[verb]]).to_dict()
    got = capture([verb, *BASE[verb], *argv])
    assert getattr(got, field) == expected
    changed = {k for k, v in got.to_dict().items() if base[k] != v}
    others = {a[2:].replace("-", "_") for a in argv if a.startswith("--")} - {field}
    assert field in changed and changed - others == {field}, changed  # and nothing else


def test_cases_cover_every_field_but_the_internal_ones():
    covered = set(cases())
    for info in app.registered_commands:
        cls = getattr(info.callback, "config_class", None)
        if cls is not None:
            fields = {(info.name, f) for f in cls.model_fields} - set(PIPELINE_INTERNAL)
            assert fields - covered <= {("doctor", "target")}
    assert len(covered) >= 130


def test_doctor_target_is_positional(capture):
    assert capture(["doctor", "runs/x", "--verifier", "v"]).target == Path("runs/x")


def test_flags_override_the_config_file_and_absent_flags_keep_it(capture, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("run_dir: runs/from-file\nvocab:\n  draft_vocab_size: 123\n"
                   "  include_byte_fallback: false\n  report_left_out: 7\n")
    got = capture(["vocab", "--config", str(cfg)])
    assert (got.run_dir, got.draft_vocab_size, got.include_byte_fallback,
            got.report_left_out) == ("runs/from-file", 123, False, 7)
    got = capture(["vocab", "--config", str(cfg), "--include-byte-fallback",
                   "--draft-vocab-size", "9"])
    assert (got.run_dir, got.draft_vocab_size, got.include_byte_fallback,
            got.report_left_out) == ("runs/from-file", 9, True, 7)
    cfg.write_text("run_dir: r\ntrain:\n  aux_layers: [1, 2, 3]\n  online: true\n"
                   "  verifier: smollm2\n")
    got = capture(["train", "--config", str(cfg)])
    assert got.aux_layers == (1, 2, 3) and got.online
    got = capture(["train", "--config", str(cfg), "--offline", "--aux-layers", "4"])
    assert got.aux_layers == (4,) and not got.online


def test_bad_values_name_the_flag():
    def error(argv: list[str]) -> str:
        res = CliRunner().invoke(app, argv)
        return str(res.exception) if res.exception and not isinstance(res.exception,
                                                                        SystemExit) \
            else res.output
    assert "--k (k): Input should be less than or equal to 64" in error(
        ["eval", "--prompts", "q", "--run-dir", "r", "--k", "65"])
    assert "--extra-body: expected a JSON object, got list" in error(
        ["generate", "--prompts", "p", "--run-dir", "r", "--extra-body", "[1]"])
    assert "--aux-layers (aux_layers.1): Input should be a valid integer" in error(
        ["train", "--run-dir", "r", "--aux-layers", "1,x"])
    assert "--field 'question': expected KIND=COLUMN" in error(
        ["generate", "--prompts", "p", "--run-dir", "r", "--field", "question"])
    assert "--fields (fields): Value error, unknown field kind(s) ['nope']" in error(
        ["generate", "--prompts", "p", "--run-dir", "r", "--field", "nope=x"])
    assert "'bf17' is not one of" in error(["extract", "--run-dir", "r", "--storage", "bf17"])
    assert "TARGET (target): Field required" in error(["doctor"])  # positional: no --target


def test_a_new_field_of_any_type_becomes_an_option():
    """What another stage's new fields get without touching the CLI (unions: the text given)."""
    import typer
    from pydantic import Field

    from specdraft.cli.options import stage_command
    from specdraft.core.config import StageConfig

    class Planted(StageConfig):
        run_dir: str = Field(description="Run directory.")
        engine: Literal["hf", "vllm"] = Field("hf", description="Engine.")
        budget: int | str = Field(1, description="A count or 'auto'.")
        ids: tuple[int, ...] = Field((), description="Ids.")

    seen = []
    cmd = stage_command(Planted, verb="planted", help="A planted verb.", run=seen.append,
                        echo=lambda result, cfg: None)
    planted = typer.Typer()
    planted.callback()(lambda: None)
    planted.command("planted")(cmd)
    res = CliRunner().invoke(planted, ["planted", "--run-dir", "r", "--engine", "vllm",
                                       "--budget", "auto", "--ids", "3,4"])
    assert res.exit_code == 0, res.output
    assert seen[0].to_dict() == {"run_dir": "r", "engine": "vllm", "budget": "auto",
                                 "ids": [3, 4]}
    res = CliRunner().invoke(planted, ["planted", "--run-dir", "r", "--budget", "7"])
    assert seen[1].budget == 7
