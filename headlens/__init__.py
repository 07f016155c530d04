"""headlens: what does each attention head of a GPT-2-family model do?

Library first: load -> capture -> score/classify -> ablate -> report, each a module.
"""

__version__ = "0.1.0"

from headlens.errors import HeadlensError  # noqa: E402
from headlens.heads import Head, all_heads, parse_heads  # noqa: E402

__all__ = ["Head", "HeadlensError", "__version__", "all_heads", "parse_heads"]
