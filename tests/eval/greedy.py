"""The independent reference for eval tests: plain greedy decoding without any cache."""

import torch


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    """The verifier's next ``n`` greedy tokens after ``prompt``, one full forward per token."""
    ids = torch.tensor(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids = torch.cat([ids, model(input_ids=ids[None]).logits[0, -1].argmax().view(1)])
    return ids[len(prompt):].tolist()
