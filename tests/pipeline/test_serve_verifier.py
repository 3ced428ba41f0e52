"""Which verifier the run summary's serve commands name (``pipeline.summary.serve_verifier``):
the local directory the drafter was bound to, never a hub id (issue 40)."""

import subprocess
import sys

import pytest

from specdraft.engines.serve import serve_block, serve_commands, verifier_note
from specdraft.pipeline.summary import serve_verifier


def test_a_gguf_is_served_from_the_run_s_converted_directory(tmp_path):
    """The demo's verifier is a GGUF: the engine serves ``RUN/verifier-hf`` (its HF conversion,
    written by extract or eval), named even before it exists, with the command that writes it;
    never the hub id this machine would have to download."""
    hf = str((tmp_path / "verifier-hf").resolve())
    assert serve_verifier(tmp_path, "smollm2") == hf
    note = verifier_note(tmp_path, "smollm2")
    assert note.startswith(f"{hf} does not exist yet") and \
        f'gguf_to_hf_dir("smollm2", "{hf}")' in note
    (tmp_path / "verifier-hf").mkdir()
    assert verifier_note(tmp_path, "smollm2") is not None  # empty: still to be written
    (tmp_path / "verifier-hf" / "config.json").write_text("{}")
    assert serve_verifier(tmp_path, "smollm2") == hf and verifier_note(tmp_path, "smollm2") is None
    assert serve_verifier(tmp_path, "/x/model.Q4.gguf") == hf


def test_other_verifiers_as_given(tmp_path):
    assert serve_verifier(tmp_path, "/models/Kimi-K2.5") == "/models/Kimi-K2.5"
    assert verifier_note(tmp_path, "/models/Kimi-K2.5") is None
    (tmp_path / "v").mkdir()
    assert serve_verifier(tmp_path, str(tmp_path / "v" / ".." / "v")) == str(tmp_path / "v")


def test_the_block_puts_comments_above_the_commands(tmp_path):
    commands = serve_commands("/d", str(tmp_path / "verifier-hf"), 3, fmt="vllm",
                              dtype="bfloat16", python="/py")
    assert commands == ["/py -m vllm.entrypoints.openai.api_server --model "
                        f"{tmp_path / 'verifier-hf'} --dtype bfloat16 --speculative-config "
                        """'{"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}'"""]
    block = serve_block(commands, run_dir=tmp_path, verifier="smollm2", notes=["a fix"])
    assert block[0] == "# a fix" and block[1].startswith("# ") and block[2:] == commands
    assert serve_block([], run_dir=tmp_path, verifier="smollm2") == []


@pytest.mark.slow  # the real SmolLM2 GGUF, dequantized (~25 s)
def test_the_conversion_command_runs_as_printed(tmp_path):
    """The note's command, run as printed, writes the directory the serve line names (the real
    SmolLM2 GGUF, converted as extract and eval convert it)."""
    note = verifier_note(tmp_path, "smollm2")
    command = note.split(" with: ", 1)[1]
    assert command.startswith(sys.executable)
    subprocess.run(command, shell=True, check=True, cwd=tmp_path, capture_output=True)
    assert (tmp_path / "verifier-hf" / "config.json").is_file()
    assert verifier_note(tmp_path, "smollm2") is None


def test_a_hub_id_is_served_from_its_local_snapshot(tmp_path, monkeypatch):
    """A verifier given as a hub id was loaded from the local Hugging Face cache: the line
    names that snapshot directory (no download); an id not in the cache stays as given."""
    cache = tmp_path / "hub"
    snap = cache / "models--org--model" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (cache / "models--org--model" / "refs").mkdir()
    (cache / "models--org--model" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    assert serve_verifier(tmp_path, "org/model") == str(snap)
    assert serve_verifier(tmp_path, "org/absent") == "org/absent"
