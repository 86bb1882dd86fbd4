"""The package's version, on the ground floor: the report and the HTML pages stamp it, and the
package's ``__init__`` (the API, the top of the import graph) re-exports it, so that no module
below reaches up to ``diagnose/__init__.py`` for it. pyproject.toml holds the same number."""

__version__ = "0.1.0"
