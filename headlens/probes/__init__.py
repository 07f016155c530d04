"""Probes: the inputs every scoring pass reads, and nothing else. `inputs` holds the natural text (the held-out
text we ship, or the user's), its windows, repeated random tokens and the needle-in-a-haystack sets; `corpus`
reads a user's text file, folder or JSON Lines corpus; `treebank` reads the CoNLL-U sample of the syntactic
probe. The runs that score heads on them live in headlens.classify.runs."""
