"""``ablation_kinds``: the causal claim at k* under every ablation kind (zero, mean, resample), a step of
``vrh demo`` (``demo_step``). Why a step of its own: a drop that only zero ablation causes may be the
out-of-distribution activation, not the heads' information; the claim holds for the heads only if every kind
agrees (``verdicts.kinds_agree``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from vrh_interp.experiments.demo_plan import DemoRun


def demo_step(run: DemoRun) -> None:
    """Step 4: the causal claim at k* under every ablation kind (zero from the k-sweep's records)."""
    if run.result is None:
        if 3 in run.steps.skipped:
            run.steps.skipped.append(4)  # the ablation kinds compare with the k-sweep's zero-ablation records
        return
    if not run.steps.open(4, f"ablation kinds at k*={run.k_star} on {len(run.checks)} fixed items"):
        return
    from vrh_interp.core.execution.ablation_kinds import ABLATION_KINDS, DEFAULT_ABLATION_KIND
    from vrh_interp.evaluation.grounding import ablation_values
    from vrh_interp.experiments import verdicts as ev
    from vrh_interp.experiments.demo_plan import ANSWER_TOKENS
    from vrh_interp.experiments.designs import restrict_design
    from vrh_interp.experiments.sweep import restrict, run_conditions

    values = ablation_values(run.vlm, run.detect, batch_size=run.batch_size)
    values.save(run.out / "ablation_values.pt")
    # the k-sweep ran the default kind (zero); every other registered kind runs here, on the check items with
    # their scenes' own sets (the clustered design restricted to them)
    check_ids = [s.sample_id for s in run.checks]
    at_k, where = restrict_design(run.conditions, run.items_of, check_ids, lambda c: c.k == run.k_star)
    kinds = {DEFAULT_ABLATION_KIND: restrict(run.result, check_ids, lambda c: c.k == run.k_star)}
    for kind in (k for k in ABLATION_KINDS if k != DEFAULT_ABLATION_KIND):
        masked = [c if c.kind == "baseline" else dataclasses.replace(c, ablation=kind) for c in at_k]
        kinds[kind] = run_conditions(run.vlm, run.checks, masked, batch_size=run.batch_size,
                                     max_new_tokens=ANSWER_TOKENS, run_dir=run.out / f"ablation_{kind}",
                                     ablation_values=values,
                                     items_of={m.key: where[c.key] for c, m in zip(at_k, masked) if c.key in where})
    # every kind on the same check items: does the drop and the effect persist under its ablation? The top-k's
    # specialness is the causal claim's rank test (its rank step, zero ablation) for each
    zero = run.evidence.get("causal")
    by_kind = {kind: ev.causal_evidence(r.records, r.conditions, run.k_star, ablation=kind, seed=run.seed,
                                        special=zero) for kind, r in kinds.items()}
    pd.DataFrame([{"ablation": kind, "k": run.k_star, "n": e.n if e else 0,
                   "effect": e.estimate if e else float("nan"), "numbers": e.numbers if e else ""}
                  for kind, e in by_kind.items()]).to_csv(run.out / "ablation_kinds.csv", index=False)
    run.evidence["ablation_kinds"] = ev.kinds_agree(by_kind)
