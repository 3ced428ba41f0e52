"""``RunLayout`` names every path of a run; no module under ``src/`` joins a stage directory
itself (planted by hand, undone: a ``stage_dir(run, "extract")`` call back in ``train/run.py``
and a ``run_dir / "vocab"`` join in ``artifacts/checks.py``; both caught)."""

import ast
import re
from pathlib import Path

from specdraft.artifacts.layout import RunLayout

SRC = Path(__file__).resolve().parents[2] / "src" / "specdraft"
STAGES = ("generate", "prepare", "vocab", "extract", "train", "export", "eval", "run")


def test_every_stage_directory_and_file_by_hand(tmp_path):
    r = RunLayout(tmp_path)
    assert (r.generate, r.prepare, r.vocab, r.extract, r.train, r.exports, r.eval,
            r.pipeline) == tuple(tmp_path / s for s in STAGES)
    assert r.dataset == tmp_path / "prepare" / "dataset"
    assert r.vocab_map == tmp_path / "vocab" / "vocab_map.safetensors"
    assert r.verifier_head == tmp_path / "extract" / "verifier_head.safetensors"
    assert (r.best, r.last) == (tmp_path / "train" / "best", tmp_path / "train" / "last")
    assert r.export("vllm") == tmp_path / "export" / "vllm"
    assert r.verifier_contract == tmp_path / "verifier.json"
    assert r.stage("extract") == r.extract


def test_no_module_joins_a_stage_directory_itself():
    """Outside ``core/rundir.py`` (which defines the run directory contract) no call of
    ``stage_dir`` and no ``/ "<stage>"`` join: every path comes from :class:`RunLayout`."""
    literal = re.compile(r'/ "(' + "|".join(STAGES) + r')"')
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if str(rel) in ("core/rundir.py", "artifacts/layout.py"):
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "stage_dir":
                found.append(f"{rel}:{node.lineno} stage_dir()")
        found += [f"{rel}:{text[:m.start()].count(chr(10)) + 1} {m.group(0)}"
                  for m in literal.finditer(text)]
    assert found == []
