"""The CLI surface is frozen, complete and named right.

- the generated surface equals the checked-in ``cli_surface.txt`` (regenerate on purpose);
- every config field is an option (but the listed pipeline-internal ones), named as the
  validation errors name it, with a description, and the help shows the field's default once;
- every ``--flag`` in a string literal of ``src/specdraft`` is an option of some verb (or a
  listed flag of another program);
- every ``specdraft …`` command in README.md parses;
- importing the CLI imports no torch.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import Field
from pydantic_core import PydanticUndefined

from specdraft.cli import _surface, options
from specdraft.core.config import StageConfig, flag_name

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("cli_surface.txt")
REGENERATE = ("PYTHONPATH=src python -m specdraft.cli._surface > tests/cli/cli_surface.txt "
              "(or run this test with SPECDRAFT_UPDATE_GOLDEN=1)")

#: Flags of other programs that specdraft's messages and docs name, with where they belong.
OTHER_PROGRAMS = {
    "--speculative-config": "vllm serve",
    "--kv-transfer-config": "vllm serve (engines/live.py: the hidden-state capture)",
    "--no-enable-prefix-caching": "vllm serve (engines/live.py)",
    "--enforce-eager": "vllm serve (serve --extra-args)",
    "--max-num-seqs": "vllm serve (serve --extra-args)",
    "--enable-expert-parallel": "vllm serve (serve --extra-args, docs/scale.md)",
    "--reasoning-parser": "vllm serve (docs/kimi-job.md)",
    "--reasoning-config": "vllm serve (docs/kimi-job.md)",
    "--attention-backend": "vllm serve (docs/kimi-job.md: float32 MLA on an AMX CPU)",
    "--enable-auto-tool-choice": "vllm serve (docs/stages.md, tool calling)",
    "--tool-call-parser": "vllm serve (docs/stages.md, tool calling)",
    "--model-path": "sglang.launch_server",
    "--full-attention-indices": "speculators' DFlash trainer (docs/benchmarks.md)",
    "--num-layers": "speculators' DFlash trainer (docs/benchmarks.md)",
    "--block-size": "speculators' DFlash trainer (docs/benchmarks.md)",
    "--speculative-algorithm": "sglang.launch_server",
    "--speculative-draft-model-path": "sglang.launch_server",
    "--speculative-num-steps": "sglang.launch_server",
    "--speculative-eagle-topk": "sglang.launch_server",
    "--speculative-num-draft-tokens": "sglang.launch_server",
    "--speculative-accept-threshold-single": "sglang.launch_server",
    "--nproc-per-node": "torchrun",
    "--nnodes": "torchrun",
    "--rdzv": "torchrun (--rdzv-*)",
    "--master-port": "torchrun",
    "--no-deps": "pip install",
    "--host": "sglang.launch_server / vllm's api_server (eval/sglang.py, tests)",
    "--port": "sglang.launch_server / vllm's api_server (eval/sglang.py, tests)",
    "--fc": "not a flag: the `--fc-->` arrow of the diagram in models/eagle3.py",
    "--flag": "not a flag: the placeholder in core/config.py's format_validation_error doc",
}

FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


def stage_commands() -> dict[str, object]:
    """``{verb: command function}`` of the verbs generated from a StageConfig."""
    from specdraft.cli import app

    return {info.name: info.callback for info in app.registered_commands
            if hasattr(info.callback, "config_class")}


# --- the golden surface -------------------------------------------------------------------

def surface_diff(expected: list[str], actual: list[str]) -> list[str]:
    """Lines only in one of the two surfaces, ``-`` golden / ``+`` generated."""
    gone = [f"- {line}" for line in expected if line not in actual]
    new = [f"+ {line}" for line in actual if line not in expected]
    return gone + new


def test_cli_surface_matches_the_golden_file():
    actual = _surface.surface_lines()
    if os.environ.get("SPECDRAFT_UPDATE_GOLDEN"):
        GOLDEN.write_text("\n".join(actual) + "\n", encoding="utf-8")
    expected = GOLDEN.read_text(encoding="utf-8").splitlines()
    diff = surface_diff(expected, actual)
    assert not diff and actual == expected, (
        "the CLI surface changed (users see this):\n" + "\n".join(diff or ["(order changed)"])
        + f"\nIf intended, regenerate the golden file: {REGENERATE}")


def test_surface_diff_catches_a_changed_default():
    golden = GOLDEN.read_text(encoding="utf-8").splitlines()
    planted = [line.replace("eval  --k  int  4", "eval  --k  int  5") for line in golden]
    assert surface_diff(golden, planted) == ["- eval  --k  int  4", "+ eval  --k  int  5"]


def test_surface_lines_by_hand():
    lines = set(_surface.surface_lines())
    assert {"eval  --k  int  4", "train  --online/--offline  flag  offline",
            "vocab  --include-byte-fallback/--no-include-byte-fallback  flag  on",
            "extract  --storage  fp32|bf16|fp8|bf16-zstd|fp8-zstd  bf16",
            "generate  --field, --fields  k=v...  -", "generate  --endpoint  list  -",
            "prepare  --chat-template-kwargs  json  -", "doctor  TARGET  path  required",
            "generate  --prompts  str  required", "run  --from  str  -"} <= lines


# --- every field reachable, named as errors name it ------------------------------------------

def field_problems(verb: str, command: object, accepted: set[str]) -> list[str]:
    """Fields of the verb's config without an option named ``flag_name(field)``, options for
    no field, and PIPELINE_INTERNAL entries that name no field."""
    cls = command.config_class
    flagged = {f.field for f in command.flags}
    internal = {f for (v, f) in options.PIPELINE_INTERNAL if v == verb}
    problems = [f"{verb}: field {f} has no option" for f in cls.model_fields
                if f not in flagged and f not in internal]
    problems += [f"{verb}: {flag_name(f.field)} missing" for f in command.flags
                 if not f.argument and flag_name(f.field) not in accepted]
    problems += [f"{verb}: internal {f} is no field" for f in internal
                 if f not in cls.model_fields]
    return problems


def test_every_config_field_is_an_option_named_like_its_errors():
    accepted = _surface.verb_flags()
    cmds = stage_commands()
    assert set(cmds) == {"generate", "prepare", "vocab", "extract", "train", "export", "eval",
                         "doctor", "serve"}
    problems = [p for verb, cmd in cmds.items() for p in field_problems(verb, cmd, accepted[verb])]
    assert problems == []
    assert all(reason.strip() for reason in options.PIPELINE_INTERNAL.values())


def test_field_problems_catches_a_field_without_option(monkeypatch):
    class Planted(StageConfig):
        run_dir: str = Field(description="Run directory.")
        hidden: int = Field(1, description="A field.")

    cmd = options.stage_command(Planted, verb="planted", help="x", run=print, echo=print)
    accepted = {"--run-dir", "--hidden", "--no-hidden"}
    assert field_problems("planted", cmd, accepted) == []
    monkeypatch.setattr(cmd, "flags", cmd.flags[:1])
    assert field_problems("planted", cmd, accepted) == ["planted: field hidden has no option"]
    assert field_problems("planted", cmd, {"--run-dir"}) == ["planted: field hidden has no option"]
    monkeypatch.setitem(options.PIPELINE_INTERNAL, ("planted", "gone"), "renamed")
    assert "planted: internal gone is no field" in field_problems("planted", cmd, accepted)


def test_every_field_has_a_description_that_does_not_repeat_its_default():
    problems = []
    for verb, cmd in stage_commands().items():
        for name, info in cmd.config_class.model_fields.items():
            if not (info.description or "").strip():
                problems.append(f"{verb}.{name}: no description")
            elif repeats_default(info.description, options.field_default(info)):
                problems.append(f"{verb}.{name}: description repeats the default")
    assert problems == []


def repeats_default(description: str, default: object) -> bool:
    """``"Steps (500)."``, ``"[500]"``, ``"default 500"`` for a default of 500."""
    if default is PydanticUndefined or default is None or isinstance(default, bool) \
            or default in ((), [], {}):
        return False
    d = re.escape(str(default))
    return bool(re.search(rf"[(\[]{d}[)\]]|default:? {d}\b", description))


def test_repeats_default_by_hand():
    assert repeats_default("Checkpoint every N steps [500].", 500)
    assert repeats_default("Drafts per verify step (default 4).", 4)
    assert not repeats_default("Drafts per verify step.", 4)
    assert not repeats_default("0 disables clipping.", 0.5)


def test_help_shows_the_field_default_once():
    from typer.testing import CliRunner

    from specdraft.cli import app

    out = CliRunner().invoke(app, ["eval", "--help"], terminal_width=200).output
    line = next(x for x in out.splitlines() if x.strip().startswith("--k "))
    assert line.split(None, 2)[2] == "Draft tokens per verify step. [default: 4]"
    assert "[required, here or in --config]" in out and "--config FILE" in out
    assert out.count("[default: smollm2]") == 1


# --- flags named anywhere in src/specdraft exist ----------------------------------------------

def literal_flags(path: Path) -> list[tuple[int, str]]:
    """``(line, --flag)`` for every flag-like word in a string literal of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.lineno, m.group(0)) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            for m in FLAG_RE.finditer(node.value)]


def unknown_flags(paths: list[Path], known: set[str]) -> list[str]:
    return [f"{p.relative_to(REPO) if p.is_relative_to(REPO) else p}:{line}: {flag}"
            for p in paths for line, flag in literal_flags(p)
            if flag not in known and flag not in OTHER_PROGRAMS]


def all_flags() -> set[str]:
    return set().union(*_surface.verb_flags().values())


def benchmark_flags() -> set[str]:
    """Flags a script in benchmarks/ names as a string literal: its own argparse options, and
    those it passes to another program (peer_speculators.py -> speculators' trainer)."""
    return {m.group(1) for path in (REPO / "benchmarks").glob("*.py")
            for m in re.finditer(r'"(--[a-z][a-z0-9-]*)', path.read_text(encoding="utf-8"))}


def test_every_flag_named_in_src_exists():
    paths = sorted((REPO / "src" / "specdraft").rglob("*.py"))
    assert len(paths) > 50
    found = {flag for p in paths for _, flag in literal_flags(p)}
    assert {"--resume", "--aux-layers", "--chat-template-kwargs", "--dump-config"} <= found
    assert unknown_flags(paths, all_flags()) == [], (
        "messages name flags that no verb has: rename the flag in the message, or (for "
        "another program's flag) add it to OTHER_PROGRAMS with where it belongs")


def test_config_validators_name_their_own_verbs_flags():
    """A stage's config errors reach the user of that verb: they must name its own flags."""
    flags = _surface.verb_flags()
    problems = []
    for verb, command in stage_commands().items():
        path = Path(sys.modules[command.config_class.__module__].__file__)  # serve: engines/
        problems += unknown_flags([path], flags[verb])
    assert problems == []


def test_unknown_flags_catches_a_planted_message(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('def f(n):\n    raise ValueError(f"lower --batch-size {n} or pass '
                   '--no-such-flag")\n')
    assert unknown_flags([bad], all_flags()) == [f"{bad}:2: --no-such-flag"]


# --- README commands parse ----------------------------------------------------------------

def readme_commands(text: str) -> list[str]:
    """``specdraft …`` lines of the fenced bash blocks (continuations joined, comments cut);
    ``torchrun … -m specdraft.cli ARGS`` counts as ``specdraft ARGS``."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    lines = " \n".join(blocks).replace("\\\n", " ").splitlines()
    out = []
    for line in lines:
        line = re.sub(r"\s(#|>\s).*$", "", line).strip()  # comments, redirections
        line = re.sub(r"^torchrun .*?-m specdraft\.cli ", "specdraft ", line)
        line = re.sub(r'^torchrun .*?"\$\(which specdraft\)" ', "specdraft ", line)
        if line.startswith("specdraft "):
            out.append(line)
    return out


def readme_argv(line: str) -> list[str]:
    """``specdraft extract [--storage A|B] [--verify N] [--resume | --overwrite] ...`` ->
    ``["extract", "--storage", "A", "--verify", "3", "--resume"]`` (placeholder N = 3)."""
    line = re.sub(r"\[([^\]]*?)\s\|\s[^\]]*\]", r"\1", line)  # [--resume | --overwrite]
    line = line.replace("[", " ").replace("]", " ")
    argv = [re.sub(r"^([\w./-]+)\|.*$", r"\1", tok) for tok in shlex.split(line)[1:]]
    return ["3" if tok == "N" else tok for tok in argv if tok != "..."]


def parse_problem(argv: list[str]) -> str | None:
    """None when click parses ``argv`` (types and choices checked), else the error."""
    cmd = _surface.commands().get(argv[0])
    if cmd is None:
        return f"no verb {argv[0]!r}"
    try:
        cmd.make_context(argv[0], list(argv[1:]), resilient_parsing=False)
    except Exception as err:  # a usage error of (typer's vendored) click
        return f"{type(err).__name__}: {getattr(err, 'message', err)}"
    return None


#: The user-facing pages whose commands and flags must stay true: the README and docs/.
DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_doc_commands_parse(page):
    cmds = readme_commands(page.read_text(encoding="utf-8"))
    problems = [f"{c}: {p}" for c in cmds if (p := parse_problem(readme_argv(c)))]
    assert problems == []


def test_readme_shows_every_verb():
    cmds = readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
    verbs = {readme_argv(c)[0] for c in cmds}
    assert {"run", "generate", "prepare", "vocab", "extract", "train", "export", "eval",
            "doctor"} <= verbs


def test_readme_parse_catches_a_stale_flag():
    assert readme_argv("specdraft train --run-dir RUN [--storage bf16|fp8] [--resume | "
                       "--overwrite]") == ["train", "--run-dir", "RUN", "--storage", "bf16",
                                           "--resume"]
    assert "--storage" in parse_problem(["train", "--run-dir", "RUN", "--storage", "bf16"])
    assert parse_problem(["extract", "--storage", "bf17"]) is not None
    assert parse_problem(["extract", "--storage", "bf16"]) is None


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: p.name)
def test_every_flag_named_in_docs_exists(page):
    text = page.read_text(encoding="utf-8")
    unknown = sorted({m.group(0) for m in FLAG_RE.finditer(text)} - all_flags()
                     - set(OTHER_PROGRAMS) - benchmark_flags())
    assert unknown == []


# --- light import -------------------------------------------------------------------------

def imported_modules(code: str, names: list[str]) -> list[str]:
    """Which of ``names`` are in ``sys.modules`` after running ``code`` in a fresh python."""
    probe = (f"import sys, json\n{code}\n"
             f"print(json.dumps([n for n in {names!r} if n in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(REPO / "src"), "PATH": ""})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cli_import_loads_no_torch():
    heavy = ["torch", "transformers", "datasets", "numpy", "safetensors"]
    assert imported_modules("import specdraft.cli, specdraft.cli._surface", heavy) == []
    assert imported_modules("import specdraft.cli\nimport json", heavy + ["json"]) == ["json"]
