"""The claims tables of the seeded benches, paired by seed: bench/results/controlled_cpu.md and lifecycle_cpu.md.

    .venv/bin/python -m bench.claims [--check]

A claim compares two rows that the same seeds fed (seed i's row A and seed i's row B share its base
model, its data order, its machine's rounding), so it is tested on the per-seed differences B − A:
their mean with Student's t 95 % interval and the paired t-test's p
(:func:`lab.calibration.spread.paired_difference`). Two rows' own intervals can overlap while every
seed differs the same way, and the reverse: an interval that excludes 0 at 95 % in one claim of twenty
is expected by chance. So over the claims of one table the verdicts follow Holm–Bonferroni
(:func:`lab.calibration.spread.holm_adjust`): a claim *holds* where its adjusted p is below 0.05 and
the difference has the claimed sign, *reversed* where it has the other; the chance that any claim of
the table is called wrongly stays under 5 %.

bench/controlled.py and bench/lifecycle.py write these tables from every seed's exact figures
(:func:`claims_section`). This module rewrites them in place (the rest of each file, the command and machine
that produced it included, is kept) from what the results files keep, so that a claim
table follows its figures without rerunning an hour of jobs: a claims table's own per-seed differences
where it has them, else the two rows' per-seed figures (rounded to 0.1 as printed). Where the file keeps
no per-seed figure of a row (accuracy, confidence − accuracy, the per-step and per-epoch curves), the
test uses the bound sd(B − A) ≤ sd(A) + sd(B), each sd read back from the row's t-interval: a wider
interval and a larger p than the paired test's, so a claim it calls holding holds, and one it leaves
unshown may still hold (marked *bound*).
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

from scipy import stats

from bench._harness import RESULTS, parser
from lab.calibration.spread import Difference, holm_adjust, mean_interval, t_difference

HEADING = "## Claims, over seeds"
ALPHA = 0.05  # the table's familywise error rate


@dataclass(frozen=True)
class Row:
    """One row's figure over n seeds, in percent: the mean, its t-interval, each seed's figure where kept."""
    mean: float
    low: Optional[float]
    high: Optional[float]
    seeds: Optional[tuple[float, ...]] = None

    @classmethod
    def of(cls, values: Sequence[float]) -> "Row":
        mean, low, high = mean_interval(values)
        return cls(mean, low, high, tuple(values))

    def sd(self, n: int) -> float:
        """The standard deviation over seeds: the seeds' own, or read back from the t-interval's half-width."""
        if self.seeds is not None:
            return float(stats.tstd(self.seeds)) if len(self.seeds) > 1 else 0.0
        if self.low is None or self.high is None:
            raise ValueError(f"Expected a row with per-seed figures or a t-interval, got {self}.")
        return (self.high - self.low) / 2 * math.sqrt(n) / float(stats.t.ppf(0.975, n - 1))

    def cell(self) -> str:
        mean = number(self.mean)
        return mean if self.low is None else f"{mean} [{number(self.low)}, {number(self.high)}]"


ZERO = Row(0.0, 0.0, 0.0)  # the other side of a one-sample claim ("confidence − accuracy below 0")


@dataclass(frozen=True)
class Claim:
    """What a paper (or an older README) says: ``higher`` is above ``lower`` in ``metric``."""
    text: str
    metric: str
    lower: Row
    higher: Row
    differences: Optional[tuple[float, ...]] = None  # higher − lower, seed by seed, where the rows do not keep them

    def per_seed(self) -> Optional[tuple[float, ...]]:
        """higher − lower seed by seed, rounded to 0.1 as the table prints them: a table read back from its
        file then gives the figures it was written with (None where a row keeps no per-seed figure)."""
        if self.differences is not None:
            d = self.differences
        elif self.lower.seeds is not None and self.higher.seeds is not None:
            d = tuple(b - a for a, b in zip(self.lower.seeds, self.higher.seeds))
        elif self.lower is ZERO and self.higher.seeds is not None:
            d = self.higher.seeds
        elif self.higher is ZERO and self.lower.seeds is not None:
            d = tuple(-a for a in self.lower.seeds)
        else:
            return None
        return tuple(round(v, 1) + 0.0 for v in d)

    def bound(self) -> bool:
        """Whether the test rests on sd(B − A) ≤ sd(A) + sd(B) (exact where one side is the constant 0)."""
        return self.per_seed() is None and not (self.lower is ZERO or self.higher is ZERO)

    def test(self, n: int) -> Difference:
        d = self.per_seed()
        if d is not None:
            return t_difference(sum(d) / len(d), float(stats.tstd(d)), len(d))
        return t_difference(self.higher.mean - self.lower.mean, self.lower.sd(n) + self.higher.sd(n), n)


def verdict(difference: Difference, adjusted_p: float) -> str:
    if adjusted_p >= ALPHA:
        return "not shown"
    return "**holds**" if difference.mean > 0 else "**reversed**"


def number(x: float) -> str:
    """One decimal, without a "-0.0" for a difference that rounds to nothing."""
    text = f"{x:.1f}"
    return "0.0" if text == "-0.0" else text


def p_cell(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def claims_section(claims: Sequence[Claim], n: int) -> list[str]:
    """The claims section (its heading, the rule, the table) for ``claims`` over ``n`` seeds."""
    tests = [c.test(n) for c in claims]
    adjusted = holm_adjust([t.p for t in tests])
    lines = [
        HEADING, "",
        "Each claim says the higher row is above the lower one. Both rows come from the same seeds, so a claim is "
        "tested on the per-seed differences (higher − lower): their mean with Student's t 95 % interval and the "
        f"paired t-test's two-sided p. Over the {len(claims)} claims of this table the verdicts follow "
        "Holm–Bonferroni: a claim **holds** where its Holm-adjusted p is below 0.05 and the difference is "
        "positive (**reversed**: negative), so the chance that any verdict of the table is wrong stays under 5 %; "
        "*not shown* is not refuted. *bound*: the file keeps no per-seed figure of a row, so the test uses "
        "sd(higher − lower) ≤ sd(higher) + sd(lower), each read back from its row's t-interval — a wider interval "
        "and a larger p than the paired test's. A row *0* is a claim against zero. Intervals are as computed, not "
        "clipped: one of a figure that cannot be negative may reach below 0.", "",
        "| claim | metric | lower row: mean [t] | higher row: mean [t] | higher − lower, per seed "
        "| difference: mean [95 % t] | p | Holm p | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for claim, test, p in zip(claims, tests, adjusted):
        d = claim.per_seed()
        seeds = " / ".join(number(v) for v in d) if d is not None else "–"
        cell = f"{number(test.mean)} [{number(test.low)}, {number(test.high)}]{' *bound*' if claim.bound() else ''}"
        lower, higher = ("0" if r is ZERO else r.cell() for r in (claim.lower, claim.higher))
        lines.append(f"| {claim.text} | {claim.metric} | {lower} | {higher} | {seeds} | {cell} | {p_cell(test.p)} "
                     f"| {p_cell(p)} | {verdict(test, p)} |")
    return lines


# ---------------------------------------------------------------- reading a results file back

Table = list[list[str]]  # rows of cells, the header first


def tables(text: str) -> dict[str, list[Table]]:
    """The markdown tables of ``text`` under each ``## `` heading (the heading without its hashes)."""
    found: dict[str, list[Table]] = {}
    heading, current = "", None
    for line in text.splitlines():
        if line.startswith("## "):
            heading, current = line[3:], None
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if current is None:
                current = []
                found.setdefault(heading, []).append(current)
            if not set("".join(cells)) <= set("-: "):
                current.append(cells)
        else:
            current = None
    return found


NUMBER = r"-?\d+(?:\.\d+)?"


def parse_row(mean_cell: str, seeds_cell: Optional[str]) -> Row:
    """A "mean [low, high]" cell, and a "v / v / …" cell of each seed's figure where there is one."""
    match = re.fullmatch(rf"({NUMBER}) \[({NUMBER}), ({NUMBER})\]", mean_cell)
    if match is None:
        raise ValueError(f"Expected a cell 'mean [low, high]', got {mean_cell!r}.")
    seeds = tuple(float(v) for v in seeds_cell.split(" / ")) if seeds_cell else None
    return Row(*(float(v) for v in match.groups()), seeds)


@dataclass(frozen=True)
class Ref:
    """Where a row's figure is: the first table under a heading starting ``section`` that has a row
    ``label`` and a column ``column`` (its first such column); each seed's figure two columns on, where
    that column is headed "per seed"."""
    section: str
    label: str
    column: str


def find(found: dict[str, list[Table]], ref: Ref) -> Row:
    for heading, group in found.items():
        if not heading.startswith(ref.section):
            continue
        for table in group:
            header, body = table[0], table[1:]
            row = next((r for r in body if r[0] == ref.label), None)
            if row is None or ref.column not in header:
                continue
            at = header.index(ref.column)
            seeds = row[at + 2] if at + 2 < len(header) and header[at + 2] == "per seed" else None
            return parse_row(row[at], seeds)
    raise ValueError(f"Expected a table under '## {ref.section}…' with a row {ref.label!r} and a column "
                     f"{ref.column!r}: none found. Has the bench's table changed? Update the spec in bench/claims.py.")


Spec = tuple[str, str, Optional[Ref], Optional[Ref]]  # text, metric, lower, higher (None: the constant 0)


def kept_differences(found: dict[str, list[Table]]) -> dict[str, tuple[float, ...]]:
    """The per-seed differences an existing claims table lists, by claim text."""
    kept = {}
    for table in found.get(HEADING[3:], []):
        header = table[0]
        if "higher − lower, per seed" not in header:
            continue
        at = header.index("higher − lower, per seed")
        for row in table[1:]:
            if row[at] != "–":
                kept[row[0]] = tuple(float(v) for v in row[at].split(" / "))
    return kept


def seed_count(text: str) -> int:
    """The number of seeds of a results file: the length of its first per-seed cell."""
    found = tables(text)
    for group in found.values():
        for table in group:
            if "per seed" in table[0]:
                at = table[0].index("per seed")
                cells = [r[at] for r in table[1:] if " / " in r[at]]
                if cells:
                    return len(cells[0].split(" / "))
    raise ValueError("Expected a table with a 'per seed' column of figures 'v / v / …'; found none.")


def rewrite(text: str, specs: Sequence[Spec]) -> str:
    """``text`` with its claims section recomputed from the figures it keeps."""
    texts = [spec[0] for spec in specs]
    if len(set(texts)) != len(texts):
        raise ValueError(f"Expected each claim's text once (a table's per-seed differences are found by it), got "
                         f"{sorted({t for t in texts if texts.count(t) > 1})} more than once.")
    found = tables(text)
    kept = kept_differences(found)
    row = lambda ref: ZERO if ref is None else find(found, ref)  # noqa: E731
    claims = [Claim(label, metric, row(lower), row(higher), kept.get(label)) for label, metric, lower, higher in specs]
    start = text.index(HEADING)
    end = text.index("\n## ", start + len(HEADING))
    return text[:start] + "\n".join(claims_section(claims, seed_count(text))) + "\n" + text[end:]


# ---------------------------------------------------------------- the two benches' claims, as their files keep them

def controlled_specs() -> list[Spec]:
    e1, e2, e3 = "1. Fine-tuning", "2. FIRST", "3. CFT"
    ece_in, ece_out, acc = "in-domain ECE % [t 95 %]", "shifted ECE % [t 95 %]", "accuracy % [t]"
    base, full, lora = (Ref(e1, label, ece_in) for label in (
        "base (3 epochs on its own questions)", "full fine-tune, 16 epochs", "LoRA fine-tune, 16 epochs"))
    shifted = lambda ref: Ref(ref.section, ref.label, ece_out)  # noqa: E731
    accuracy = lambda ref: Ref(ref.section, ref.label, acc)  # noqa: E731
    teacher, distill, ls, first, oracle = (Ref(e2, label, ece_in) for label in (
        "teacher = fine-tune", "distill (direct)", "distill + label smoothing", "FIRST (temperature scaling)",
        "oracle distill (true distribution; upper bound)"))
    start, ts, cls, cft, r0, r04, r18, slow_cft, slow_r04 = (Ref(e3, label, ece_in) for label in (
        "as it is (the over-confident start)", "temperature scaling", "label smoothing", "CFT", "RCFT λ = 0",
        "RCFT λ = 0.4", "RCFT λ = 1.8", "CFT, learning rate 0.0002", "RCFT λ = 0.4, learning rate 0.0002"))
    ece, ece_s, accuracy_in = "ECE %, in-domain", "ECE %, shifted", "accuracy %, in-domain"
    return [
        ("16 epochs on noisy labels raise ECE (full fine-tune above the base)", ece, base, full),
        ("… and on the shifted split", ece_s, shifted(base), shifted(full)),
        ("LoRA grows less over-confident than full fine-tuning", ece, lora, full),
        ("… LoRA below full, shifted split", ece_s, shifted(lora), shifted(full)),
        ("FIRST below plain fine-tuning (the teacher)", ece, first, teacher),
        ("FIRST below direct distillation", ece, first, distill),
        ("FIRST below distillation + label smoothing", ece, first, ls),
        ("distillation + label smoothing below direct distillation", ece, ls, distill),
        ("FIRST below direct distillation, shifted split", ece_s, shifted(first), shifted(distill)),
        ("the oracle student below FIRST", ece, oracle, first),
        ("CFT brings the over-confident model back", ece, cft, start),
        ("temperature scaling brings it back", ece, ts, start),
        ("label smoothing brings it back", ece, cls, start),
        ("CFT below temperature scaling", ece, cft, ts),
        ("CFT below label smoothing", ece, cft, cls),
        ("RCFT λ = 0.4 below CFT (the CFT paper's claim), in-domain", ece, r04, cft),
        ("… shifted split", ece_s, shifted(r04), shifted(cft)),
        ("RCFT λ = 0.4 loses accuracy against CFT", accuracy_in, accuracy(r04), accuracy(cft)),
        ("RCFT λ = 1.8 loses accuracy against CFT", accuracy_in, accuracy(r18), accuracy(cft)),
        ("RCFT λ = 0 (prompt + answer SFT) loses accuracy against CFT", accuracy_in, accuracy(r0), accuracy(cft)),
        ("RCFT λ = 0.4 loses accuracy against λ = 0 (the regulariser's share)", accuracy_in, accuracy(r04),
         accuracy(r0)),
        ("at learning rate 0.0002: RCFT λ = 0.4 below CFT, shifted split", ece_s, shifted(slow_r04),
         shifted(slow_cft)),
        ("at learning rate 0.0002: RCFT λ = 0.4 below CFT, in-domain", ece, slow_r04, slow_cft),
    ]


def lifecycle_specs() -> list[Spec]:
    a, b, c, d = "(a) Pre-training", "(b) SFT", "(c) DPO", "(d) CFT"
    ece, gap = "ECE % [t 95 %]", "confidence − accuracy % [t]"
    xs, s, scratch = (Ref(a, label, ece) for label in ("scratch-xs (0.05 M)", "scratch-s (0.17 M)", "scratch (0.56 M)"))
    step = lambda n: Ref(a, str(n), "scratch: ECE % [t]")  # noqa: E731
    base = Ref(b, "base (before SFT)", ece)
    sft = {label: Ref(b, label, ece) for label in ("narrow, full", "narrow, LoRA", "diverse, full", "diverse, LoRA")}
    epoch1 = lambda label: Ref(b, "1", f"{label}: ECE % [t]")  # noqa: E731
    with_gap = lambda ref: Ref(ref.section, ref.label, gap)  # noqa: E731
    before = Ref(c, "before: the diverse full SFT model", ece)
    dpo = {beta: Ref(c, f"after DPO, β = {beta}", ece) for beta in ("0.1", "1", "5")}
    start = Ref(d, "as it is (DPO, β = 0.1)", ece)
    specs: list[Spec] = [
        ("larger models are better calibrated: scratch below scratch-xs", "ECE %", scratch, xs),
        ("… scratch below scratch-s", "ECE %", scratch, s),
        ("longer pre-training is better calibrated: scratch at step 450 below step 75", "ECE %", scratch, step(75)),
        ("… at step 450 below step 225", "ECE %", scratch, step(225)),
    ]
    specs += [(f"SFT worsens ECE ({label}, epoch 12 above the base)", "ECE %", base, ref) for label, ref in sft.items()]
    specs += [
        ("the diverse full SFT model is under-confident (confidence − accuracy below 0)", "confidence − accuracy %",
         with_gap(sft["diverse, full"]), None),
        ("… the diverse LoRA SFT model", "confidence − accuracy %", with_gap(sft["diverse, LoRA"]), None),
        ("narrow data worsens it more than diverse (full)", "ECE %", sft["diverse, full"], sft["narrow, full"]),
        ("… (LoRA)", "ECE %", sft["diverse, LoRA"], sft["narrow, LoRA"]),
        ("more epochs worsen it (narrow full: epoch 12 above epoch 1)", "ECE %", epoch1("narrow, full"),
         sft["narrow, full"]),
        ("… (diverse full: epoch 12 above epoch 1)", "ECE %", epoch1("diverse, full"), sft["diverse, full"]),
        ("LoRA worsens it less than full (narrow)", "ECE %", sft["narrow, LoRA"], sft["narrow, full"]),
        ("… (diverse)", "ECE %", sft["diverse, LoRA"], sft["diverse, full"]),
    ]
    for beta, ref in dpo.items():
        specs += [(f"DPO β = {beta} raises ECE (the CFT paper; the alignment paper: it stays)", "ECE %", before, ref),
                  (f"… β = {beta} makes the model over-confident (confidence − accuracy above the SFT model's)",
                   "confidence − accuracy %", with_gap(before), with_gap(ref))]
    specs += [(f"a larger β keeps DPO calibrated better: β = 5 below β = {beta}", "ECE %", dpo["5"], dpo[beta])
              for beta in ("0.1", "1")]
    specs += [(f"{label} brings the DPO model's ECE down", "ECE %", Ref(d, label, ece), start)
              for label in ("CFT", "RCFT λ = 0.4", "temperature scaling")]
    return specs


FILES = {"controlled_cpu.md": controlled_specs, "lifecycle_cpu.md": lifecycle_specs}


def main() -> int:
    options = parser(__doc__)
    options.add_argument("--check", action="store_true", help="write nothing; exit 1 where a claims table is stale")
    args = options.parse_args()
    stale = []
    for name, specs in FILES.items():
        path = RESULTS / name
        text = path.read_text()
        new = rewrite(text, specs())
        if new != text:
            stale.append(name)
            if not args.check:
                path.write_text(new)
        print(f"{name}: {'stale' if new != text and args.check else 'rewritten' if new != text else 'up to date'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
