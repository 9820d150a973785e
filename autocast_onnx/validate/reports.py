"""The base of the typed results over a JSON report (ValidationReport, DiagnoseReport): a
read-only mapping over the report's dict, with `to_dict()`; each subclass adds its properties,
its `text()` and its repr."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class JsonReport(Mapping):
    """A read-only mapping over one JSON report (`data`, as `--report-json` writes it)."""

    data: dict = field(repr=False)

    def to_dict(self) -> dict:
        return self.data

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self):
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)
