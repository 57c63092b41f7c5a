"""How far apart the ranks' whole DFlash steps are, planned on padded tokens or on the step's cost.

A rank's DFlash step is the frozen target's forward over every padded token of its
micro-batch plus the draft over its block slots, priced in FLOPs at the reference shape
(Qwen3-8B target, 5-layer draft, block 16: :mod:`lengthwise.dflash.cost.flops`, whose
docstring states the formula). For the plan of ``lengthwise dflash train`` (stratified,
``max_tokens=16384``, ``max_slots=32768``, 512 anchors, one micro-batch per rank and step,
``max_len`` the data's longest up to 16,384), on the bundled ``sft_mix`` lengths and the
reference shape, at 8 and 64 ranks, it prints and saves the plan's figures and
``rank_imbalance`` (docs/metrics.md) of padded tokens and of the whole step, for three plans:

- ``tokens``: the default plan (padded tokens);
- ``step cost``: planned with the step's cost model (its edges and order);
- ``step cost, level``: the same with ``balance="level"`` (steps of one cost level).

Lengths alone carry no loss mask: every token is read as supervised, where the anchor quota
(``L // 8``) binds. Every figure is deterministic::

    python benchmarks/dflash_rank_balance.py           # writes DFLASH_BALANCE_RESULTS.md,
                                                       # DFLASH_BALANCE.json, docs/dflash.md
    python benchmarks/dflash_rank_balance.py --quick   # reference shape of 20,000; no file
    python benchmarks/dflash_rank_balance.py --render  # docs/dflash.md from the saved JSON
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from planner_targets import lognormal  # noqa: E402

from lengthwise.dflash.cost.flops import StepFlops, anchor_counts, batch_flops  # noqa: E402
from lengthwise.planning.config import PlanConfig  # noqa: E402
from lengthwise.planning.lengths import load_lengths  # noqa: E402
from lengthwise.planning.metrics import rank_imbalance  # noqa: E402
from lengthwise.planning.plan import plan_epoch  # noqa: E402

ROOT = HERE.parent
SAVED = HERE / "DFLASH_BALANCE.json"
RESULTS = HERE / "DFLASH_BALANCE_RESULTS.md"
#: the marked regions (``<!-- figures:NAME start -->``) this script writes, per file
REGIONS: dict[str, tuple[str, ...]] = {"docs/dflash.md": ("dflash-balance",)}
#: the settings of ``lengthwise dflash train`` that shape the plan and the draft's slots
RUN = {"max_tokens": 16384, "max_slots": 32768, "num_anchors": 512, "block_size": 16}
WORLDS = (8, 64)
REFERENCE_N = 902_087
PLANS = ("tokens", "step cost", "step cost, level")
#: the figures of each plan, in the order of the tables
FIGURES = ("micro_batches", "padding_efficiency", "step_cv_ratio", "budget_fill",
           "tokens_p99", "step_p50", "step_p99", "slowest_rank")
#: the whole step's p99 above which the plan is worth changing
TARGET = 1.05


def lengths_of(name: str, reference_n: int) -> np.ndarray:
    """``sft_mix`` truncated as ``dflash train`` does (at the data's longest up to
    ``max_tokens``), or the reference shape of ``reference_n`` samples."""
    lens = (np.asarray(load_lengths("sft_mix"), dtype=np.int64) if name == "sft_mix"
            else lognormal(reference_n))
    return np.minimum(lens, min(int(lens.max()), RUN["max_tokens"]))


def slowest_rank(cost: np.ndarray, world: int) -> float:
    """The summed cost of the slowest rank of every step (a partial last step included)."""
    pad = (-cost.size) % world
    groups = np.concatenate([cost, np.zeros(pad)]).reshape(-1, world)
    return float(groups.max(axis=1).sum())


def measure(lens: np.ndarray, world: int) -> dict[str, dict[str, float]]:
    """The figures of the three plans of ``lens`` for ``world`` ranks."""
    flops = StepFlops.reference()
    anchors = anchor_counts(lens, num_anchors=RUN["num_anchors"], block_size=RUN["block_size"],
                            max_slots=RUN["max_slots"], max_tokens=RUN["max_tokens"])
    model = flops.cost_model(num_anchors=RUN["num_anchors"], max_slots=RUN["max_slots"],
                             max_tokens=RUN["max_tokens"])
    options = {"tokens": {}, "step cost": {"cost": model},
               "step cost, level": {"cost": model, "balance": "level"}}
    out: dict[str, dict[str, float]] = {}
    for name in PLANS:
        plan = plan_epoch(lens, PlanConfig(max_tokens=RUN["max_tokens"], world_size=world,
                                           max_len=int(lens.max()), **options[name]))
        st = plan.stats
        if st["unique_samples"] != lens.size or st["repeated_in_schedule"]:
            raise AssertionError(f"{name}: the plan does not hold every sample once")
        rows = np.diff(plan.offsets)
        padded = rows * np.maximum.reduceat(lens[plan.indices], plan.offsets[:-1])
        if padded.max() > RUN["max_tokens"]:
            raise AssertionError(f"{name}: a micro-batch holds more than max_tokens")
        step = batch_flops(flops, lens, plan.indices, plan.offsets, anchors)
        whole = rank_imbalance(step, world)
        out[name] = {"micro_batches": int(plan.total_batches),
                     "padding_efficiency": st["padding_efficiency"],
                     "step_cv_ratio": st["step_cv_ratio"], "budget_fill": st["budget_fill"],
                     "tokens_p99": rank_imbalance(padded.astype(np.float64),
                                                  world)["rank_imbalance_p99"],
                     "step_p50": whole["rank_imbalance_p50"],
                     "step_p99": whole["rank_imbalance_p99"],
                     "slowest_rank": slowest_rank(step, world)}
    base = out["tokens"]["slowest_rank"]
    for name in PLANS:  # the slowest ranks' FLOPs over an epoch, against the default plan's
        out[name]["slowest_rank"] /= base
    return out


def run(reference_n: int = REFERENCE_N) -> dict:
    """Every figure: ``{"sets": {set: {ranks: {plan: figures}}}, ...}``."""
    sets = {}
    for name in ("sft_mix", "reference"):
        lens = lengths_of(name, reference_n)
        sets[name] = {"samples": int(lens.size), "max_len": int(lens.max()),
                      "ranks": {str(w): measure(lens, w) for w in WORLDS}}
    f = StepFlops.reference()
    units = {k: getattr(f, k) for k in ("target_token", "target_pair", "context_token", "slot",
                                        "slot_key", "head")}
    return {"run": RUN, "reference_n": reference_n, "flops": units, "sets": sets}


def _fmt(name: str, value: float) -> str:
    return f"{value:,}" if name == "micro_batches" else f"{value:.3f}"


def table(saved: dict) -> str:
    """The figures as one markdown table."""
    head = ("| lengths | ranks | plan | micro-batches | padding_efficiency | step_cv_ratio | "
            "budget_fill | rank_imbalance p99, padded tokens | whole step p50 | "
            "whole step p99 | slowest ranks' FLOPs |")
    lines = [head, "|" + "---|" * 11]
    for set_name, s in saved["sets"].items():
        for w, plans in s["ranks"].items():
            for plan, fig in plans.items():
                cells = " | ".join(_fmt(k, fig[k]) for k in FIGURES)
                lines.append(f"| {set_name} | {w} | {plan} | {cells} |")
    return "\n".join(lines)


def _fig(saved: dict, set_name: str, world: int, plan: str, key: str) -> float:
    return saved["sets"][set_name]["ranks"][str(world)][plan][key]


def render(name: str, saved: dict) -> str:
    """The text of region ``name`` from the saved figures."""
    if name != "dflash-balance":
        raise KeyError(f"no region {name!r}")
    g = lambda *a: _fig(saved, *a)  # noqa: E731
    worlds = " and ".join(str(w) for w in WORLDS)
    text = textwrap.fill(
        f"Measured by `python benchmarks/dflash_rank_balance.py` "
        f"(`benchmarks/DFLASH_BALANCE_RESULTS.md`): the plan `dflash train` makes "
        f"(stratified, `max_tokens` {RUN['max_tokens']:,}, one micro-batch per rank and "
        f"step) on the bundled `sft_mix` lengths and the reference shape. Each rank's step is "
        "priced in FLOPs at the reference shape: the frozen target over every padded token, "
        "the draft over its block slots, the LM head over the supervised ones "
        "(`lengthwise.dflash.cost.flops`). On padded tokens the ranks of a step are within "
        f"{g('sft_mix', 8, 'tokens', 'tokens_p99'):.3f} / "
        f"{g('sft_mix', 64, 'tokens', 'tokens_p99'):.3f} (`sft_mix`, {worlds} ranks, "
        f"p99 of `rank_imbalance`) and {g('reference', 8, 'tokens', 'tokens_p99'):.3f} / "
        f"{g('reference', 64, 'tokens', 'tokens_p99'):.3f} (reference shape); over the "
        f"whole step they are {g('sft_mix', 8, 'tokens', 'step_p99'):.3f} / "
        f"{g('sft_mix', 64, 'tokens', 'step_p99'):.3f} and "
        f"{g('reference', 8, 'tokens', 'step_p99'):.3f} / "
        f"{g('reference', 64, 'tokens', 'step_p99'):.3f}. The cheap micro-batches are those "
        "of long samples. One that holds one or two rows leaves up to half the token budget "
        f"empty. A sample's draft slots stop at {RUN['num_anchors']} anchors "
        f"({RUN['num_anchors'] * RUN['block_size']:,} slots), where a micro-batch of short "
        f"samples fills the {RUN['max_slots']:,}-slot budget. Planned with "
        "the step's cost (its edges and order), the whole step is "
        f"{g('sft_mix', 8, 'step cost', 'step_p99'):.3f} / "
        f"{g('sft_mix', 64, 'step cost', 'step_p99'):.3f} and "
        f"{g('reference', 8, 'step cost', 'step_p99'):.3f} / "
        f"{g('reference', 64, 'step cost', 'step_p99'):.3f}, and the slowest ranks' FLOPs "
        f"over an epoch move by {_moved(saved, 'step cost')}. Every step of the stratified "
        "order holds one micro-batch of each length stratum. So the cheap micro-batches of "
        "the long strata share steps with dear short ones whatever their cost. Steps of one "
        "cost level (`balance=\"level\"` with the step's cost) bring the whole step to "
        f"{g('sft_mix', 8, 'step cost, level', 'step_p99'):.3f} / "
        f"{g('sft_mix', 64, 'step cost, level', 'step_p99'):.3f} and "
        f"{g('reference', 8, 'step cost, level', 'step_p99'):.3f} / "
        f"{g('reference', 64, 'step cost, level', 'step_p99'):.3f} and move the slowest "
        f"ranks' FLOPs by {_moved(saved, 'step cost, level')}, but give up the length mix "
        f"(`step_cv_ratio` {_range(saved, 'step cost, level', 'step_cv_ratio')} against "
        f"{_range(saved, 'tokens', 'step_cv_ratio')}). So `dflash train` keeps the plan on "
        "padded tokens.", width=100, break_on_hyphens=False)
    return text + "\n\n" + table(saved)


def _values(saved: dict, plan: str, key: str) -> list[float]:
    return [p[plan][key] for s in saved["sets"].values() for p in s["ranks"].values()]


def _range(saved: dict, plan: str, key: str) -> str:
    v = _values(saved, plan, key)
    return f"{min(v):.2f}-{max(v):.2f}"


def _moved(saved: dict, plan: str) -> str:
    v = [100 * (x - 1) for x in _values(saved, plan, "slowest_rank")]
    return f"{min(v):+.1f} % to {max(v):+.1f} %"


def region_text(text: str, name: str, where: str) -> tuple[int, int]:
    """Start and end offsets of region ``name``'s body in ``text``."""
    import docs_figures  # the marked-region functions of benchmarks/docs_figures.py

    return docs_figures.region_text(text, name, where)


def rewrite(saved: dict, root: Path = ROOT) -> list[str]:
    """Rewrite every region of :data:`REGIONS` under ``root``; the files changed."""
    import docs_figures

    return docs_figures.rewrite_regions(REGIONS, lambda name: render(name, saved), root)


def results(saved: dict, command: str) -> str:
    """The text of ``DFLASH_BALANCE_RESULTS.md``."""
    f = saved["flops"]
    return f"""# Ranks over the whole DFlash step

Generated by `{command}`; do not edit by hand. Every figure is deterministic.

Each rank's DFlash step, in FLOPs at the reference shape (Qwen3-8B target, 5-layer draft,
block 16), for a micro-batch of `R` rows padded to `P` tokens whose sample `i` of `L_i`
tokens draws `A_i = min(512, L_i // 8)` anchors (`max_slots` 32,768 over `max_tokens` 16,384;
lengths alone read as fully supervised) in blocks of `B = 16`:

`F = R*P*(t + x) + R*P*(P+1)/2 * t_att + R*max(A_i)*B*s + sum_i A_i*B*(L_i/2 + B)*s_att
+ sum_i A_i*(B-1)*h`

with `t` = {f['target_token']:.4g} (target forward per token), `t_att` = {f['target_pair']:.4g}
(target attention per causal query-key pair), `x` = {f['context_token']:.4g} (draft context
projections per token, forward and backward), `s` = {f['slot']:.4g} (draft layers per block
slot, forward and backward), `s_att` = {f['slot_key']:.4g} (draft attention per slot and key it
sees), `h` = {f['head']:.4g} (LM head per supervised slot: forward, recomputed forward, input
gradient).

Plans: `lengthwise dflash train`'s (stratified, `max_tokens` 16,384, `grad_accum` 1, `max_len`
the data's longest up to 16,384, `buckets="auto"`) on padded tokens (`tokens`), with the
step's cost model (`step cost`: `lengthwise.dflash.cost.flops.StepFlops.cost_model`, which
leaves out the draft's attention), and the same with `balance="level"`. `sft_mix`:
{saved['sets']['sft_mix']['samples']:,} samples, the bundled lengths cut at
{saved['sets']['sft_mix']['max_len']:,}; reference shape: {saved['reference_n']:,} log-normal
lengths (median 1,050, sigma 0.5, [16, 8192]). `rank_imbalance`: p50 / p99 over steps of the
slowest rank over the ranks' mean (padded tokens, or the whole step's FLOPs); slowest ranks'
FLOPs: the slowest rank of every step summed over the epoch, over the default plan's.

{table(saved)}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="the reference shape of 20,000 samples; print only")
    ap.add_argument("--render", action="store_true",
                    help=f"rewrite docs/dflash.md's figures from {SAVED.name}; measure nothing")
    args = ap.parse_args(argv)
    if args.render:
        saved = json.loads(SAVED.read_text(encoding="utf-8"))
        print("\n".join(rewrite(saved) or ["docs are current"]))
        return 0
    saved = run(20_000 if args.quick else REFERENCE_N)
    command = "python benchmarks/dflash_rank_balance.py" + (" --quick" if args.quick else "")
    text = results(saved, command)
    print(text)
    if not args.quick:
        RESULTS.write_text(text, encoding="utf-8")
        SAVED.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
        rewrite(saved)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
