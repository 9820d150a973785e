"""The package's version, in a leaf module that every layer may import."""

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)
