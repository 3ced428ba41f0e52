"""specdraft: train EAGLE-3 draft models for speculative decoding, end to end.

Each pipeline stage lives in its own package with the same layout (``config.py`` with its
settings, ``run.py`` with ``run(config) -> manifest``):

    generate -> prepare -> vocab -> extract -> train -> export -> eval   (+ doctor)

Shared plumbing (atomic writes, manifests, JSONL, run directories, verifier loading) is in
:mod:`specdraft.core`; the draft architecture is in :mod:`specdraft.models.eagle3`.
"""

__version__ = "0.1.0"
