"""The drafter kinds' rule (docs/architecture.md "Kinds"), read from the source with ``ast``:
no code outside the kind homes (``kinds/``) and the model files (``models/``) branches on a kind
or guesses one from keys, and every registered kind has a row in every table."""

import ast
from pathlib import Path

import pytest

from specdraft import kinds

PKG = Path(__file__).resolve().parents[2] / "src" / "specdraft"
HOMES = ("kinds", "models")
#: a kind's own format module its home points to (reading its own keys is not guessing a kind)
FORMAT_MODULES = {"artifacts/dflash_export.py"}
#: the names of kinds and of the layers of a kind, as string constants
KIND_WORDS = {"dflash", "mla"}
#: config keys a kind used to be guessed from (detect_kind holds the one rule)
GUESS_KEYS = {"kv_lora_rank", "mask_token_id", "target_layer_ids", "dflash_config"}
#: functions that guessed a kind
GUESSERS = {"is_dflash", "is_dflash_drafter", "is_dflash_model", "_is_mla", "is_mla"}
#: the kinds' (and layers') classes: an isinstance on one of them is a branch on the kind
KIND_CLASSES = {"DFlashDraftModel", "DFlashConfig", "Eagle3DraftModel", "Eagle3Config",
                "Eagle3MLADraftModel", "Eagle3MLAConfig"}


def _constants(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


def _names(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))}


def kind_branches(pkg: Path = PKG) -> list[str]:
    """``file:line: what`` of every kind branch outside the homes: a comparison with a kind or
    layer name or on ``draft_layer``, a key test of a guess key (``in`` / ``.get``), a call of a
    guesser, an ``isinstance`` on a kind's class."""
    found = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        if rel.parts[0] in HOMES or rel.as_posix() in FORMAT_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            what = None
            if isinstance(node, ast.Compare):
                ops = {type(o) for o in node.ops}
                if ops & {ast.Eq, ast.NotEq} and _constants(node) & KIND_WORDS:
                    what = f"compares with {sorted(_constants(node) & KIND_WORDS)}"
                elif ops & {ast.Eq, ast.NotEq} and "draft_layer" in _names(node):
                    what = "compares draft_layer"
                elif ops & {ast.In, ast.NotIn} and _constants(node.left) & GUESS_KEYS:
                    what = f"tests key {sorted(_constants(node.left) & GUESS_KEYS)}"
            elif isinstance(node, ast.Call):
                func = _names(node.func)
                if func & GUESSERS:
                    what = f"calls {sorted(func & GUESSERS)}"
                elif "isinstance" in func and len(node.args) == 2 and \
                        _names(node.args[1]) & KIND_CLASSES:
                    what = f"isinstance on {sorted(_names(node.args[1]) & KIND_CLASSES)}"
                elif "get" in func and node.args and _constants(node.args[0]) & GUESS_KEYS:
                    what = f"reads key {sorted(_constants(node.args[0]) & GUESS_KEYS)}"
            elif isinstance(node, ast.FunctionDef) and node.name in GUESSERS:
                what = f"defines {node.name}"
            if what:
                found.append(f"{rel}:{node.lineno}: {what}")
    return found


def test_no_kind_branching_outside_the_kind_homes():
    assert kind_branches() == []


def test_the_rule_catches_each_kind_of_branch(tmp_path):
    """Planted faults, one per pattern, each reported with file and line."""
    pkg = tmp_path / "specdraft"
    (pkg / "eval").mkdir(parents=True)
    (pkg / "models").mkdir()
    (pkg / "eval" / "run.py").write_text(
        'def f(cfg, raw, m):\n'
        '    if cfg.drafter == "dflash":\n'
        '        pass\n'
        '    if m.config.draft_layer != "llama":\n'
        '        pass\n'
        '    if "kv_lora_rank" in raw or raw.get("dflash_config"):\n'
        '        pass\n'
        '    return is_dflash_drafter(m) or isinstance(m, DFlashDraftModel)\n')
    (pkg / "models" / "x.py").write_text('def g(c):\n    return c.draft_layer == "mla"\n')
    assert kind_branches(pkg) == [
        "eval/run.py:2: compares with ['dflash']", "eval/run.py:4: compares draft_layer",
        "eval/run.py:6: tests key ['kv_lora_rank']", "eval/run.py:6: reads key ['dflash_config']",
        "eval/run.py:8: calls ['is_dflash_drafter']",
        "eval/run.py:8: isinstance on ['DFlashDraftModel']"]


@pytest.mark.parametrize("name", sorted(kinds.KINDS))
def test_every_kind_has_a_row_in_every_table(name):
    """Each registered kind: every hook of its home, its objective and decoder resolvable,
    its export formats and engine method declared, its options fields of the train config."""
    from specdraft.train.config import TrainConfig

    kind = kinds.get(name)
    home = kind.hooks()
    assert [h for h in kinds.HOOKS if not callable(getattr(home, h, None))] == []
    assert callable(kinds.resolve(kind.objective)) and callable(kinds.resolve(kind.decoder))
    assert kind.formats and kind.engine_method
    assert kind.options <= set(TrainConfig.model_fields)
    assert kind.architectures  # detect_kind can tell its engine exports


def test_the_built_in_kinds_are_the_flag_choices_and_own_disjoint_options():
    """``--drafter`` lists every built-in kind; no option belongs to two kinds; a legacy
    ``drafter_config.json`` detects as the kind whose config wrote it."""
    import typing
    from dataclasses import fields

    from specdraft.models.dflash import DFlashConfig
    from specdraft.models.eagle3 import Eagle3Config
    from specdraft.train.config import TrainConfig

    assert set(typing.get_args(TrainConfig.model_fields["drafter"].annotation)) == set(kinds.KINDS)
    e, d = kinds.get("eagle3").options, kinds.get("dflash").options
    assert not e & d
    legacy = {f.name: 1 for f in fields(DFlashConfig)}
    assert kinds.detect_kind(legacy) == DFlashConfig.kind == "dflash"
    assert kinds.detect_kind({f.name: 1 for f in fields(Eagle3Config)}) == "eagle3"
