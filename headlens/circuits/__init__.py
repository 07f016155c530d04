"""Circuits: how heads work together.

- `composition`: Q-, K- and V-composition scores of every (earlier sender, later receiver) pair,
  read from the weights (Elhage et al. 2021), each against the scores random matrices of the
  same shapes give;
- `paths`: exact path patching, the effect of one sender on the metric through one receiver's
  query, key or value input, or directly through the logits (Wang et al. 2022; Goldowsky-Dill
  et al. 2023);
- `attribution`: every edge at once from gradients, EAP (Syed et al. 2023) and EAP-IG (Hanna et
  al. 2024), and its agreement with exact path patching.
Every result is a long-form DataFrame of edges: `sender` ("L.H"), `receiver` ("L.H" or "logits"),
`via` ("q", "k", "v", "direct"), `composition`, `effect`, `attribution` (NaN where not measured).
"""
