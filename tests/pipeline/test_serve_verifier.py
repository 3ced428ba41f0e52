"""Which verifier the run summary's serve commands name (``pipeline.summary.serve_verifier``)."""

from specdraft.pipeline.summary import serve_verifier


def test_the_converted_directory_when_a_stage_wrote_it(tmp_path):
    """The demo's verifier is a GGUF; the engine served ``RUN/verifier-hf`` (its HF conversion)
    in eval, so the command names that directory, not a hub id this machine cannot fetch."""
    assert serve_verifier(tmp_path, "smollm2") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "verifier-hf").mkdir()
    assert serve_verifier(tmp_path, "smollm2") == "HuggingFaceTB/SmolLM2-135M-Instruct"  # empty
    (tmp_path / "verifier-hf" / "config.json").write_text("{}")
    assert serve_verifier(tmp_path, "smollm2") == str((tmp_path / "verifier-hf").resolve())


def test_other_verifiers(tmp_path):
    assert serve_verifier(tmp_path, "/models/Kimi-K2.5") == "/models/Kimi-K2.5"
    assert serve_verifier(tmp_path, "/x/model.Q4.gguf") == "<the verifier's HF id or directory>"
