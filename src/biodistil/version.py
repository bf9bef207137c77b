"""biodistil's version, in a module of its own that imports nothing: a run's provenance (`training`) reads it without
importing the package's front (`biodistil/__init__.py`), which stands above every layer."""

__version__ = "0.1.0"
