"""Helpers of the malformed-input suite: the final names a refused run must not leave, and
writing records line by line (as bytes, with any line end or a BOM)."""

from __future__ import annotations

import json
from pathlib import Path

# the final names each stage writes (docs/run-dir.md): a refused run leaves none of them new
FINAL_NAMES = {
    "generate": ("samples.jsonl", "rejects.jsonl", "manifest.json"),
    "prepare": ("dataset", "rejects.jsonl", "manifest.json"),
    "export": ("manifest.json", "sglang", "vllm", "speculators"),
}


def final_names(stage_dir: Path, stage: str) -> set[str]:
    """The stage's final artifacts that exist and are non-empty (empty files hold no work)."""
    out = set()
    for name in FINAL_NAMES[stage]:
        p = stage_dir / name
        if p.is_dir() and any(p.iterdir()) or p.is_file() and p.stat().st_size:
            out.add(name)
    return out


def write_lines(path: Path, lines: list, *, eol: str = "\n", bom: bool = False) -> Path:
    """Write records (dicts are JSON-encoded, str/bytes written as-is) one per line."""
    parts = []
    for x in lines:
        if isinstance(x, bytes):
            parts.append(x)
        elif isinstance(x, str):
            parts.append(x.encode())
        else:
            parts.append(json.dumps(x).encode())
    data = eol.encode().join(parts) + (eol.encode() if parts else b"")
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    return path
