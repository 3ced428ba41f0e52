"""The security promises of docs/reliability.md, as tests.

1. An API key in the environment never reaches a file of the run directory, a log line or an
   error message (also when the server echoes it back in an error body).
2. ``trust_remote_code`` is never implied: a verifier or tokenizer that asks for its own code
   (``auto_map``) is refused naming ``--trust-remote-code``, and its code never runs.
3. Nothing is unpickled: every ``torch.load`` in ``src/`` passes ``weights_only=True``; no
   ``pickle``/``marshal``/``dill``/``joblib`` load, no ``numpy.load(allow_pickle=True)``.
4. No value from a data file becomes a path: sample ids like ``../../x`` stay inside the run
   directory's own file names (none is built from an id); ``builtin:`` names are names.
5. YAML is loaded only with ``yaml.safe_load`` (a ``!!python`` tag is refused, never run).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from malformed import write_lines
from specdraft.core.errors import ConfigError
from specdraft.generate.fakeserver import LoopbackServer, Reply

SRC = Path(__file__).resolve().parents[2] / "src" / "specdraft"
KEY = "sk-specdraft-planted-7f3a9c1e5b"
OPENAI_KEY = "sk-openai-env-planted-2d4b6f8a0c"


def _files_holding(root: Path, secret: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def _generate(cli, run_dir, prompts, url, *extra):
    return cli("generate", "--prompts", prompts, "--run-dir", run_dir, "--backend", "openai",
               "--endpoint", url, "--max-tokens", "4", "--api-key-env", "SPECDRAFT_TEST_KEY",
               *extra)


def test_api_key_is_sent_but_never_written_or_printed(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_TEST_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    prompts = write_lines(tmp_path / "p.jsonl", [{"question": "2+2?"}, {"question": "Hi"}])
    with LoopbackServer() as url:
        res = _generate(cli, tmp_path / "run", prompts, url)
    assert res.code == 0, res.err
    for secret in (KEY, OPENAI_KEY):
        assert _files_holding(tmp_path / "run", secret) == []
        assert secret not in res.out + res.err


def test_api_key_reaches_the_server(tmp_path, cli, monkeypatch):
    """The key is really used (so the test above proves it was in hand and kept out)."""
    monkeypatch.setenv("SPECDRAFT_TEST_KEY", KEY)
    prompts = write_lines(tmp_path / "p.jsonl", [{"question": "2+2?"}])
    srv = LoopbackServer()
    with srv as url:
        assert _generate(cli, tmp_path / "run", prompts, url).code == 0
    assert srv.authorizations and set(srv.authorizations) == {f"Bearer {KEY}"}


def test_a_server_echoing_the_key_in_errors_is_masked(tmp_path, cli, monkeypatch):
    """An endpoint that rejects the key and quotes it back (as some APIs do): the rejects,
    the manifest and the terminal show ``***``, never the key."""
    monkeypatch.setenv("SPECDRAFT_TEST_KEY", KEY)

    async def refuse(body):
        return Reply(status=401, body={"error": {"message": f"Incorrect API key: {KEY}"}})

    prompts = write_lines(tmp_path / "p.jsonl", [{"question": "2+2?"}])
    with LoopbackServer(refuse) as url:
        res = _generate(cli, tmp_path / "run", prompts, url, "--max-retries", "0")
    assert "Traceback" not in res.err
    assert _files_holding(tmp_path / "run", KEY) == []
    assert KEY not in res.out + res.err
    rejects = (tmp_path / "run/generate/rejects.jsonl")
    assert rejects.exists() and "Incorrect API key: ***" in rejects.read_text()


def _remote_code_dir(root: Path, *, tokenizer: bool = False) -> tuple[Path, Path]:
    """An HF directory whose config (or tokenizer config) asks for its own code; the code, if
    ever imported, writes ``ran.txt``."""
    d = root / "remote"
    d.mkdir()
    marker = root / "ran.txt"
    (d / "custom.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    cfg = {"model_type": "llama" if tokenizer else "specdraft_custom_model",
           "architectures": ["CustomForCausalLM"], "vocab_size": 10}
    if not tokenizer:
        cfg["auto_map"] = {"AutoConfig": "custom.CustomConfig",
                           "AutoModelForCausalLM": "custom.CustomForCausalLM"}
    (d / "config.json").write_text(json.dumps(cfg))
    if tokenizer:
        (d / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "CustomTokenizer",
             "auto_map": {"AutoTokenizer": ["custom.CustomTokenizer", None]}}))
    return d, marker


@pytest.mark.parametrize("tokenizer", [False, True], ids=["config_auto_map",
                                                          "tokenizer_auto_map"])
def test_remote_code_is_refused_naming_the_flag(tmp_path, cli, tokenizer):
    from specdraft.core.profile import load_hf_config
    from specdraft.core.verifier import load_tokenizer, load_verifier

    d, marker = _remote_code_dir(tmp_path, tokenizer=tokenizer)
    data = write_lines(tmp_path / "c.jsonl", [{"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}])
    for flag in ("--verifier", "--tokenizer"):
        err = cli("prepare", "--run-dir", tmp_path / "run", flag, d, "--data", data).error
        assert "--trust-remote-code" in err and str(d) in err, err
    loaders = [load_tokenizer, load_verifier] + ([] if tokenizer else [load_hf_config])
    for load in loaders:
        with pytest.raises(ConfigError, match="--trust-remote-code"):
            load(d)
    assert not marker.exists()


def test_remote_code_check_passes_with_the_flag_and_for_plain_models(tmp_path,
                                                                      tiny_verifier_dir):
    from specdraft.core.verifier import needs_remote_code, require_trust

    d, _ = _remote_code_dir(tmp_path)
    assert needs_remote_code(d) == [str(d / "config.json")]
    require_trust(d, True)  # given: not refused here (transformers then runs the code)
    assert needs_remote_code(tiny_verifier_dir) == []


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = (f"{getattr(f.value, 'id', getattr(f.value, 'attr', '?'))}.{f.attr}"
                    if isinstance(f, ast.Attribute) else getattr(f, "id", "?"))
            yield name, {k.arg: k.value for k in node.keywords}, node


def _source_calls():
    for path in sorted(SRC.rglob("*.py")):
        for name, kwargs, node in _calls(ast.parse(path.read_text(), str(path))):
            yield f"{path.relative_to(SRC)}:{node.lineno}", name, kwargs


UNPICKLERS = {"pickle.load", "pickle.loads", "pickle.Unpickler", "marshal.load",
              "marshal.loads", "dill.load", "dill.loads", "joblib.load", "cloudpickle.load",
              "cloudpickle.loads", "torch.jit.load"}
UNSAFE_YAML = {"yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all",
               "yaml.unsafe_load_all", "yaml.full_load_all"}


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def test_no_pickle_is_ever_loaded():
    """AST scan of src/: ``torch.load`` only with ``weights_only=True`` (a literal), no
    unpickling call, ``numpy.load`` never with ``allow_pickle=True``."""
    bad = []
    for where, name, kwargs in _source_calls():
        if name == "torch.load" and not _is_true(kwargs.get("weights_only")):
            bad.append(f"{where}: torch.load without weights_only=True")
        if name in UNPICKLERS:
            bad.append(f"{where}: {name}")
        if name in ("np.load", "numpy.load") and _is_true(kwargs.get("allow_pickle")):
            bad.append(f"{where}: {name}(allow_pickle=True)")
    assert bad == []


def test_yaml_is_only_loaded_safely_and_remote_code_never_hardcoded():
    bad = []
    for where, name, kwargs in _source_calls():
        if name in UNSAFE_YAML:
            bad.append(f"{where}: {name}")
        if _is_true(kwargs.get("trust_remote_code")):
            bad.append(f"{where}: trust_remote_code=True hard-coded")
    assert bad == []


def test_yaml_python_tags_are_refused_not_run(tmp_path, cli):
    marker = tmp_path / "ran.txt"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"prepare: !!python/object/apply:builtins.open [{str(marker)!r}, 'w']\n")
    err = cli("prepare", "--config", cfg, "--run-dir", tmp_path / "run").error
    assert str(cfg) in err and "not valid YAML" in err
    assert not marker.exists()


ESCAPING_IDS = ["../../escape", "/tmp/specdraft-escape", "a/../../escape", "..", "x\x00y",
                "C:\\escape", "~/escape"]


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_ids_from_data_never_become_paths(tmp_path, cli, smollm2_tokenizer_dir):
    """generate and prepare on rows whose ids are paths: every new file lies in the run
    directory and no file name carries an id."""
    work = tmp_path / "work"
    (work / "in").mkdir(parents=True)
    prompts = write_lines(work / "in/p.jsonl", [{"id": i, "question": f"Q{n}?"}
                                                for n, i in enumerate(ESCAPING_IDS)])
    convs = write_lines(work / "in/c.jsonl", [
        {"id": i, "messages": [{"role": "user", "content": f"Q{n}"},
                               {"role": "assistant", "content": "A"}]}
        for n, i in enumerate(ESCAPING_IDS)])
    before = _snapshot(tmp_path)
    with LoopbackServer() as url:
        res = cli("generate", "--prompts", prompts, "--run-dir", work / "run", "--backend",
                  "openai", "--endpoint", url, "--max-tokens", "4")
    assert res.code == 0, res.err
    res = cli("prepare", "--run-dir", work / "run2", "--tokenizer", smollm2_tokenizer_dir,
              "--data", convs, "--max-seq-len", "64")
    assert res.code == 0, res.err
    new = _snapshot(tmp_path) - before
    assert new and all(p.startswith(("work/run/", "work/run2/")) or p in ("work/run",
                                                                        "work/run2")
                       for p in new), sorted(new)
    assert not any("escape" in p or "\x00" in p for p in new)
    ids = [json.loads(x)["id"] for x in (work / "run/generate/samples.jsonl").read_text()
           .splitlines()]
    assert sorted(ids) == sorted(ESCAPING_IDS)  # kept as data, verbatim
    assert not Path("/tmp/specdraft-escape").exists()


def test_builtin_names_are_names_not_paths(tmp_path):
    from specdraft.core.assets import builtin_names, resolve_path

    (tmp_path / "secret.jsonl").write_text('{"question": "x"}\n')
    for name in ("../" * 30 + str(tmp_path / "secret").lstrip("/"), "../prompts/x"):
        with pytest.raises(ConfigError, match="no such built-in file"):
            resolve_path(f"builtin:{name}")
    assert all(resolve_path(f"builtin:{n}").exists() for n in builtin_names())
