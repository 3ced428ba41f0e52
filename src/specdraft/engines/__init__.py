"""The serving engines (vLLM, SGLang) as specdraft drives them: interpreters, the one launcher
of their processes, the worker import policy, errors, counters, the verifier directory they
load and serve commands (docs/architecture.md). Engine code runs in the engine's own
interpreter; nothing here imports an engine."""
