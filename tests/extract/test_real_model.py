"""16 GSM8K samples through the real SmolLM2-135M-Instruct verifier (GGUF), --verify 4."""

from __future__ import annotations

import json

import pytest

from specdraft.extract.config import ExtractConfig
from specdraft.extract.run import run
from specdraft.artifacts.hidden_states import DiskSource, load_verifier_head

from extract_helpers import write_prepared


def gsm8k_rows(shared_data, tokenizer_dir, n=16):
    """Prompt tokens (mask 0) + answer tokens and <|im_end|> (mask 1), SmolLM2 chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    lines = (shared_data / "gsm8k" / "test.jsonl").read_text().splitlines()[:n]
    ids, masks = [], []
    for line in lines:
        rec = json.loads(line)
        prompt = tok.apply_chat_template([{"role": "user", "content": rec["question"]}],
                                         add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        answer = tok(rec["answer"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
        ids.append(prompt + answer)
        masks.append([0] * len(prompt) + [1] * len(answer))
    return ids, masks


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smollm2_gsm8k_verify_clean(tmp_path, shared_data, smollm2_tokenizer_dir):
    ids, masks = gsm8k_rows(shared_data, smollm2_tokenizer_dir)
    run_dir = write_prepared(tmp_path / "run", ids, masks)
    m = run(ExtractConfig(run_dir=run_dir, verifier="smollm2", verify=4, batch_tokens=2048))
    assert m["n_layers"] == 30 and m["hidden_size"] == 576
    assert m["aux_layer_ids"] == [2, 15, 27]
    assert m["verify"]["ok"] and m["verify"]["n"] == 4, m["verify"]
    assert m["counts"]["supervised_tokens"] == sum(sum(x[1:]) for x in masks)
    rows = DiskSource(run_dir / "extract").get_batch([0])
    head = load_verifier_head(run_dir / "extract")
    assert head["lm_head.weight"].shape == (49152, 576)
    # the verifier's greedy prediction from final_hidden: mostly the GSM8K answer's next token?
    logits = rows[0].final_hidden @ head["lm_head.weight"].float().T  # [n_sup, V]
    targets = rows[0].input_ids[rows[0].target_positions + 1]
    assert (logits.argmax(-1) == targets).float().mean() > 0.3
