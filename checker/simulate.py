"""Random simulation (``Checker.simulate()``; see `Checker.simulate` for what it checks):
reproducible random walks from the initial states, never a complete search."""

from __future__ import annotations

import random
import time
from typing import Any

from checker.engine import (
    Coverage,
    Found,
    Housekeeping,
    ModelContext,
    Outcome,
    PropertyTracker,
    SearchOptions,
)
from checker.result import Progress
from checker.trace import Trace

__all__ = ["run_simulation"]


def run_simulation(
    options: SearchOptions, ctx: ModelContext, runs: int, max_depth: int, seed: int
) -> Outcome:
    rng = random.Random(seed)
    props = PropertyTracker(ctx, options.finish_when)
    start = time.perf_counter()
    cov = Coverage(ctx, options.coverage)
    inits = ctx.initial()
    if not inits:
        raise ValueError("the model has no initial state")
    seen: set[int] = set()
    generated = 0
    max_seen = 0
    eventually = list(ctx.eventually)
    ev_found: dict[str, Found] = {}
    housekeeping = Housekeeping(options, start)
    runs_done = 0
    for _run in range(runs):
        if props.stop or options.control.stop_requested.is_set():
            break
        s, f = inits[rng.randrange(len(inits))]
        path: list[tuple[Any, Any]] = [(None, s)]
        index: dict[int, int] = {f: 0}
        ev_open = [(n, p) for n, p in eventually if n not in ev_found and not p(s)]
        generated += 1
        seen.add(f)
        _check_state(props, s, f, path)
        for depth in range(max_depth + 1):
            succs = list(ctx.successors(s))
            fin = ctx.final_state(s)
            if fin or not succs:
                _check_end(props, s, f, depth, len(succs), fin, path)
                for name, _p in ev_open:
                    ev_found.setdefault(
                        name, Found(name, "eventually", depth, f, trace=Trace(tuple(path)))
                    )
                break
            if depth == max_depth:
                break
            a, t = succs[rng.randrange(len(succs))]
            generated += 1
            if cov.append is not None:
                cov.append(a)
            path.append((a, t))
            if props.transition:
                for name, pred in props.transition:
                    if not pred(s, a, t):
                        trace = Trace(tuple(path))
                        props.record(
                            Found(name, "transition", depth + 1, f, a, t, True, trace=trace)
                        )
            g = ctx.fp(t)
            seen.add(g)
            if depth + 1 > max_seen:
                max_seen = depth + 1
            _check_state(props, t, g, path)
            if ev_open:
                ev_open = [(n, p) for n, p in ev_open if not p(t)]
                if g in index and ev_open:
                    loop = index[g]
                    for name, _p in ev_open:
                        trace = Trace(tuple(path), loop)
                        ev_found.setdefault(
                            name, Found(name, "eventually", depth + 1, g, trace=trace)
                        )
                    ev_open = []
                index.setdefault(g, depth + 1)
            s, f = t, g
        runs_done += 1
        ctx.sample_keys(path, 0, at=1)
        now = time.perf_counter()
        report = housekeeping.progress_due(now)
        if report is not None:
            report(
                Progress("simulate", generated, len(seen), runs - runs_done, max_seen, now - start)
            )
    elapsed = time.perf_counter() - start
    if options.progress:
        options.progress(
            Progress("simulate", generated, len(seen), 0, max_seen, elapsed, done=True)
        )
    found = dict(props.found)
    found.update(ev_found)
    out = Outcome(
        "simulate",
        generated,
        len(seen),
        max_seen,
        elapsed,
        cov.kinds(),
        False,
        "simulation",
        found,
        None,
    )
    out.notes.append(f"{runs_done} random walks, at most {max_depth} steps each, seed {seed}")
    return out


def _check_state(props: PropertyTracker, s: Any, f: int, path: list[tuple[Any, Any]]) -> None:
    depth = len(path) - 1
    for name, pred in props.always:
        if not pred(s):
            props.record(Found(name, "always", depth, f, trace=Trace(tuple(path))))
    for name, pred in props.sometimes:
        if pred(s):
            props.record(Found(name, "sometimes", depth, f, trace=Trace(tuple(path))))


def _check_end(
    props: PropertyTracker,
    s: Any,
    f: int,
    depth: int,
    n: int,
    fin: bool,
    path: list[tuple[Any, Any]],
) -> None:
    if fin:
        for name, pred in props.final:
            if not pred(s):
                props.record(Found(name, "final", depth, f, trace=Trace(tuple(path))))
    elif n == 0 and props.deadlock:
        props.record(Found("deadlock", "deadlock", depth, f, trace=Trace(tuple(path))))
