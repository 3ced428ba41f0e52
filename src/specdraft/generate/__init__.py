"""``specdraft generate``: regenerate assistant turns with the verifier, from an
OpenAI-compatible server (``openai`` backend) or in-process with ``transformers`` (``local``)."""
