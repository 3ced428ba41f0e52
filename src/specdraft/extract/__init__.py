"""``specdraft extract``: the verifier's hidden states, captured by a documented convention.

Aux id ``i`` = HF ``hidden_states[i]`` = the input to decoder layer ``i`` (see
:data:`specdraft.core.capture.CONVENTION`). Rows are stored in sharded safetensors with an
index, and read back by training through :mod:`specdraft.artifacts.hidden_states`.
"""
