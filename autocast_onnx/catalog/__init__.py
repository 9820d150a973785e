"""Rule catalog: loads and validates the rule files of rules/ and the user's --rules files."""

from .loader import CATEGORIES, NodeRule, OpRule, Pin, RuleSet, Source, default_rules_path, load_rules

__all__ = ["CATEGORIES", "NodeRule", "OpRule", "Pin", "RuleSet", "Source", "default_rules_path", "load_rules"]
