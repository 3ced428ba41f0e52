"""No deprecation warning from specdraft's own calls (issue 40: transformers said "`torch_dtype`
is deprecated! Use `dtype` instead!" on every verifier load). transformers says it through its
logger, once per process, so the test clears that once-cache and listens to the logger; Python
warnings attributed to specdraft's modules are errors for the whole suite (pyproject.toml
``filterwarnings``)."""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src" / "specdraft")


def test_loading_and_identifying_a_verifier_warns_nothing(tiny_verifier_dir, tmp_path):
    from specdraft.core.profile import load_hf_config
    from specdraft.core.verifier import load_tokenizer, load_verifier
    from specdraft.core.verifier_identity import identify

    verifier = tmp_path / "v"
    shutil.copytree(tiny_verifier_dir, verifier)
    cfg = json.loads((verifier / "config.json").read_text())
    for key in ("dtype", "torch_dtype"):   # as a GGUF's config reads: no dtype recorded
        cfg.pop(key, None)
    (verifier / "config.json").write_text(json.dumps(cfg))
    logging.Logger.warning_once.cache_clear()  # transformers' once-per-process cache
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append          # type: ignore[method-assign]
    logging.getLogger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_verifier(str(verifier), dtype="float32")
            load_tokenizer(str(verifier))
            load_hf_config(str(verifier))
            ident = identify(str(verifier))
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert ident["dtype"] is None
    said = [r.getMessage() for r in records if "deprecat" in r.getMessage().lower()]
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
            if issubclass(w.category, (DeprecationWarning, FutureWarning))
            and w.filename.startswith(SRC)]
    assert said == [] and ours == []


def test_the_suite_fails_on_a_deprecation_from_our_modules():
    import tomllib

    conf = tomllib.loads((Path(SRC).parents[1] / "pyproject.toml").read_text())
    filters = conf["tool"]["pytest"]["ini_options"]["filterwarnings"]
    assert "error::DeprecationWarning:specdraft" in filters
    assert "error::FutureWarning:specdraft" in filters
    assert filters.index("error::DeprecationWarning:specdraft") > \
        filters.index("ignore::DeprecationWarning")  # a later entry wins
