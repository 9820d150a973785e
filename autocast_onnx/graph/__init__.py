"""Graph index: producers, consumers, scopes (subgraphs) and tensor types of a model."""

from .index import NONTENSOR, GraphIndex, Node, Scope, Value, build_index

__all__ = ["NONTENSOR", "GraphIndex", "Node", "Scope", "Value", "build_index"]
