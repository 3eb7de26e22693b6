"""Prove the schedule's arithmetic for every configuration, not only the explored ones (z3).

`invar.model.schedule` fixes, before a run starts, which versions are published and which
version generates each rollout batch. The model checker explores a few small configurations;
this module discharges the schedule's lemmas for *all* integers

    S >= 0 (max_staleness), 1 <= P <= S + 1 (sync_period), E >= 0 (eval_every, 0 = none),
    C >= 0 (checkpoint_every, 0 = none), N >= 1 (total_updates), 0 <= b < N (batch).

Encoding (`_Encoding`). The definitions are written in z3 integer arithmetic, without
quantifiers:

* Pub = {0} ∪ {v : v mod P = 0} ∪ hard boundaries, within 0..N. "v is a multiple of d" is
  "v = d*q for some integer q": a fresh q, so it may only be *assumed* (an existential in the
  solver's query); where it must be *shown*, a witness product is named instead.
* gen_version(b) = max(oldest_allowed(b), last_boundary(b)) in closed form: with
  lo = max(0, b - S), the least multiple of d that is >= lo is d*q with d*q >= lo > d*q - d,
  so oldest_allowed = min(P*ceil(lo/P), E*ceil(lo/E) if E, C*ceil(lo/C) if C, N), and the
  last boundary <= b is max(0, E*floor(b/E) if E, C*floor(b/C) if C) (N > b is never one).
  `encoding_is_the_definition` proves these closed forms are the declarative min/max
  (min{v ∈ Pub : v >= lo}, max{boundaries <= b}), so nothing rests on the closed form.

Products d*q with a symbolic divisor are nonlinear, and z3's nonlinear integer reasoning times
out on these lemmas. Each product is therefore replaced by a fresh integer t (purification),
and for every two products with the same divisor the facts of multiplication the proofs need
are added: q1 < q2 -> t1 + d <= t2, and q1 = q2 -> t1 = t2 (for d > 0). The query is then
linear (decidable) and a proof of the abstraction is a proof of the original, since the real
products satisfy every added fact (`multiplication_facts` proves those facts themselves,
nonlinearly). Where the abstraction is satisfiable, the real products t = d*q are put back and
z3 is asked for a genuine counterexample, which is shrunk and stated in the configuration's
own terms (and checked against the Python schedule).

Typical use::

    from checker.prove import check_lemmas, format_results
    print(format_results(check_lemmas()))              # every lemma holds
    check_lemmas(assume_valid=False)                   # P <= S + 1 dropped: counterexamples
"""

from __future__ import annotations

import itertools
import random
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import z3

# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class LemmaResult:
    """One lemma: what it states, whether z3 proved it, and if not, a concrete counterexample."""

    name: str
    statement: str
    holds: bool
    counterexample: dict[str, int] | None
    seconds: float
    detail: str = ""
    """For a failure: what goes wrong in the counterexample (or why z3 gave no answer)."""


_TIMEOUT_MS = 60_000
_FIELDS = {  # z3 name -> the configuration's own term
    "S": "max_staleness", "P": "sync_period", "E": "eval_every", "C": "checkpoint_every",
    "N": "total_updates", "K": "optimizer_steps", "M": "max_inflight_batches",
}


# ---------------------------------------------------------------------------------------------
# The encoding


@dataclass(frozen=True)
class _Config:
    """The configuration as z3 integers (K: optimizer_steps, M: max_inflight_batches)."""

    S: z3.ArithRef
    P: z3.ArithRef
    E: z3.ArithRef
    C: z3.ArithRef
    N: z3.ArithRef
    K: z3.ArithRef
    M: z3.ArithRef

    @staticmethod
    def symbolic() -> _Config:
        return _Config(*z3.Ints("S P E C N K M"))

    def preconditions(self, assume_valid: bool) -> list[z3.BoolRef]:
        """RunConfig.validate()'s rules on these fields; P <= S + 1 only if `assume_valid`."""
        rules = [self.S >= 0, self.P >= 1, self.E >= 0, self.C >= 0, self.N >= 1,
                 self.K >= 1, self.M >= 1]
        if assume_valid:
            rules.append(self.P <= self.S + 1)
        return rules


class _GenVersion(NamedTuple):
    value: z3.ArithRef          # gen_version(b)
    lowest: z3.ArithRef         # max(0, b - S)
    oldest_allowed: z3.ArithRef  # min{v ∈ Pub : v >= lowest}
    last_boundary: z3.ArithRef  # max{hard boundary <= b}
    witnesses: tuple[tuple[z3.ArithRef, z3.ArithRef], ...]  # (term, divisor): term = divisor*q


def _zmin(*terms: z3.ArithRef) -> z3.ArithRef:
    out = terms[0]
    for t in terms[1:]:
        out = z3.If(t < out, t, out)
    return out


def _zmax(*terms: z3.ArithRef) -> z3.ArithRef:
    out = terms[0]
    for t in terms[1:]:
        out = z3.If(t > out, t, out)
    return out


class _Encoding:
    """One proof obligation: its products (purified), their facts, and defining constraints."""

    def __init__(self) -> None:
        self.products: list[tuple[z3.ArithRef, z3.ArithRef, z3.ArithRef]] = []  # (d, q, t)
        self.side: list[z3.BoolRef] = []  # definitions of the auxiliary quotients
        self._count = 0

    def fresh(self, base: str) -> z3.ArithRef:
        self._count += 1
        return z3.Int(f"{base}!{self._count}")

    def mul(self, d: z3.ArithRef, q: z3.ArithRef) -> z3.ArithRef:
        """d*q as a fresh integer; `facts` relates it to every other product with divisor d."""
        t = self.fresh(f"{d}*q")
        self.products.append((d, q, t))
        return t

    def facts(self) -> list[z3.BoolRef]:
        """Facts of multiplication (proved by `multiplication_facts`) for every pair of
        products with the same divisor, d*0 = 0 counted as one of them."""
        products = list(self.products)
        for d in {d.get_id(): d for d, _, _ in self.products}.values():
            products.append((d, z3.IntVal(0), z3.IntVal(0)))
        out: list[z3.BoolRef] = []
        for i, (d1, q1, t1) in enumerate(products):
            for d2, q2, t2 in products[i + 1:]:
                if not d1.eq(d2):
                    continue
                out.append(z3.Implies(z3.And(d1 > 0, q1 < q2), t1 + d1 <= t2))
                out.append(z3.Implies(z3.And(d1 > 0, q2 < q1), t2 + d1 <= t1))
                out.append(z3.Implies(q1 == q2, t1 == t2))
                out.append(z3.Implies(q2 == q1 + 1, t2 == t1 + d1))
                out.append(z3.Implies(q1 == q2 + 1, t1 == t2 + d1))
        return out

    def real_products(self) -> list[z3.BoolRef]:
        """The products' true meaning (nonlinear): used only to confirm a counterexample."""
        return [t == d * q for d, q, t in self.products]

    # -- sets, assumed (existential: only for hypotheses and the negated goal's witnesses)

    def multiple(self, v: z3.ArithRef, d: z3.ArithRef) -> z3.BoolRef:
        """v is a positive-period multiple of d: v = d*q for some (fresh) q, d > 0."""
        return z3.And(d > 0, v == self.mul(d, self.fresh("q")))

    def published(self, cfg: _Config, v: z3.ArithRef) -> z3.BoolRef:
        """v ∈ Pub: 0 <= v <= N and (v mod P = 0, or v is a hard boundary)."""
        return z3.And(v >= 0, v <= cfg.N, z3.Or(self.multiple(v, cfg.P), v == 0, v == cfg.N,
                                                self.multiple(v, cfg.E),
                                                self.multiple(v, cfg.C)))

    def boundary(self, cfg: _Config, v: z3.ArithRef) -> z3.BoolRef:
        """v is a hard boundary: 0, N, or a multiple of eval_every / checkpoint_every <= N."""
        return z3.And(v >= 0, v <= cfg.N, z3.Or(v == 0, v == cfg.N, self.multiple(v, cfg.E),
                                                self.multiple(v, cfg.C)))

    # -- sets, shown (through named witnesses: each term is divisor*q by construction)

    @staticmethod
    def in_pub(cfg: _Config, v: z3.ArithRef,
               witnesses: tuple[tuple[z3.ArithRef, z3.ArithRef], ...]) -> z3.BoolRef:
        return z3.And(v >= 0, v <= cfg.N, z3.Or(
            v == 0, v == cfg.N, *[z3.And(d > 0, v == t) for t, d in witnesses]))

    @staticmethod
    def in_boundaries(cfg: _Config, v: z3.ArithRef,
                      witnesses: tuple[tuple[z3.ArithRef, z3.ArithRef], ...]) -> z3.BoolRef:
        return z3.And(v >= 0, v <= cfg.N, z3.Or(
            v == 0, v == cfg.N,
            *[z3.And(d > 0, v == t) for t, d in witnesses if not d.eq(cfg.P)]))

    # -- closed forms

    def ceil_multiple(self, d: z3.ArithRef, x: z3.ArithRef) -> z3.ArithRef:
        """The least multiple of d that is >= x (when d > 0): d*q with d*q >= x > d*q - d."""
        t = self.mul(d, self.fresh(f"ceil_{d}"))
        self.side.append(z3.Implies(d > 0, z3.And(t >= x, t - d < x)))
        return t

    def floor_multiple(self, d: z3.ArithRef, x: z3.ArithRef) -> z3.ArithRef:
        """The greatest multiple of d that is <= x (when d > 0): d*q <= x < d*q + d."""
        t = self.mul(d, self.fresh(f"floor_{d}"))
        self.side.append(z3.Implies(d > 0, z3.And(t <= x, x < t + d)))
        return t

    def gen_version(self, cfg: _Config, b: z3.ArithRef) -> _GenVersion:
        """gen_version(b) = max(min{v ∈ Pub : v >= b - S}, last boundary <= b), for b < N."""
        lowest = _zmax(b - cfg.S, z3.IntVal(0))
        up_p = self.ceil_multiple(cfg.P, lowest)
        up_e = self.ceil_multiple(cfg.E, lowest)
        up_c = self.ceil_multiple(cfg.C, lowest)
        oldest = _zmin(up_p, z3.If(cfg.E > 0, up_e, cfg.N), z3.If(cfg.C > 0, up_c, cfg.N), cfg.N)
        down_e = self.floor_multiple(cfg.E, b)
        down_c = self.floor_multiple(cfg.C, b)
        last = _zmax(z3.IntVal(0), z3.If(cfg.E > 0, down_e, 0), z3.If(cfg.C > 0, down_c, 0))
        witnesses = ((up_p, cfg.P), (up_e, cfg.E), (up_c, cfg.C), (down_e, cfg.E),
                     (down_c, cfg.C))
        return _GenVersion(_zmax(oldest, last), lowest, oldest, last, witnesses)

    def last_published(self, cfg: _Config, u: z3.ArithRef
                       ) -> tuple[z3.ArithRef, tuple[tuple[z3.ArithRef, z3.ArithRef], ...]]:
        """max{v ∈ Pub : v <= u}, for 0 <= u < N: what the core has published once update u
        is committed (it publishes every Pub version <= committed, in order)."""
        down_p = self.floor_multiple(cfg.P, u)
        down_e = self.floor_multiple(cfg.E, u)
        down_c = self.floor_multiple(cfg.C, u)
        value = _zmax(down_p, z3.If(cfg.E > 0, down_e, 0), z3.If(cfg.C > 0, down_c, 0))
        return value, ((down_p, cfg.P), (down_e, cfg.E), (down_c, cfg.C))


def _mentions(expr: z3.ExprRef, const: z3.ExprRef) -> bool:
    """Whether the constant `const` occurs in `expr` (a syntactic check)."""
    seen: set[int] = set()
    todo = [expr]
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if e.eq(const):
            return True
        todo.extend(e.children())
    return False


# ---------------------------------------------------------------------------------------------
# The prover


class _Obligation(NamedTuple):
    name: str
    statement: str
    encoding: _Encoding
    hypotheses: list[z3.BoolRef]
    goal: z3.BoolRef
    shown: dict[str, z3.ArithRef]                      # counterexample key -> z3 variable
    explain: Callable[[z3.ModelRef], str]              # a failure, in words


def _value(model: z3.ModelRef, term: z3.ExprRef) -> int:
    value: int = model.eval(term, model_completion=True).as_long()
    return value


def _discharge(ob: _Obligation) -> LemmaResult:
    start = time.perf_counter()
    solver = z3.Solver()
    solver.set(timeout=_TIMEOUT_MS)
    solver.add(*ob.hypotheses, *ob.encoding.side, *ob.encoding.facts(), z3.Not(ob.goal))
    verdict = solver.check()
    if verdict == z3.unsat:
        return LemmaResult(ob.name, ob.statement, True, None, time.perf_counter() - start)
    # The abstraction admits a model: look for a real one, with the products put back.
    solver.add(*ob.encoding.real_products())
    verdict = solver.check()
    if verdict != z3.sat:
        reason = solver.reason_unknown() if verdict == z3.unknown else "abstraction too weak"
        return LemmaResult(ob.name, ob.statement, False, None, time.perf_counter() - start,
                           f"not proved (z3: {reason})")
    model = _shrink(solver, ob.shown)
    example = {key: _value(model, var) for key, var in ob.shown.items()}
    return LemmaResult(ob.name, ob.statement, False, example, time.perf_counter() - start,
                       ob.explain(model))


def _shrink(solver: z3.Solver, shown: dict[str, z3.ArithRef], rounds: int = 32) -> z3.ModelRef:
    """A small counterexample: every shown value bounded by the last one found, and the sum
    of the shown values bisected down (each query has 2 s; an unknown stops the search)."""
    model = solver.model()
    solver.set(timeout=2_000)
    total = z3.Sum(*shown.values())
    low = 0
    for _ in range(rounds):
        values = {key: _value(model, var) for key, var in shown.items()}
        high = sum(values.values())
        if low >= high:
            break
        middle = (low + high - 1) // 2
        solver.push()
        solver.add(*[var <= values[key] for key, var in shown.items()], total <= middle)
        verdict = solver.check()
        if verdict == z3.sat:
            model = solver.model()
        elif verdict == z3.unsat:
            low = middle + 1
        solver.pop()
        if verdict == z3.unknown:
            break
    return model


def _config_text(model: z3.ModelRef, shown: dict[str, z3.ArithRef]) -> str:
    """`key=value, ...`, leaving out the boundary intervals when they are 0 (none)."""
    values = {key: _value(model, var) for key, var in shown.items()}
    return ", ".join(f"{key}={value}" for key, value in values.items()
                     if value or key not in ("eval_every", "checkpoint_every"))


def _python_gen_version(model: z3.ModelRef, cfg: _Config, batch: z3.ArithRef,
                        value: z3.ArithRef) -> str:
    """The Python schedule's view of the counterexample (the configuration is not validated)."""
    from invar.model import schedule
    from invar.model.config import RunConfig

    n = _value(model, cfg.N)
    if n > 100_000:
        return ""
    config = RunConfig(max_staleness=_value(model, cfg.S), sync_period=_value(model, cfg.P),
                       eval_every=_value(model, cfg.E), checkpoint_every=_value(model, cfg.C),
                       total_updates=n)
    python = schedule.gen_version(config, _value(model, batch))
    verdict = "agrees" if python == _value(model, value) else "DISAGREES"
    return f"; invar.model.schedule {verdict}: gen_version={python}"


# ---------------------------------------------------------------------------------------------
# The lemmas


def _setup(assume_valid: bool,
           *batches: str) -> tuple[_Encoding, _Config, list[Any], list[Any]]:
    cfg = _Config.symbolic()
    bs = [z3.Int(name) for name in batches]
    hyps = cfg.preconditions(assume_valid) + [z3.And(b >= 0, b < cfg.N) for b in bs]
    return _Encoding(), cfg, bs, hyps


def _shown(cfg: _Config, **extra: z3.ArithRef) -> dict[str, z3.ArithRef]:
    out = {_FIELDS[k]: getattr(cfg, k) for k in "SPECN"}
    out.update(extra)
    return out


def _explain_batch(cfg: _Config, b: z3.ArithRef, gv: _GenVersion, shown: dict[str, Any]
                   ) -> Callable[[z3.ModelRef], str]:
    def explain(model: z3.ModelRef) -> str:
        bv, g, lo = _value(model, b), _value(model, gv.value), _value(model, gv.lowest)
        if g > bv:
            what = (f"no published version in [{lo}, {bv}]: the oldest allowed is {g}, "
                    f"staleness {bv - g}")
        else:
            what = f"gen_version={g}, staleness {bv - g}"
        python = _python_gen_version(model, cfg, b, gv.value)
        return f"{_config_text(model, shown)} → {what}{python}"
    return explain


def staleness_within_budget(assume_valid: bool = True) -> LemmaResult:
    """0 <= staleness(b) = b - gen_version(b) <= S for every batch b < N."""
    enc, cfg, (b,), hyps = _setup(assume_valid, "b")
    gv = enc.gen_version(cfg, b)
    shown = _shown(cfg, batch=b)
    return _discharge(_Obligation(
        "staleness_within_budget",
        "0 ≤ staleness(b) = b − gen_version(b) ≤ max_staleness for every batch b < N",
        enc, hyps, z3.And(b - gv.value >= 0, b - gv.value <= cfg.S), shown,
        _explain_batch(cfg, b, gv, shown)))


def generating_version_published(assume_valid: bool = True) -> LemmaResult:
    """gen_version(b) ∈ Pub and gen_version(b) <= b: it exists before batch b is needed."""
    enc, cfg, (b,), hyps = _setup(assume_valid, "b")
    gv = enc.gen_version(cfg, b)
    shown = _shown(cfg, batch=b)
    goal = z3.And(enc.in_pub(cfg, gv.value, gv.witnesses), gv.value <= b)
    return _discharge(_Obligation(
        "generating_version_published",
        "gen_version(b) ∈ Pub and gen_version(b) ≤ b: the version exists before batch b is "
        "needed", enc, hyps, goal, shown, _explain_batch(cfg, b, gv, shown)))


def gen_version_monotone(assume_valid: bool = True) -> LemmaResult:
    """b1 <= b2 -> gen_version(b1) <= gen_version(b2): publication order never goes back."""
    enc, cfg, (b1, b2), hyps = _setup(assume_valid, "b1", "b2")
    g1, g2 = enc.gen_version(cfg, b1), enc.gen_version(cfg, b2)
    shown = _shown(cfg, batch1=b1, batch2=b2)

    def explain(model: z3.ModelRef) -> str:
        return (f"{_config_text(model, shown)} → gen_version goes back from "
                f"{_value(model, g1.value)} to {_value(model, g2.value)}")
    return _discharge(_Obligation(
        "gen_version_monotone",
        "b1 ≤ b2 → gen_version(b1) ≤ gen_version(b2): versions are needed in publication "
        "order",
        enc, hyps + [b1 <= b2], g1.value <= g2.value, shown, explain))


def sync_period_is_P(assume_valid: bool = True) -> LemmaResult:
    """Without boundaries (E = C = 0), consecutive published versions below N are P apart and
    every batch is generated by a multiple of P; and at every number of optimizer steps K the
    schedule is the same (K occurs in neither definition; two solutions with K1 != K2 agree)."""
    enc, cfg, (b, v, w), hyps = _setup(assume_valid, "b", "v", "w")
    q = z3.Int("q")
    # (i) v = P*q a published multiple with v + P <= N: v + P is published, nothing between.
    hyps = hyps + [v == enc.mul(cfg.P, q)]
    next_v = enc.mul(cfg.P, q + 1)
    w_published = enc.published(cfg, w)
    gap = z3.And(enc.in_pub(cfg, v + cfg.P, ((next_v, cfg.P),)), next_v == v + cfg.P,
                 z3.Not(z3.And(v < w, w < v + cfg.P, w_published)))
    # (ii) every batch's generating version is a multiple of P.
    gv = enc.gen_version(cfg, b)
    on_grid = gv.value == gv.witnesses[0][0]  # = P*ceil(max(0, b - S)/P)
    no_boundaries = z3.And(cfg.E == 0, cfg.C == 0)
    # (iii) K-independence: the same batch under optimizer_steps K1 and K2.
    other = replace(cfg, K=z3.Int("K2"))
    gv_other = enc.gen_version(other, b)
    same = gv.value == gv_other.value
    for expr in (gv.value, gv_other.value, w_published, *enc.side):
        if _mentions(expr, cfg.K) or _mentions(expr, other.K):
            raise AssertionError("optimizer_steps occurs in the schedule's encoding")
    goal = z3.And(z3.Implies(z3.And(no_boundaries, v >= 0, v + cfg.P <= cfg.N),
                             z3.And(gap, on_grid)),
                  same)
    shown = _shown(cfg, batch=b, version=v)

    def explain(model: z3.ModelRef) -> str:
        def holds(formula: z3.BoolRef) -> bool:
            return bool(z3.is_true(model.eval(formula, model_completion=True)))
        if not holds(same):
            what = "gen_version differs between two values of optimizer_steps"
        elif not holds(gap):
            what = (f"the next publication after {_value(model, v)} is not "
                    f"{_value(model, v + cfg.P)}")
        else:
            what = (f"batch {_value(model, b)} is generated by version "
                    f"{_value(model, gv.value)}, not a multiple of sync_period")
        return f"{_config_text(model, shown)} → {what}"
    return _discharge(_Obligation(
        "sync_period_is_P",
        "with E = C = 0: for v a multiple of P with v + P ≤ N the next published version is "
        "v + P, and gen_version(b) is a multiple of P; Pub and gen_version do not depend on "
        "optimizer_steps", enc, hyps + [other.K >= 1, other.K != cfg.K], goal, shown, explain))


def admission_never_starves_learner(assume_valid: bool = True) -> LemmaResult:
    """When the learner waits on batch u = committed (every Pub version <= u published), batch
    u is admitted or admissible: u < N, u - committed = 0 < M, and gen_version(u) is published.
    """
    enc, cfg, (u, a), hyps = _setup(assume_valid, "u", "admitted")
    # Batches are admitted in order and never consumed before admission: u <= admitted <= N.
    hyps = hyps[:-1] + [u <= a, a <= cfg.N]
    published_upto, _ = enc.last_published(cfg, u)
    gv = enc.gen_version(cfg, a)
    admissible = z3.And(a < cfg.N, a - u < cfg.M, gv.value <= published_upto)
    goal = z3.Or(a > u, admissible)
    shown = _shown(cfg, max_inflight_batches=cfg.M, committed=u)

    def explain(model: z3.ModelRef) -> str:
        g, p = _value(model, gv.value), _value(model, published_upto)
        return (f"{_config_text(model, shown)} → the learner waits on batch {_value(model, u)}, "
                f"which needs version {g}; only versions ≤ {p} can be published before it "
                f"commits: deadlock")
    return _discharge(_Obligation(
        "admission_never_starves_learner",
        "learner waiting on batch u = committed < N, every Pub version ≤ u published: batch u "
        "is admitted, or u < N, u − committed = 0 < max_inflight_batches and gen_version(u) "
        "≤ the last published version", enc, hyps, goal, shown, explain))


def boundary_clamp(assume_valid: bool = True) -> LemmaResult:
    """With eval boundaries every E >= 1: staleness(b) <= E - 1, so <= min(S, E - 1)."""
    enc, cfg, (b,), hyps = _setup(assume_valid, "b")
    gv = enc.gen_version(cfg, b)
    stale = b - gv.value
    shown = _shown(cfg, batch=b)
    return _discharge(_Obligation(
        "boundary_clamp",
        "eval_every = E ≥ 1: staleness(b) ≤ E − 1, hence ≤ min(max_staleness, E − 1)",
        enc, hyps + [cfg.E >= 1],
        z3.And(stale <= cfg.E - 1, stale <= _zmin(cfg.S, cfg.E - 1)), shown,
        _explain_batch(cfg, b, gv, shown)))


def encoding_is_the_definition(assume_valid: bool = True) -> LemmaResult:
    """The closed forms are the declarative definitions: oldest_allowed(b) is the least Pub
    version >= max(0, b - S), last_boundary(b) the greatest hard boundary <= b, and
    last_published(u) the greatest Pub version <= u."""
    enc, cfg, (b, u, w1, w2, w3), hyps = _setup(assume_valid, "b", "u", "w1", "w2", "w3")
    gv = enc.gen_version(cfg, b)
    lp, lp_witnesses = enc.last_published(cfg, u)
    least = z3.And(enc.in_pub(cfg, gv.oldest_allowed, gv.witnesses),
                   gv.oldest_allowed >= gv.lowest,
                   z3.Not(z3.And(gv.lowest <= w1, w1 < gv.oldest_allowed,
                                 enc.published(cfg, w1))))
    greatest_boundary = z3.And(enc.in_boundaries(cfg, gv.last_boundary, gv.witnesses),
                               gv.last_boundary <= b,
                               z3.Not(z3.And(gv.last_boundary < w2, w2 <= b,
                                             enc.boundary(cfg, w2))))
    greatest_pub = z3.And(enc.in_pub(cfg, lp, lp_witnesses), lp <= u,
                          z3.Not(z3.And(lp < w3, w3 <= u, enc.published(cfg, w3))))
    shown = _shown(cfg, batch=b, committed=u)
    return _discharge(_Obligation(
        "encoding_is_the_definition",
        "the closed forms equal min{v ∈ Pub : v ≥ max(0, b − S)}, max{boundary ≤ b} and "
        "max{v ∈ Pub : v ≤ u}", enc, hyps, z3.And(least, greatest_boundary, greatest_pub),
        shown, lambda model: f"{_config_text(model, shown)} → the closed form is not the "
                             f"definition"))


def multiplication_facts(assume_valid: bool = True) -> LemmaResult:
    """The facts the purified proofs rely on hold of real (nonlinear) multiplication."""
    d, x, y = z3.Ints("d x y")
    start = time.perf_counter()
    solver = z3.Solver()
    solver.set(timeout=_TIMEOUT_MS)
    solver.add(z3.Not(z3.And(z3.Implies(z3.And(d > 0, x < y), d * x + d <= d * y),
                             z3.Implies(x == y, d * x == d * y),
                             z3.Implies(y == x + 1, d * y == d * x + d),
                             d * 0 == 0)))
    verdict = solver.check()
    return LemmaResult(
        "multiplication_facts",
        "d > 0 ∧ x < y → d·x + d ≤ d·y; x = y → d·x = d·y; d·(x + 1) = d·x + d; "
        "d·0 = 0 (the facts used for every product d·q)",
        verdict == z3.unsat, None, time.perf_counter() - start,
        "" if verdict == z3.unsat else f"z3: {verdict}")


LEMMAS: tuple[Callable[[bool], LemmaResult], ...] = (
    multiplication_facts,
    encoding_is_the_definition,
    staleness_within_budget,
    generating_version_published,
    gen_version_monotone,
    sync_period_is_P,
    admission_never_starves_learner,
    boundary_clamp,
)


def check_lemmas(assume_valid: bool = True) -> list[LemmaResult]:
    """Every lemma, for all parameter values; `assume_valid=False` drops P <= S + 1."""
    return [lemma(assume_valid) for lemma in LEMMAS]


# ---------------------------------------------------------------------------------------------
# Concrete evaluation (cross-validation against invar.model.schedule)


def gen_version_z3(max_staleness: int, sync_period: int, eval_every: int,
                   checkpoint_every: int, total_updates: int, batch: int) -> int:
    """Solve the z3 definition of gen_version for concrete values, checking it is unique."""
    enc = _Encoding()
    cfg = _Config.symbolic()
    b = z3.Int("b")
    gv = enc.gen_version(cfg, b)
    solver = z3.Solver()
    solver.set(timeout=_TIMEOUT_MS)
    solver.add(max_staleness == cfg.S, sync_period == cfg.P, eval_every == cfg.E,
               checkpoint_every == cfg.C, total_updates == cfg.N, b == batch,
               *enc.side, *enc.real_products())
    if solver.check() != z3.sat:
        raise ValueError("the z3 definition of gen_version has no solution here")
    value = _value(solver.model(), gv.value)
    solver.add(gv.value != value)
    if solver.check() != z3.unsat:
        raise ValueError("the z3 definition of gen_version is not unique here")
    return value


def published_z3(max_staleness: int, sync_period: int, eval_every: int, checkpoint_every: int,
                 total_updates: int, version: int) -> bool:
    """Whether the z3 definition of Pub holds of `version` for concrete values."""
    enc = _Encoding()
    cfg = _Config.symbolic()
    v = z3.Int("v")
    solver = z3.Solver()
    solver.add(max_staleness == cfg.S, sync_period == cfg.P, eval_every == cfg.E,
               checkpoint_every == cfg.C, total_updates == cfg.N, v == version,
               enc.published(cfg, v))
    solver.add(*enc.real_products())
    return bool(solver.check() == z3.sat)


def agreement_cases() -> list[tuple[int, int, int, int, int, int]]:
    """(S, P, E, C, N, b) on which the Python schedule is compared with the z3 definitions."""
    rng = random.Random(0)
    cases = []
    # Exhaustive over a small box, valid configurations and every batch ...
    for s, e, c, n in itertools.product(range(3), (0, 1, 2, 3), (0, 2, 5), (1, 2, 5, 7)):
        p = rng.randint(1, s + 1)
        b = rng.randrange(n)
        cases.append((s, p, e, c, n, b))
    # ... random larger ones, including P > S + 1 (the definitions agree there too) ...
    for _ in range(150):
        s = rng.randint(0, 12)
        p = rng.randint(1, s + 1) if rng.random() < 0.8 else rng.randint(s + 2, s + 8)
        e, c = rng.choice([0, 0, rng.randint(1, 40)]), rng.choice([0, 0, rng.randint(1, 40)])
        n = rng.randint(1, 60)
        cases.append((s, p, e, c, n, rng.randrange(n)))
    # ... and the edges: first and last batch, boundaries at and just past a batch.
    for s, p, e, c, n in [(0, 1, 0, 0, 1), (3, 4, 0, 0, 10), (3, 4, 5, 0, 10), (5, 2, 3, 4, 13),
                          (1, 1, 1, 1, 4), (7, 8, 100, 100, 9), (2, 3, 10, 0, 10)]:
        for b in range(n):
            cases.append((s, p, e, c, n, b))
    return cases


def python_schedule_is_the_definition(assume_valid: bool = True) -> LemmaResult:
    """`invar.model.schedule`'s gen_version and Pub equal the z3 definitions the lemmas are
    proved of, on `agreement_cases`: the lemmas hold of the code that runs. (A run cannot
    see a wrong definition: the canonical schedule it is compared with shares it.)"""
    from invar.model import schedule
    from invar.model.config import RunConfig
    start = time.perf_counter()
    cases = agreement_cases()
    statement = (f"the Python schedule is the proven one: gen_version(b) and v ∈ Pub (v from "
                 f"−1 to N + 1) equal the z3 definitions on {len(cases)} configurations and "
                 f"batches")
    detail = ""
    for s, p, e, c, n, b in cases:
        where = f"S={s} P={p} E={e} C={c} N={n}"
        try:
            config = RunConfig(max_staleness=s, sync_period=p, eval_every=e,
                               checkpoint_every=c, total_updates=n)
            python, proven = schedule.gen_version(config, b), gen_version_z3(s, p, e, c, n, b)
            if python != proven:
                detail = f"{where}: gen_version({b}) = {python}, the definition gives {proven}"
            elif b == 0:
                wrong = [v for v in range(-1, n + 2)
                         if schedule.is_published(config, v) != published_z3(s, p, e, c, n, v)]
                if wrong:
                    detail = f"{where}: is_published({wrong[0]}) is not the definition's"
        except Exception as error:  # a schedule that raises is no definition either
            detail = f"{where}, b={b}: {type(error).__name__}: {error}"
        if detail:
            break
    return LemmaResult("python_schedule_is_the_definition", statement, not detail, None,
                       time.perf_counter() - start, detail)


# ---------------------------------------------------------------------------------------------
# Rendering


def format_results(results: list[LemmaResult], width: int = 80) -> str:
    """A plain-text table, statements wrapped to `width` (safe to print through rich)."""
    name_width = max((len(r.name) for r in results), default=5)
    rule = "-" * min(width, name_width + 19)

    def wrapped(text: str) -> list[str]:
        return textwrap.wrap(text, width=width, initial_indent="    ",
                             subsequent_indent="      ", break_on_hyphens=False)

    lines = [f"{'lemma':<{name_width}}  {'result':<7}  {'seconds':>8}", rule]
    for r in results:
        verdict = "holds" if r.holds else "FAILS"
        lines.append(f"{r.name:<{name_width}}  {verdict:<7}  {r.seconds:>8.3f}")
        lines.extend(wrapped(r.statement))
        if not r.holds:
            if r.counterexample is not None:
                text = r.detail or ", ".join(f"{k}={v}" for k, v in r.counterexample.items())
                lines.extend(wrapped(f"counterexample: {text}"))
            else:
                lines.extend(wrapped(r.detail or "not proved"))
    total = sum(r.seconds for r in results)
    held = sum(r.holds for r in results)
    lines.append(rule)
    lines.append(f"{held}/{len(results)} lemmas hold for all parameter values ({total:.3f} s)")
    return "\n".join(lines)
