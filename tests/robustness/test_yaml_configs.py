"""YAML configs: `specdraft run CONFIG` and a stage's `--config FILE` (one reader,
:func:`specdraft.core.config.load_yaml`, then the frozen stage configs)."""

from __future__ import annotations

import json

import pytest

from specdraft.generate.fakeserver import LoopbackServer

# (case, yaml bytes, what the error must name); {run} is replaced by the run directory
REFUSED = [
    ("invalid_utf8", b"run_dir: {run}\ngenerate:\n  system_prompt: caf\xe9\n", ["not UTF-8"]),
    ("syntax_error", b"run_dir: {run}\ngenerate:\n  max_tokens: [8\n", ["not valid YAML",
                                                                      "line"]),
    ("not_a_mapping", b"- run_dir\n- generate\n", ["expected a mapping", "list"]),
    ("section_not_mapping", b"run_dir: {run}\ngenerate: [1, 2]\n",
     ["section `generate` must be a mapping"]),
    ("wrong_type", b"run_dir: {run}\ngenerate:\n  max_tokens: lots\n", ["--max-tokens"]),
    ("unknown_key_in_section", b"run_dir: {run}\ngenerate:\n  max_tokenz: 8\n",
     ["--max-tokenz", "not permitted"]),
    ("renamed_section_key", b"run_dir: {run}\ngenerate:\n  prompt_file: p.jsonl\n",
     ["--prompt-file"]),
]
RUN_ONLY = [
    ("empty_file", b"", ["set `run_dir:`"]),
    ("unknown_top_level_key", b"run_dir: {run}\ngenrate: {}\n", ["unknown key(s) ['genrate']"]),
]


def _write(tmp_path, text: bytes):
    path = tmp_path / "c.yaml"
    path.write_bytes(text.replace(b"{run}", str(tmp_path / "run").encode()))
    return path


@pytest.mark.parametrize("case,text,needles", REFUSED + RUN_ONLY,
                         ids=[c[0] for c in REFUSED + RUN_ONLY])
def test_specdraft_run_refuses(tmp_path, cli, case, text, needles):
    cfg = _write(tmp_path, text)
    err = cli("run", cfg).error
    assert all(n in err for n in needles) and str(cfg) in err, err
    assert not (tmp_path / "run" / "generate").exists()


@pytest.mark.parametrize("case,text,needles", REFUSED, ids=[c[0] for c in REFUSED])
def test_stage_config_flag_refuses(tmp_path, cli, case, text, needles):
    cfg = _write(tmp_path, text)
    err = cli("generate", "--config", cfg, "--prompts", "builtin:demo_train").error
    assert all(n in err for n in needles) and str(cfg) in err, err
    assert not (tmp_path / "run" / "generate").exists()


@pytest.mark.parametrize("variant", ["bom", "crlf"])
def test_bom_and_crlf_configs_are_read(tmp_path, cli, variant):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question": "q1"}) + "\n")
    with LoopbackServer() as url:
        text = (f"run_dir: {tmp_path / 'run'}\ngenerate:\n  backend: openai\n"
                f"  endpoint: [{url}]\n  max_tokens: 7\n")
        if variant == "crlf":
            text = text.replace("\n", "\r\n")
        cfg = tmp_path / "c.yaml"
        cfg.write_bytes((b"\xef\xbb\xbf" if variant == "bom" else b"") + text.encode())
        res = cli("generate", "--config", cfg, "--prompts", prompts)
    assert res.code == 0, res.err
    man = json.loads((tmp_path / "run/generate/manifest.json").read_text())
    assert man["config"]["max_tokens"] == 7 and man["config"]["endpoint"] == [url]
