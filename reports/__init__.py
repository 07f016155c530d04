"""HTML reports: DataFrames in, one self-contained HTML file out (installed as headlens.reports)."""
