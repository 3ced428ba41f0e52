"""The rooms of the house and what each may import (docs/architecture.md), read from the source
with ``ast``: every ``import specdraft.X`` / ``from specdraft.X import`` (top level or inside a
function) and every relative import, resolved to its top package."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "src" / "specdraft"
STAGES = {"generate", "prepare", "vocab", "extract", "train", "export", "eval", "doctor"}
LOWER = {"core", "models", "artifacts", "engines"}
#: what each room may import besides itself; ``cli`` and ``pipeline`` compose the stages.
#: ``kinds``: the drafter kinds (docs/architecture.md "Kinds"): its homes span train, eval and
#: export, so they import what the stages import, never a stage; the stages and ``artifacts``
#: dispatch through its registry (``specdraft.kinds`` itself, which imports only ``core``:
#: :func:`kind_violations`).
ALLOWED = {**{s: LOWER | {"kinds"} for s in STAGES},
           "artifacts": {"core", "models", "kinds"}, "engines": {"core", "models", "artifacts"},
           "kinds": LOWER, "core": set(), "models": {"core"}}


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


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute ``specdraft`` import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("specdraft.")]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "specdraft":
                out += [(node.lineno, f"specdraft.{a.name}") for a in node.names]
            elif node.module.startswith("specdraft."):
                out.append((node.lineno, node.module))
    return out


def kind_violations(pkg: Path = PKG) -> list[str]:
    """A kind's home (``specdraft.kinds.<kind>``) is reached through the registry only, never
    imported from outside ``kinds/``; the registry (``kinds/__init__.py``) imports only
    ``core`` (the stages and ``artifacts`` import it: it must not pull them back in)."""
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        for line, mod in imported_modules(path):
            parts = mod.split(".")
            if rel.parts[0] != "kinds" and parts[1] == "kinds" and len(parts) > 2:
                bad.append(f"{rel}:{line}: imports the kind home {mod}")
            if rel.as_posix() == "kinds/__init__.py" and parts[1] not in ("core", "kinds"):
                bad.append(f"{rel}:{line}: the kind registry imports {mod}")
    return bad


def test_kind_homes_are_reached_through_the_registry(tmp_path):
    """Planted faults: a stage importing a home, the registry importing a stage."""
    assert kind_violations() == []
    pkg = tmp_path / "specdraft"
    for room in ("eval", "kinds"):
        (pkg / room).mkdir(parents=True)
    (pkg / "eval" / "run.py").write_text("from specdraft.kinds.dflash import build\n")
    (pkg / "kinds" / "__init__.py").write_text("\ndef f():\n    import specdraft.train.run\n")
    assert kind_violations(pkg) == [
        "eval/run.py:1: imports the kind home specdraft.kinds.dflash",
        "kinds/__init__.py:3: the kind registry imports specdraft.train.run"]


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
