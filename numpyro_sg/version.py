"""The package version, in a module of its own so that any module can read it without
importing the package ``__init__`` (which imports everything else)."""

__version__ = "0.1.0"
