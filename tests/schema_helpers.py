"""The check every report schema of docs/ is held to (docs/validate-report.schema.json,
docs/lint-report.schema.json, docs/check-report.schema.json): one walk of the whole schema."""

from __future__ import annotations


def assert_schema_documented_and_closed(node, where: str = "schema") -> None:
    """Walk a JSON schema (dicts and lists, every level): every object that lists `properties`
    allows no other properties (`additionalProperties: false`) and requires every one of them,
    and every property has a description. The assertion names the place, e.g. `schema.$defs.x`."""
    if isinstance(node, dict):
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{where} allows other properties"
            assert set(node["required"]) == set(node["properties"]), f"{where}: not every key is required"
        for name, sub in node.get("properties", {}).items():
            assert sub.get("description"), f"{where}.{name} has no description"
        for key, sub in node.items():
            assert_schema_documented_and_closed(sub, f"{where}.{key}")
    elif isinstance(node, list):
        for k, sub in enumerate(node):
            assert_schema_documented_and_closed(sub, f"{where}[{k}]")
