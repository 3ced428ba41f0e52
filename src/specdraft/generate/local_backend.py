"""The ``local`` backend: batched ``transformers`` generation on the verifier, no server.

Prompts are rendered with the run's :class:`~specdraft.core.chat.ChatFormat` (the template,
``add_generation_prompt=True``, its ``chat_template_kwargs``, the conversation's ``tools``,
history reasoning and tool calls handed to the template as prepare hands them), left-padded
so every row's last prompt token sits at the same position, and decoded greedily when ``temperature == 0`` (else sampled with ``temperature``/``top_p``).
The completion ids kept are those the model emitted up to and including its first stop token,
exactly like vLLM's ``token_ids``. There is no tool-call parser here: a call the verifier writes
stays in ``content`` as the text it generated (its ids are kept verbatim, and the template
renders that text back in later turns as it was generated).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from specdraft.core.chat import ChatFormat, generation_stop_ids, message_for_template
from specdraft.generate.client import TurnOutput


def cut_at_stop(ids: list[int], stops: list[int]) -> tuple[list[int], str]:
    """``(ids up to and including the first stop id, finish_reason)``: ``"stop"`` when a stop id
    was emitted, else ``"length"``."""
    for i, t in enumerate(ids):
        if t in stops:
            return ids[: i + 1], "stop"
    return ids, "length"


class LocalBackend:
    """Generates with an already-loaded ``model`` (``AutoModelForCausalLM``, eval mode) and its
    ``tokenizer``, so a pipeline that loads the verifier once can reuse it.

    ``name`` is recorded as the sample's ``model``.
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None,
                 chat_format: ChatFormat | None = None, name: str | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.chat_format = chat_format or ChatFormat.resolve(
            tokenizer, kwargs=chat_template_kwargs)
        self.name = name or str(getattr(model, "name_or_path", "") or "local")
        self.stops = generation_stop_ids(model, tokenizer, self.chat_format)
        if not self.stops:
            raise ValueError("the verifier has no eos token id: cannot tell when a turn ends")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
            else self.stops[0]
        self.endpoint = f"local:{model.device}"

    @classmethod
    def load(cls, verifier: str, *, device: str = "cpu", dtype: str = "auto",
             **kwargs: Any) -> "LocalBackend":
        """Load the verifier (HF dir, ``.gguf`` or ``"smollm2"``) via
        :mod:`specdraft.core.verifier`; ``kwargs`` go to the constructor."""
        from specdraft.core.verifier import load_tokenizer, load_verifier

        model = load_verifier(verifier, dtype=dtype, device=device)
        tok = load_tokenizer(verifier)
        return cls(model, tok, name=kwargs.pop("name", None) or Path(str(verifier)).name,
                   **kwargs)

    def render(self, messages: list[dict[str, Any]], tools: list | None = None) -> str:
        """The prompt text of ``messages`` (and ``tools``, for the template's tool listing) with
        the generation prompt appended."""
        fmt = self.chat_format
        return fmt.renderer(self.tokenizer).render(
            [message_for_template(m) for m in messages], tools=tools, kwargs=fmt.kwargs,
            add_generation_prompt=True)

    @property
    def context(self) -> int | None:
        """The verifier's context in tokens (``max_position_embeddings`` of its text config),
        None when its config does not say."""
        config = getattr(self.model, "config", None)
        config = getattr(config, "text_config", None) or config
        value = getattr(config, "max_position_embeddings", None)
        return value if isinstance(value, int) and value > 0 else None

    def count_tokens(self, messages: list[dict[str, Any]], *,
                     tools: list | None = None) -> int | None:
        """Tokens of the prompt :meth:`generate` would feed for ``messages`` (None when the
        template cannot render them: :meth:`generate` then says why)."""
        from specdraft.core.chat import TemplateError

        try:
            text = self.render(messages, tools)
        except TemplateError:
            return None
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, conversations: list[list[dict[str, Any]]],
                 tools: list[list | None] | None = None) -> list[TurnOutput]:
        """One assistant turn for each conversation, as a single left-padded batch; ``tools``:
        each conversation's tool list (or None)."""
        import torch

        tools = tools or [None] * len(conversations)
        texts = [self.render(c, t) for c, t in zip(conversations, tools)]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, padding_side="left",
                             add_special_tokens=False).to(self.model.device)
        t0 = time.perf_counter()
        if self.seed is not None:
            torch.manual_seed(self.seed)
        with torch.inference_mode():
            out = self.model.generate(**enc, **self._gen_kwargs())  # [B, T_prompt + T_new]
        latency = (time.perf_counter() - t0) / len(texts)
        new = out[:, enc["input_ids"].shape[1]:].tolist()  # [B, T_new]
        prompts = [row[m.bool()].tolist() for row, m in zip(enc["input_ids"],
                                                             enc["attention_mask"])]
        return [self._output(ids, p, latency) for ids, p in zip(new, prompts)]

    def _gen_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"max_new_tokens": self.max_tokens, "eos_token_id": self.stops,
                              "pad_token_id": self.pad_id}
        if self.temperature > 0:
            kw.update(do_sample=True, temperature=self.temperature, top_p=self.top_p)
        else:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        return kw

    def _output(self, ids: list[int], prompt_ids: list[int], latency: float) -> TurnOutput:
        ids, finish = cut_at_stop(ids, self.stops)
        body = ids[:-1] if finish == "stop" else ids
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                 "total_tokens": len(prompt_ids) + len(ids)}
        return TurnOutput(message={"role": "assistant", "content": text}, finish_reason=finish,
                          usage=usage, completion_token_ids=ids, prompt_token_ids=prompt_ids,
                          latency_s=round(latency, 4), endpoint=self.endpoint, model=self.name)
