"""Shared test-building modules: planted-ground-truth models, architecture families, hostile inputs and the
checks several test files use. Imported as ``tests.helpers.NAME`` (pytest puts the repository root on sys.path:
``pythonpath`` in pyproject.toml)."""
