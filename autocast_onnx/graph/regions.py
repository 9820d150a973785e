"""Connected regions of nodes: the fp32 islands of a plan, the nodes a runtime lacks kernels for."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def regions(ids: Iterable[int], joined: Callable[[int], Iterable[int]]) -> list[list[int]]:
    """The connected regions of `ids` (node ids), where `joined(i)` names the ids node i is joined to
    (only members count), each region in the order of `ids`, the regions in the order of their first member."""
    members = list(ids)
    parent = {i: i for i in members}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in members:
        for j in joined(i):
            if j in parent:
                a, b = root(i), root(j)
                if a != b:
                    parent[b] = a
    out: dict[int, list[int]] = {}
    for i in members:
        out.setdefault(root(i), []).append(i)
    return list(out.values())
