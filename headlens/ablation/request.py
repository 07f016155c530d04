"""One ablation run as one value (`AblateSpec`) and its one entry point (`run_ablation`).

`AblateSpec` holds everything `headlens ablate` is asked: the heads (explicit heads, a role, `all`, or
`each`: every head alone), the method, the evaluation set (headlens.intervene.evalspec.EvalSpec), the
gradient estimate and its checks, the sweep's folder, the control sets, the batch size and the seed.
`AblateSpec.parse` reads them as the command line spells them and checks each value and every
combination of them (one ConfigError naming the flags), before any model is loaded. `run_ablation`
then runs it: heads together (ablate_heads), every head alone (sweep_heads) or every head estimated
from gradients (approx_sweep with its agreement check), each a headlens Result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from headlens import distributed
from headlens.ablation.ablate import ablate_heads, sweep_heads
from headlens.bounds import MAX_HEADS, MAX_LAYERS
from headlens.classify.roles import EACH, resolve_heads, role_name
from headlens.errors import ConfigError
from headlens.heads import Head, all_heads, parse_heads
from headlens.intervene.evalspec import DEFAULT_TOKENS, IOI, SWEEP_TOKENS, EvalSpec
from headlens.intervene.stats import parse_control
from headlens.results import Result

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

Say = Callable[[str], None]  # where a run's notes go (the command line: one line on stderr each)


@dataclass(frozen=True)
class AblateSpec:
    """What one ablation run is asked (see the module docstring); `parse` builds and checks one."""

    heads: str  # "3.4,5.1", "layer:3", `all`, a role, or `each` (every head alone)
    method: str = "zero"  # headlens.intervene.metrics.METHODS
    evaluation: EvalSpec = field(default_factory=EvalSpec)  # what the ablation is measured on
    seed: int = 0  # bootstrap, probes, resampling, control sets
    control: int = 0  # K random head sets of the same per-layer counts (0: none)
    approx: str | None = None  # estimate every single-head delta: atp | atp* (headlens.ablation.approx)
    check: bool = False  # with approx: also the exact sweep, and their agreement
    graddrop: bool = False  # with approx: AtP*'s GradDrop score
    out_dir: str | None = None  # the sweep's folder (rows appended as they finish)
    resume: bool = False  # continue the sweep found in out_dir
    batch_size: int | str | None = None  # sequences per forward pass, "auto", or None (the library's)
    labels: dict | None = None  # Head -> labels for a role (None: classify the model)
    why: str | None = None  # why the metric was chosen (evalspec.choose_metric), to say before the run

    @property
    def each(self) -> bool:
        return self.heads.strip().lower() == EACH

    @property
    def role(self) -> str | None:
        return None if self.each else role_name(self.heads)

    @classmethod
    def parse(
        cls,
        heads: str,
        method: str = "zero",
        metric: str | None = None,
        *,
        tokens: Any = None,
        control: str | None = None,
        prompts: Any = None,
        **given: Any,
    ) -> AblateSpec:
        """An AblateSpec from the command line's values: `metric` None is the role's own (or loss),
        `tokens` a budget or `all` (None: DEFAULT_TOKENS, SWEEP_TOKENS for `each`, every token with
        approx), `control` "random:K"; the evaluation set's `text`, `reference` and `bos`, and the
        other fields, by keyword. ConfigError for a bad value or a combination that cannot run."""
        data = {key: given.pop(key) for key in ("text", "reference", "bos") if key in given}
        each = heads.strip().lower() == EACH
        role = None if each else role_name(heads)
        if not each and role is None:
            parse_heads(heads, MAX_LAYERS, MAX_HEADS)  # malformed heads fail before a model loads
        default = None if given.get("approx") else SWEEP_TOKENS if each else DEFAULT_TOKENS
        budget = tokens if tokens is not None else default
        evaluation, why = EvalSpec.for_role(role, metric, prompts=prompts, tokens=budget, **data)
        return cls(heads, method, evaluation, control=parse_control(control), why=why, **given)

    def __post_init__(self) -> None:
        """ConfigError for a method the evaluation set cannot take, or flags that do not go together."""
        self.evaluation.check_method(self.method, self.approx)
        if (self.check or self.graddrop) and not self.approx:
            raise ConfigError("--check and --graddrop go with --approx: pass --approx too")
        if self.resume and self.out_dir is None:
            raise ConfigError("--resume needs --out-dir DIR (the directory of the interrupted sweep)")
        if self.approx and self.batch_size is not None:
            raise ConfigError("--batch-size sets the exact ablation's batches; --approx runs its own (4 sequences)")


def run_ablation(loaded: LoadedModel, spec: AblateSpec, progress: bool = False, say: Say | None = None) -> Result:
    """Run `spec` on `loaded`: a Result of kind "approx" (with `approx`), "sweep" (`each`) or "ablation"
    (heads together), as approx_sweep, sweep_heads and ablate_heads describe. The heads a role resolves
    to and the batch size `auto` chose are said through `say` before they are used, after why the metric was
    chosen (`spec.why`); nothing is said before the heads are checked against the model, so a refused input
    gets its error line alone."""
    say = say or (lambda line: None)
    heads, chosen_by = _heads(loaded, spec)
    if spec.why:
        say(spec.why)
    if chosen_by:
        say(f"{chosen_by}: {', '.join(str(h) for h in heads)}")
    if spec.approx:
        return _approx(loaded, spec, heads, progress)
    same = {"seed": spec.seed, "progress": progress}
    if spec.each:
        tries: list[int | None] = []

        def sweep(size: int | None) -> Result:
            tries.append(size)  # a retry at a smaller batch keeps the rows already in out_dir
            resume = spec.resume or len(tries) > 1
            return sweep_heads(
                loaded, spec.method, spec.evaluation, out=spec.out_dir, resume=resume, batch_size=size, **same
            )

        return batched(sweep, spec.batch_size, say=say)
    labelled = {"control": spec.control, "labels": spec.labels, "chosen_by": chosen_by}
    result = batched(
        lambda size: ablate_heads(loaded, heads, spec.method, spec.evaluation, batch_size=size, **labelled, **same),
        spec.batch_size,
        say=say,
    )
    if spec.why:
        result.meta["metric_why"] = spec.why
    return result


def _heads(loaded: LoadedModel, spec: AblateSpec) -> tuple[list[Head], str | None]:
    """The heads `spec` names on this model, and how a role chose them (None for explicit heads)."""
    if spec.each:
        return all_heads(loaded.spec.n_layers, loaded.spec.n_heads), None
    return resolve_heads(loaded, spec.heads, spec.labels)


def _approx(loaded: LoadedModel, spec: AblateSpec, heads: list[Head], progress: bool) -> Result:
    """Every head's delta estimated from gradients, kept to `heads`, with how far it can be trusted in its
    meta: `check` (agreement with the exact sweep) or `trust` (the spot check's)."""
    from headlens.ablation.approx import agreement, approx_sweep, spot_check  # gradient code only here

    evaluation = spec.evaluation
    fields = {
        "method": spec.method,
        "metric": evaluation.metric,
        "seed": spec.seed,
        "bos": evaluation.bos,
        "text": evaluation.text,
        "prompts": None if evaluation.prompts == IOI else evaluation.prompts,  # the estimate reads given prompts
        "reference": evaluation.reference,
    }
    estimate = approx_sweep(loaded, approx=spec.approx, graddrop=spec.graddrop, **fields)
    frame = estimate.frame
    keep = {(h.layer, h.head) for h in heads}
    frame = frame[[(r.layer, r.head) in keep for r in frame.itertuples()]].reset_index(drop=True)
    if spec.check:
        exact = sweep_heads(loaded, progress=progress, heads=heads, tokens=None, **fields).frame
        frame = frame.merge(exact[["layer", "head", "delta"]], on=["layer", "head"])
        trust = {"check": {"kind": "check", "n_seq": "all", **agreement(exact, frame)}}
    else:
        trust = {"trust": {"kind": "spot check", **spot_check(loaded, approx=spec.approx, **fields).meta}}
    return Result("approx", frame, {**estimate.meta, **trust})


def batched(
    run: Callable[[Any], Result], batch_size: int | str | None, default: int | None = None, say: Say | None = None
) -> Result:
    """`run(size)` at `batch_size` (None: `default`; a None default lets the library size each batch to its
    sequences, headlens.intervene.evalset.EvalSet.row_batches), or under "auto" at the largest size that
    fits (headlens.load.devices.with_largest_batch), the choice said through `say` by rank 0."""
    from headlens.load.devices import with_largest_batch

    if batch_size != "auto":
        return run(batch_size or default)
    result, chosen = with_largest_batch(run)
    if say is not None and distributed.is_main():
        say(f"note: --batch-size auto chose {chosen}")
    return result


def run_pruning(
    loaded: LoadedModel,
    evaluation: EvalSpec,
    step_fraction: float = 0.1,
    labels: dict | None = None,
    roles: bool = True,
    seed: int = 0,
    batch_size: int | str | None = None,
    progress: bool = False,
    say: Say | None = None,
) -> Result:
    """`headlens prune`'s one call: prune_curve (headlens.ablation.prune) on `evaluation` with the model's role
    labels marked (`labels`, or classifying the model; none with `roles` False), its meta completed with
    `heads_within` (heads removable within PRUNE_TOLERANCE of the unpruned loss), `n_heads`, `tolerance` and
    `removal_by_role` (whether labelled heads are removed later, a permutation test seeded by `seed`; None
    without `roles`). `batch_size` as for run_ablation."""
    from headlens.ablation.prune import PRUNE_TOLERANCE, heads_within, prune_curve, removal_by_role  # gradients
    from headlens.classify.roles import model_labels
    from headlens.intervene.evalset import BATCH_SIZE

    labels = model_labels(loaded, labels) if roles else None
    curve = batched(
        lambda size: prune_curve(
            loaded,
            step_fraction=step_fraction,
            progress=progress,
            labels=labels,
            batch_size=size,
            evaluation=evaluation,
        ),
        batch_size,
        default=BATCH_SIZE,
        say=say,
    )
    order = removal_by_role(curve.frame, labels, seed=seed) if labels is not None else None
    n_heads = loaded.spec.n_layers * loaded.spec.n_heads
    curve.meta.update(
        heads_within=heads_within(curve.frame), n_heads=n_heads, tolerance=PRUNE_TOLERANCE, removal_by_role=order
    )
    return curve
