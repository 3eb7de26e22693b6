"""Liveness checks run after the main search: ``eventually`` properties and livelock.

* `check_eventually` explores, depth first, only the states that do NOT satisfy the predicate
  (from the initial states that do not).  The property is violated iff that restricted search
  reaches a final state, reaches a state without successors, or closes a cycle through a state
  on the DFS stack: each is a maximal path (finite, ending in a final state or a deadlock; or
  infinite, a lasso) on which the predicate never holds.  Final states end paths.  Needs no
  recorded graph; costs one extra exploration of the non-satisfying region.
* `check_livelock` works on the recorded graph (networkx): every reachable state must be able
  to reach a final state.  States that cannot are closed under successors, so they contain a
  terminal strongly connected component without final states; the counterexample is a
  shortest path from an initial state into such a component followed by a shortest cycle in
  it (a lasso), or just the path when the component is a single state without successors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from checker.engine import ModelContext
from checker.result import PropertyResult, Verdict
from checker.trace import Trace

__all__ = ["check_eventually", "check_livelock"]


def check_eventually(
    ctx: ModelContext,
    name: str,
    pred: Callable[[Any], bool],
    max_depth: int | None = None,
    max_states: int | None = None,
) -> PropertyResult:
    """Decide ``eventually(pred)`` (see the module docstring)."""
    succ = ctx.successors
    fp = ctx.fp
    final = ctx.final_state
    done: set[int] = set()
    on_stack: dict[int, int] = {}
    bounded = False
    for s0, f0 in ctx.initial():
        if pred(s0) or f0 in done:
            continue
        # frames: (state, fp, action into it, iterator over successors or None)
        path: list[tuple[Any, int, Any]] = []
        iters: list[Iterator[tuple[Any, Any]]] = []

        # Called only within this iteration of the loop: the defaults bind this iteration's
        # path and iters explicitly.
        def push(
            state: Any,
            f: int,
            action: Any,
            path: list[tuple[Any, int, Any]] = path,
            iters: list[Iterator[tuple[Any, Any]]] = iters,
        ) -> PropertyResult | None:
            nonlocal bounded
            path.append((state, f, action))
            on_stack[f] = len(path) - 1
            done.add(f)
            if final(state):
                return _violation(name, path, None, "a final state is reached without it")
            succs = list(succ(state))
            if not succs:
                return _violation(
                    name, path, None, "a state without successors is reached without it"
                )
            if max_depth is not None and len(path) - 1 >= max_depth:
                bounded = True
                succs = []
            iters.append(iter(succs))
            return None

        hit = push(s0, f0, None)
        if hit is not None:
            return hit
        while iters:
            if max_states is not None and len(done) >= max_states:
                bounded = True
                break
            step = next(iters[-1], None)
            if step is None:
                iters.pop()
                state, f, _ = path.pop()
                del on_stack[f]
                continue
            action, t = step
            if pred(t):
                continue
            g = fp(t)
            if g in on_stack:
                loop = on_stack[g]
                steps = [(a, st) for st, _, a in path] + [(action, t)]
                return PropertyResult(
                    name,
                    "eventually",
                    Verdict.VIOLATED,
                    Trace(tuple(steps), loop),
                    "a cycle never meets it",
                )
            if g in done:
                continue
            hit = push(t, g, action)
            if hit is not None:
                return hit
        if max_states is not None and len(done) >= max_states:
            break
    note = "bounded search" if bounded else ""
    return PropertyResult(name, "eventually", Verdict.HOLDS, note=note)


def _violation(
    name: str, path: list[tuple[Any, int, Any]], loop: int | None, note: str
) -> PropertyResult:
    steps = tuple((a, st) for st, _, a in path)
    return PropertyResult(name, "eventually", Verdict.VIOLATED, Trace(steps, loop), note)


def check_livelock(ctx: ModelContext, graph: Any) -> PropertyResult:
    """From every reachable state a final state stays reachable (needs the full graph)."""
    import networkx as nx

    finals = [n for n, d in graph.nodes(data=True) if d.get("final")]
    can_finish = set(finals)
    queue = deque(finals)
    pred = graph.pred
    while queue:
        v = queue.popleft()
        for u in pred[v]:
            if u not in can_finish:
                can_finish.add(u)
                queue.append(u)
    bad = [n for n in graph.nodes if n not in can_finish]
    if not bad:
        return PropertyResult("livelock", "livelock", Verdict.HOLDS)
    sub = graph.subgraph(bad)
    cond = nx.condensation(sub)
    members = cond.graph["mapping"]  # node -> scc index
    terminal = {c for c in cond.nodes if cond.out_degree(c) == 0}
    targets = {n for n in bad if members[n] in terminal}
    inits = [n for n, d in graph.nodes(data=True) if d.get("init")]
    # shortest path from an initial state into a terminal bad component
    parent: dict[Any, Any] = {n: None for n in inits}
    queue = deque(inits)
    target = None
    while queue:
        v = queue.popleft()
        if v in targets:
            target = v
            break
        for w in graph.succ[v]:
            if w not in parent:
                parent[w] = v
                queue.append(w)
    assert target is not None, "a reachable bad state leads into a terminal component"
    chain = [target]
    while parent[chain[-1]] is not None:
        chain.append(parent[chain[-1]])
    chain.reverse()
    comp = cond.nodes[members[target]]["members"]
    loop_start: int | None = None
    if len(comp) > 1 or graph.has_edge(target, target):
        # shortest cycle target -> ... -> target inside the component
        back: dict[Any, Any] = {}
        queue = deque()
        for w in graph.succ[target]:
            if w in comp and w not in back:
                back[w] = target
                queue.append(w)
        while target not in back and queue:
            v = queue.popleft()
            for w in graph.succ[v]:
                if w in comp and w not in back:
                    back[w] = v
                    queue.append(w)
        cycle = [target]
        v = back[target]
        while v != target:
            cycle.append(v)
            v = back[v]
        cycle.reverse()  # nodes after target, ending with target
        loop_start = len(chain) - 1
        chain = chain + cycle
        note = "a cycle from which no final state is reachable"
    else:
        note = "a non-final state without successors"
    steps = ctx.replay(chain)
    return PropertyResult(
        "livelock", "livelock", Verdict.VIOLATED, Trace(tuple(steps), loop_start), note
    )
