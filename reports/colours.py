"""The report's one colour table: every figure that shows roles (the head map and its legend, the circuit
graphs, the role scatter plots) takes a role's colour from `role_colour`, so a role reads the same colour
everywhere. The colours themselves are the registry's (headlens.classify.kinds: each Kind's `colour`, one per
role, no two alike); the marks that are not roles are named here."""

from __future__ import annotations

from headlens.classify import kinds

ROLE_COLOURS = {kind.label: kind.colour for kind in kinds.KINDS}  # role -> "#rrggbb"
NO_ROLE = "#ffffff"  # a head with no role (head map)
UNLABELLED = "#dd8452"  # a head with a large direct effect and no role (circuit graphs)
OTHER = "#cccccc"  # any other head drawn in a graph
LOGITS = "#ffffff"  # the logits node of a circuit graph
SINK = "#000000"  # the first-token sink mark (a property, not a role)


def role_colour(role: str) -> str:
    """The colour of `role` in every figure (KeyError for a name that is not a role)."""
    return ROLE_COLOURS[role]
