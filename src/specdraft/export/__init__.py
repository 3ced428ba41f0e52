"""``specdraft export``: write a trained drafter in the format vLLM, SGLang or speculators loads."""
