"""The package version, in a module of its own so that any module can read it without importing the package."""

__version__ = "0.1.0"
