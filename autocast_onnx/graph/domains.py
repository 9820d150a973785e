"""Op domains: the one place where the default ONNX domain's two spellings are told apart."""

from __future__ import annotations


def normalize_domain(domain: str) -> str:
    """The domain with the default ONNX domain as "" however it is spelled ("" or "ai.onnx"): the
    one place the two spellings are told apart; the graph index stores node domains normalised."""
    return "" if domain in ("", "ai.onnx") else domain
