"""The malformed-input suite: every reader and entry point gets inputs people really have.

Each case states its outcome and the test asserts it:

- refused: exit code 2, one ``specdraft: error:`` message naming the file and line (or the
  sample id, key or flag), no traceback, and nothing new under the stage's final names;
- counted: the run succeeds and the record is in the rejects file and the summary with its
  reason;
- accepted: input that is valid after all (a UTF-8 BOM, CRLF line ends) gives the same result
  as the plain file.

The CLI is run in-process through :func:`specdraft.cli.main`, the ``specdraft`` script's own
entry point (the error mapping lives there).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def error(self) -> str:
        """The error message (stderr), asserted to be one clean ``specdraft: error:`` report."""
        assert self.code == 2, f"exit {self.code}\nstdout: {self.out}\nstderr: {self.err}"
        assert "Traceback" not in self.err + self.out, self.err
        lines = [x for x in self.err.replace("\r", "\n").split("\n") if x.strip()]
        errors = [x for x in lines if x.startswith("specdraft: error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], self.err
        return errors[0].removeprefix("specdraft: error: ").strip()


@pytest.fixture
def cli(capsys):
    """``cli(*args) -> CliResult``: ``specdraft ARGS`` through the real entry point."""
    from specdraft.cli import main

    def invoke(*args: object) -> CliResult:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke


@pytest.fixture
def prepare_cli(cli, smollm2_tokenizer_dir):
    """``prepare_cli(run_dir, data, *args) -> CliResult``: ``specdraft prepare --data`` with the
    SmolLM2 tokenizer."""
    def go(run_dir, data, *args):
        return cli("prepare", "--run-dir", run_dir, "--tokenizer", smollm2_tokenizer_dir,
                   "--data", data, *args)
    return go
