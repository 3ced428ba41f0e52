"""The rooms of the house and what each may import (docs/architecture.md), read from the source
with ``ast``: every ``import specdraft.X`` / ``from specdraft.X import`` (top level or inside a
function) and every relative import, resolved to its top package."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "src" / "specdraft"
STAGES = {"generate", "prepare", "vocab", "extract", "train", "export", "eval", "doctor"}
LOWER = {"core", "models", "artifacts", "engines"}
#: what each room may import besides itself; ``cli`` and ``pipeline`` compose the stages
ALLOWED = {**{s: LOWER for s in STAGES},
           "artifacts": {"core", "models"}, "engines": {"core", "models", "artifacts"},
           "core": set(), "models": {"core"}}


def imported_packages(path: Path, pkg: Path = PKG) -> list[tuple[int, str]]:
    """``(line, top package)`` of every specdraft import in ``path`` (a file under ``pkg``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = path.relative_to(pkg).parts
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[1]) for a in node.names
                    if a.name.startswith("specdraft.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = here[:len(here) - node.level]
                mod = ".".join(base + tuple(filter(None, (node.module or "").split("."))))
                if mod:
                    out.append((node.lineno, mod.split(".")[0]))
            elif node.module and node.module.startswith("specdraft."):
                out.append((node.lineno, node.module.split(".")[1]))
            elif node.module == "specdraft":
                out += [(node.lineno, a.name) for a in node.names]
    return out


def violations(pkg: Path = PKG) -> list[str]:
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        room = path.relative_to(pkg).parts[0]
        if room not in ALLOWED:
            continue
        for line, target in imported_packages(path, pkg):
            if target != room and target not in ALLOWED[room]:
                bad.append(f"{path.relative_to(pkg.parent)}:{line}: {room} imports {target}")
    return bad


def test_each_room_imports_only_what_it_may():
    assert violations() == []


def test_the_rule_catches_a_stage_importing_another(tmp_path):
    """Planted faults: a function-level import of another stage, a relative import of the CLI,
    and core reaching up into artifacts are all reported with file and line."""
    pkg = tmp_path / "specdraft"
    for room in ("eval", "train", "core"):
        (pkg / room).mkdir(parents=True)
    (pkg / "eval" / "engine.py").write_text(
        "from specdraft.core.errors import InputError\n\ndef f():\n"
        "    from specdraft.export.run import run\n")
    (pkg / "train" / "main.py").write_text("from ..cli.train import command\n")
    (pkg / "core" / "x.py").write_text("import specdraft.artifacts.layout\n")
    assert violations(pkg) == ["specdraft/core/x.py:1: core imports artifacts",
                               "specdraft/eval/engine.py:4: eval imports export",
                               "specdraft/train/main.py:1: train imports cli"]


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_every_room_exists(room):
    assert (PKG / room / "__init__.py").exists()


def hf_config_readers(pkg: Path = PKG) -> list[str]:
    """``file:line`` of every use of ``AutoConfig`` or every ``"config.json"`` joined to a path and
    read as JSON outside :mod:`specdraft.core.profile`, the one reader of a verifier's HF
    config (issue #27 item 2). A drafter's own ``config.json`` (export, models, artifacts) is not
    a verifier config: those rooms are not scanned for the literal."""
    found = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg.parent)
        if rel.as_posix() == "specdraft/core/profile.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "AutoConfig" or \
                    isinstance(node, ast.alias) and node.name == "AutoConfig":
                found.append(f"{rel}:{getattr(node, 'lineno', '?')}: AutoConfig")
            elif (isinstance(node, ast.Call) and "read" in ast.unparse(node.func)
                  and '"config.json"' in ast.unparse(node).replace("'", '"')
                  and path.relative_to(pkg).parts[0] not in ("export", "models", "artifacts")):
                found.append(f"{rel}:{node.lineno}: reads config.json")
    return sorted(set(found))


def test_only_the_profile_reads_verifier_configs(tmp_path):
    assert hf_config_readers() == []
    pkg = tmp_path / "specdraft"
    (pkg / "prepare").mkdir(parents=True)
    (pkg / "prepare" / "run.py").write_text(
        "import json\nfrom transformers import AutoConfig\n\ndef f(d):\n"
        "    return json.loads((d / \"config.json\").read_text())\n")
    assert hf_config_readers(pkg) == ["specdraft/prepare/run.py:2: AutoConfig",
                                      "specdraft/prepare/run.py:5: reads config.json"]
