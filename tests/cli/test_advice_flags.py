"""Every ``--flag`` specdraft's own text names (error advice, notices, help, docstrings) exists:
it is one of the CLI surface's flags (tests/cli/cli_surface.txt) or a flag of the outside tool
it is said for (listed below with the tool). An error that advises a flag the command does not
have (eval once said "pass --resume") fails here, naming the file and line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")

#: Flags of other tools that specdraft's text names, with the tool.
OUTSIDE = {
    "--help": "typer (every verb)", "--flag": "the placeholder of cli/common.py's docs",
    "--no-deps": "pip", "--nproc-per-node": "torchrun", "--nnodes": "torchrun",
    "--rdzv-": "torchrun (--rdzv-* flags)", "--host": "sglang.launch_server",
    "--port": "sglang.launch_server / vllm serve", "--model-path": "sglang.launch_server",
    "--speculative-algorithm": "sglang", "--speculative-draft-model-path": "sglang",
    "--speculative-eagle-topk": "sglang", "--speculative-num-steps": "sglang",
    "--speculative-num-draft-tokens": "sglang", "--speculative-config": "vllm serve",
    "--kv-transfer-config": "vllm serve", "--no-enable-prefix-caching": "vllm serve",
    "--enforce-eager": "vllm serve", "--max-num-seqs": "vllm serve",
    "--attention-backend": "vllm serve",
    "--model": "vllm.entrypoints.openai.api_server (the printed serve line)",
}


def surface_flags() -> set[str]:
    flags = set()
    for line in (ROOT / "tests" / "cli" / "cli_surface.txt").read_text().splitlines():
        cols = line.split("  ")
        if len(cols) > 1:
            flags.update(FLAG.findall(cols[1]))
    return flags


def named_flags(tree: ast.AST) -> list[tuple[int, str]]:
    return [(node.lineno, flag) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            for flag in FLAG.findall(node.value)]


def test_every_flag_specdraft_names_exists():
    known = surface_flags() | set(OUTSIDE)
    unknown = [f"{path.relative_to(ROOT)}:{line}: {flag}"
               for path in sorted((ROOT / "src" / "specdraft").rglob("*.py"))
               for line, flag in named_flags(ast.parse(path.read_text()))
               if flag not in known]
    assert not unknown, "flags named but not on any CLI surface:\n" + "\n".join(unknown)


def test_the_check_catches_an_advised_flag_that_does_not_exist():
    planted = ast.parse('raise StageDirError("pass --resume-from-eval to continue")')
    assert named_flags(planted) == [(1, "--resume-from-eval")]
    assert "--resume-from-eval" not in surface_flags() | set(OUTSIDE)
