"""Per-head scores, one module per head kind. Score functions take tensors and return tensors."""
