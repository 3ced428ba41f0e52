"""Hand-built run-dir pieces for tests (importable from every test folder: tests/ is on
sys.path through tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path


def write_stub_manifest(stage_dir: Path, stage: str, **facts) -> Path:
    """A valid ``manifest.json`` of ``stage`` (provenance fields plus ``facts``) for tests that
    build a run directory by hand; the typed manifest classes check it on read."""
    import json

    base = {"stage": stage, "config": {}, "config_hash": "stub", "started_at": "stub",
            "finished_at": "stub", "elapsed_s": 0.0}
    required = {"vocab": {"vocab": {"draft_vocab_size": 0, "verifier_vocab_size": 0,
                                    "coverage": 1.0}},
                "prepare": {"verifier_vocab_size": 0, "tokenizer": {}, "chat_format": {},
                            "forced_token_ids": {}}}.get(stage, {})
    Path(stage_dir).mkdir(parents=True, exist_ok=True)
    path = Path(stage_dir) / "manifest.json"
    path.write_text(json.dumps({**base, **required, **facts}))
    return path


def vllm_python_or_skip() -> str:
    """``SPECDRAFT_VLLM_PYTHON`` or ``REPO/.venv-vllm/bin/python`` (``make install-vllm``) for
    the real-engine tests; skipped when absent, a failure under ``CI``."""
    import os

    from prerequisites import missing

    repo = Path(__file__).resolve().parents[1]
    path = os.environ.get("SPECDRAFT_VLLM_PYTHON") or str(repo / ".venv-vllm" / "bin" / "python")
    if not Path(path).exists():
        missing(f"{path} not found", "the real-engine tests need the vLLM venv: make install-vllm")
    return path
