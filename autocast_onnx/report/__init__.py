"""Reports: human-readable summaries of conversions (text)."""

from .summary import conversion_summary, summary_dict

__all__ = ["conversion_summary", "summary_dict"]
