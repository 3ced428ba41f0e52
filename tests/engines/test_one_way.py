"""One way to run an engine (issue 36 item 2): one worker import policy, no engine process
started outside ``engines/``, no import cycle between the engine callers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from specdraft.engines.worker import PATH_DIR, specdraft_path, worker_command, worker_env

SRC = Path(__file__).resolve().parents[2] / "src" / "specdraft"
#: Processes that are not engines: ``git rev-parse`` for the provenance record.
NOT_ENGINES = {"core/manifest.py"}


def test_both_workers_import_with_nothing_but_the_stdlib_and_specdraft(tmp_path):
    """Both workers and what they share load in a python without site-packages (``-S``) under
    the worker environment, and pull in no heavy library: what the engine's venv offers
    (stdlib, torch, vllm) is all they need, and specdraft comes from the one path."""
    code = ("import sys, specdraft.eval.engine_worker as e, specdraft.extract.vllm_worker as x\n"
            "heavy = {'torch', 'transformers', 'pydantic', 'httpx', 'numpy', 'safetensors'}\n"
            "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}),\n"
            "      e.attention_kwargs is x.attention_kwargs, e.counters.__module__)\n")
    done = subprocess.run([sys.executable, "-S", "-c", code], env=worker_env(tmp_path),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "True", "specdraft.eval.engine_worker"]


def test_the_path_holds_only_specdraft(tmp_path):
    """A checkout's src/ is used as is; a package beside other libraries (a wheel in
    site-packages) gets a directory of its own with one symlink, made once."""
    here = Path(specdraft_path(tmp_path))
    assert here == SRC.parent
    assert {p.name for p in here.iterdir() if not p.name.endswith(".egg-info")
            and p.name != "__pycache__"} == {"specdraft"}
    site = tmp_path / "site"
    (site / "specdraft").mkdir(parents=True)
    (site / "transformers").mkdir()
    got = Path(specdraft_path(tmp_path / "scratch", site / "specdraft"))
    assert got == tmp_path / "scratch" / PATH_DIR
    assert [p.name for p in got.iterdir()] == ["specdraft"]
    assert (got / "specdraft").resolve() == (site / "specdraft").resolve()
    assert specdraft_path(tmp_path / "scratch", site / "specdraft") == str(got)  # again: same
    assert worker_env(tmp_path, {"PYTHONPATH": "/elsewhere", "A": "1"}, B="2") == {
        "PYTHONPATH": str(SRC.parent), "A": "1", "B": "2"}
    assert worker_command("py", "specdraft.m", "a") == ["py", "-m", "specdraft.m", "a"]


def process_starters(src: Path = SRC) -> list[str]:
    """``file:line`` of every ``subprocess`` import outside ``engines/`` and :data:`NOT_ENGINES`
    (how a process is started: Popen, run, call, check_output all need it)."""
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.startswith("engines/") or rel in NOT_ENGINES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) else [])
            if "subprocess" in names:
                found.append(f"{rel}:{node.lineno}")
    return found


def test_no_process_is_started_outside_engines(tmp_path):
    assert process_starters() == []
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "sglang.py").write_text(
        "def version(py):\n    import subprocess\n    return subprocess.run([py])\n")
    assert process_starters(tmp_path) == ["eval/sglang.py:2"]  # planted: the old version probe


def import_cycles(src: Path = SRC) -> list[list[str]]:
    """The strongly connected components (more than one module) of specdraft's import graph,
    function-level imports included."""
    def name(p: Path) -> str:
        parts = p.relative_to(src.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    mods = {name(p): p for p in src.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                deps |= {m for m in [node.module] + [f"{node.module}.{a.name}"
                                                     for a in node.names] if m in mods}
        graph[mod] = deps - {mod}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    comps = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def test_engine_callers_import_no_cycle(tmp_path):
    rooms = ("specdraft.engines", "specdraft.eval", "specdraft.extract")
    assert [c for c in import_cycles() if any(m.startswith(rooms) for m in c)] == []
    pkg = tmp_path / "specdraft"
    (pkg / "eval").mkdir(parents=True)
    for mod, body in {"engine": "def f():\n    from specdraft.eval.run import drafter_dir\n",
                      "run": "from specdraft.eval.sglang import x\n",
                      "sglang": "from specdraft.eval.engine import f\n", "config": ""}.items():
        (pkg / "eval" / f"{mod}.py").write_text(body)
    assert import_cycles(pkg) == [["specdraft.eval.engine", "specdraft.eval.run",
                                   "specdraft.eval.sglang"]]  # planted: the cycle this broke
