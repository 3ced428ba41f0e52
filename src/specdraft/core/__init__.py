"""Plumbing shared by every stage: atomic writes, manifests, JSONL, run directories, verifiers."""
