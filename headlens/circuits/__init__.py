"""Circuits: how heads work together.

- `tasks`: the induction and IOI tasks, where their metric reads the logits, and their corrupted runs;
- `direct`: every head's direct effect on a task's metric through the logits, adding up with the rest
  (embeddings, MLPs, biases) to the metric (`decompose`, internal: the other modules' building block,
  returning a `Decomposition` of tensors rather than a result);
- `selfrepair`: an ablated set's total effect, its own direct effect and the other heads' compensation
  (the Hydra effect, McGrath et al. 2023);
- `composition`: Q-, K- and V-composition scores of every (earlier sender, later receiver) pair,
  read from the weights (Elhage et al. 2021), each against the scores random matrices of the
  same shapes give;
- `paths`: exact path patching, the effect of one sender on the metric through one receiver's
  query, key or value input, or directly through the logits (Wang et al. 2022; Goldowsky-Dill
  et al. 2023);
- `attribution`: every edge at once from gradients, EAP (Syed et al. 2023) and EAP-IG (Hanna et
  al. 2024), and its agreement with exact path patching;
- `backups`: the heads that make up for a role's heads when those are ablated (backup name movers), each
  with its compensation, a p-value against random head sets, and a detector from the weights scored by ROC-AUC;
- `circuit`: one task's circuit, its heads, edges and self-repair in one result;
- `graph`, `graphrun`, `readout`, `faithfulness`, `discover`: the whole model's graph (input, heads with q/k/v
  inputs, MLPs, logits), runs with each input built edge by edge, every edge scored by exact patching, EAP or
  EAP-IG, and the circuit found on it with its faithfulness (MIB), curve, CPR, CMD and stability;
- `moretasks`: Greater-than and a user's JSONL task; `interchange`: the EAP-IG/MIB graph JSON.
Every measurement (self_repair, composition_scores, path_patch, edge_attribution, circuit) returns a
headlens.Result (headlens.results). Every edge table is long-form: `sender` ("L.H"), `receiver` ("L.H" or
"logits"), `via` ("q", "k", "v", "direct"), `composition`, `effect`, `attribution` (NaN where not measured).

Public names are imported when first asked for (headlens.lazy.lazy_getattr, PEP 562).
"""

from __future__ import annotations

from headlens.lazy import lazy_getattr

# Public name -> the module of headlens.circuits that defines it, imported on first access.
LAZY = {
    "Task": "tasks",
    "find_backups": "backups",
    "discover": "discover",
    "GraphTask": "faithfulness",
    "induction_task": "tasks",
    "ioi_task": "tasks",
    "make_task": "tasks",
    "self_repair": "selfrepair",
}

__getattr__ = lazy_getattr(__name__, LAZY)

__all__ = sorted(LAZY)
