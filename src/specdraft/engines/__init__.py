"""The serving engines (vLLM, SGLang) as specdraft drives them: interpreters, processes, errors,
counters and serve commands (docs/architecture.md). Engine code runs in the engine's own
interpreter; nothing here imports an engine."""
