"""The headlens command line: click commands over the library (installed as headlens.cli)."""
