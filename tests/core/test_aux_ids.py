"""Every aux-id convention of :mod:`specdraft.core.aux_ids`, round trip, by hand-computed values.

Planted (by hand, undone): the DFlash writer as ``a`` instead of ``a - 1``, the SGLang reader
without its ``+ 1``, and the extraction capture without ``N``: each fails a test below.
"""

import ast
from pathlib import Path

import pytest

from specdraft.core import aux_ids
from specdraft.core.aux_ids import CONVENTIONS, from_convention, to_convention
from specdraft.core.errors import ConfigError

N = 32  # a 32-layer verifier; valid HF aux ids are 1..31

#: (convention, HF ids, spelled in the convention): each value computed by hand from the rule.
SPELLED = [
    ("hf", [2, 16, 29], [2, 16, 29]),
    ("vllm", [2, 16, 29], [2, 16, 29]),            # identity: id j = input to layer j
    ("vllm", [1, 5, 31], [1, 5, 31]),
    ("sglang", [2, 16, 29], [1, 15, 28]),          # first id 2: written - 1, read + 1
    ("sglang", [3, 10, 20], [3, 10, 20]),          # other first id: as-is both ways
    ("sglang_legacy", [2, 16, 29], [1, 15, 28]),   # legacy reads every id + 1
    ("extract_capture", [2, 16, 29], [2, 16, 29, 32]),   # aux ids and N
    ("extract_capture", [29, 2, 16], [2, 16, 29, 32]),   # sorted, as vLLM keeps them
    ("dflash", [2, 16, 29], [1, 15, 28]),          # layer-output ids: a - 1
    ("dflash", [1, 3, 4], [0, 2, 3]),
]


@pytest.mark.parametrize("name,hf,spelled", SPELLED)
def test_each_convention_spells_and_reads_back(name, hf, spelled):
    assert to_convention(name, hf, n_layers=N) == spelled
    assert from_convention(name, spelled, n_layers=N) == sorted(hf)


def test_every_row_names_its_engine_source_and_round_trips_the_default():
    default = [2, N // 2, N - 3]  # [2, 16, 29]: read back identically by every row
    assert set(CONVENTIONS) == {"hf", "vllm", "sglang", "sglang_legacy", "extract_capture",
                                "dflash"}
    for name, row in CONVENTIONS.items():
        assert row.source and ".py" in row.source, name
        assert from_convention(name, to_convention(name, default, n_layers=N),
                               n_layers=N) == default, name


def test_sglang_documented_holes():
    """The two places SGLang's rules do not round trip, as the module says: a first id of 1 has
    no current spelling (read back as 2..), and for a first id other than 2 the legacy rule
    reads every id one layer later."""
    assert to_convention("sglang", [1, 5, 9]) == [1, 5, 9]
    assert from_convention("sglang", [1, 5, 9]) == [2, 6, 10]
    assert from_convention("sglang_legacy", to_convention("sglang_legacy", [3, 10, 20])) == \
        [4, 11, 21]


def test_named_helpers_equal_the_table():
    assert aux_ids.hf_to_sglang_ids([2, 4, 5]) == [1, 3, 4]
    assert aux_ids.sglang_capture_hf_ids([1, 3, 4]) == [2, 4, 5]
    assert aux_ids.sglang_legacy_capture_hf_ids([1, 3, 4]) == [2, 4, 5]
    assert aux_ids.extraction_capture_ids((3, 1, 4), 4) == [1, 3, 4]  # N already an id
    assert aux_ids.aux_from_extraction_capture([1, 3, 4, 6], 6) == [1, 3, 4]
    assert aux_ids.hf_to_dflash_target_ids([2, 4, 5]) == [1, 3, 4]
    assert aux_ids.dflash_target_to_hf_ids([1, 3, 4]) == [2, 4, 5]


def test_unknown_convention_and_missing_layer_count_are_named():
    with pytest.raises(ConfigError, match="'eagle': expected one of"):
        to_convention("eagle", [2])
    with pytest.raises(ConfigError, match="n_layers"):
        to_convention("extract_capture", [2, 3])


def test_no_other_module_defines_an_aux_id_conversion():
    """The conversions are defined once: no function of these names anywhere else in src/."""
    names = {"hf_to_vllm_ids", "hf_to_sglang_ids", "sglang_capture_hf_ids",
             "sglang_legacy_capture_hf_ids", "vllm_capture_hf_ids", "engine_layer_ids",
             "extraction_capture_ids", "hf_to_dflash_target_ids", "dflash_target_to_hf_ids"}
    src = Path(aux_ids.__file__).resolve().parents[1]
    found = []
    for path in src.rglob("*.py"):
        if path.name == "aux_ids.py" and path.parent.name == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in names:
                found.append(f"{path.relative_to(src)}:{node.lineno} {node.name}")
    assert found == []
