"""The hot loop of the breadth-first engines, specialised per configuration.

Expanding states is where all the time goes (for 2PC with 7 RMs: 2.7 M transitions to
fingerprint and look up).  A single loop full of ``if feature_enabled:`` tests pays for every
feature on every transition, so the loop is generated from a template holding only the lines a
given configuration needs (coverage by type or by action, transition properties, a
fingerprint key, an integer-key fast path, Python's hash as the fingerprint, graph
recording), compiled once and cached; the parallel engine's workers run it too.  The
generated code is plain Python and can be printed with ``expander_source(...)`` for inspection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ExpandEnv", "expander", "expander_source"]

_TWO64 = 1 << 64


@dataclass
class ExpandEnv:
    """Everything the generated loop reads (bound once per chunk)."""

    succ: Callable[[Any], Any]
    key: Callable[[Any], Any] | None
    fp: Callable[[Any], int]
    visited: Any  # a dict fingerprint -> parent, or with `batch` a VisitedStates
    nxt_append: Callable[[Any], None]
    cov_buf: list[Any] | None  # the coverage buffer, of actions or their types' codes (None: off)
    props: Any
    is_final: Callable[[Any], bool] | None
    graph_edge: Callable[..., None] | None = None
    """`(f, g, action)`, or with `graph_pairs` the recorder's list append of `(f, g)`."""
    graph_node: Callable[[Any, int], None] | None = None
    graph_final: Callable[[int], None] | None = None
    cov_code: dict[type, int] | None = None  # action type -> its code (`Coverage.code`)
    cov_new_code: Callable[[type], int] | None = None


NO_SUCCESSOR = object()  # sentinel: the loop over successors did not run

_cache: dict[tuple[Any, ...], Callable[..., int]] = {}


def expander_source(
    *,
    coverage: bool,
    coverage_types: bool = False,
    transition: bool,
    key: bool,
    int_keys: bool,
    check_new: bool,
    always: int = -1,
    sometimes: int = -1,
    fast: bool = False,
    final: bool,
    deadlock: bool,
    graph: bool,
    graph_pairs: bool = False,
    batch: bool = False,
) -> str:
    """The source of the specialised ``expand(chunk, depth, env) -> generated`` function.

    With `check_new`, `always` and `sometimes` are the numbers of such properties still open:
    their checks are then unrolled, each predicate bound to a local once per chunk (a loop
    over the lists, unpacking a pair per property and state, when they are -1).

    With `batch`, the visited set is a `checker.statefiles.VisitedStates`: the loop gathers every
    transition's target, fingerprint and source, and the chunk's new states are those its one
    `add_new` call returns, checked and queued in the order they were met, as a dict lookup
    per transition would have found them."""
    body = [
        "def expand(chunk, depth, env):",
        "    succ = env.succ",
        "    key = env.key",
        "    fp = env.fp",
        "    visited = env.visited",
        "    nxt_append = env.nxt_append",
        "    props = env.props",
        "    always = props.always",
        "    sometimes = props.sometimes",
        "    fail_always = props.fail_always",
        "    hit_sometimes = props.hit_sometimes",
        "    transition = props.transition",
        "    fail_transition = props.fail_transition",
        "    check_expanded = props.check_expanded",
        "    is_final = env.is_final",
        "    graph_edge = env.graph_edge",
        "    graph_node = env.graph_node",
        "    graph_final = env.graph_final",
        "    d1 = depth + 1",
    ]
    add = body.append
    unroll = check_new and always >= 0 and sometimes >= 0
    if batch:
        add("    met_t = []")
        add("    met_g = []")
        add("    met_f = []")
    if unroll:
        # The lists are read once per chunk, as the loops below read them: a property closed
        # during a chunk is still checked until its end (`PropertyTracker.record` keeps the
        # first discovery).
        for i in range(always):
            add(f"    always_name{i}, always{i} = always[{i}]")
        for i in range(sometimes):
            add(f"    sometimes_name{i}, sometimes{i} = sometimes[{i}]")
    # With coverage on, every transition is appended to the coverage buffer anyway: its growth
    # is the number of transitions, and "no successor" is seen from `t` keeping a sentinel,
    # so the loop needs no counter of its own.
    if coverage:
        add("    cov_buf = env.cov_buf")
        add("    start = len(cov_buf)")
        if coverage_types:
            add("    cov_code = env.cov_code")
            add("    cov_new_code = env.cov_new_code")
        add("    for s, f in chunk:")
        add("        t = NO_SUCCESSOR")
        add("        for a, t in succ(s):")
        # ``cov_buf.append(...)``, not a bound method kept in a local: the interpreter then
        # appends inline (a specialised instruction).  By type, the buffer takes the small-int
        # code of ``type(a)`` (`Coverage.code`; ``type(x)`` and a dict's item are specialised
        # instructions too, a try costs nothing until it catches): the action is freed with its
        # transition, and the flush counts bytes in C.
        if coverage_types:
            add("            try:")
            add("                cov_buf.append(cov_code[type(a)])")
            add("            except KeyError:")
            add("                cov_buf.append(cov_new_code(type(a)))")
        else:
            add("            cov_buf.append(a)")
        empty = "t is NO_SUCCESSOR"
    else:
        add("    generated = 0")
        add("    for s, f in chunk:")
        add("        n = 0")
        add("        for a, t in succ(s):")
        add("            n += 1")
        empty = "n == 0"
    if transition:
        # PropertyTracker.check_transition, inlined: a frame less per transition
        add("            for pn, pp in transition:")
        add("                if not pp(s, a, t):")
        add("                    fail_transition(pn, f, depth, a, t)")
    k = "k" if key else "t"
    if key:
        add("            k = key(t)")
    if int_keys:
        add(f"            g = {k} if {k}.__class__ is int and -1 < {k} < {_TWO64} else fp({k})")
    elif fast:
        # checker.fingerprint.fast_fingerprint, inlined: a builtin call, no Python frame
        add(f"            g = hash({k})")
    else:
        add(f"            g = fp({k})")
    if graph:
        # An unlabelled graph is recorded as a list of (f, g): its append, called directly.
        add("            graph_edge((f, g))" if graph_pairs else "            graph_edge(f, g, a)")
    if batch:
        add("            met_t.append(t)")
        add("            met_g.append(g)")
        add("            met_f.append(f)")
    else:
        add("            if g in visited:")
        add("                continue")
        add("            visited[g] = f")
        _add_new_state(add, "            ", unroll, check_new, always, sometimes, graph)
    if not coverage:
        add("        generated += n")
    if final:
        add("        fin = is_final(s)")
        add(f"        if fin or {empty}:")
        add(f"            check_expanded(s, f, depth, 0 if {empty} else 1, fin)")
        if graph:
            add("            if fin:")
            add("                graph_final(f)")
    elif deadlock:
        add(f"        if {empty}:")
        add("            check_expanded(s, f, depth, 0, False)")
    if batch:
        add("    for i in visited.add_new(met_g, met_f):")
        add("        t = met_t[i]")
        add("        g = met_g[i]")
        _add_new_state(add, "        ", unroll, check_new, always, sometimes, graph)
    add("    return len(cov_buf) - start" if coverage else "    return generated")
    return "\n".join(body) + "\n"


def _add_new_state(add: Callable[[str], None], pad: str, unroll: bool, check_new: bool,
                   always: int, sometimes: int, graph: bool) -> None:
    """The lines for a state `t` (fingerprint `g`) first visited: its checks, its queueing."""
    if unroll:
        for i in range(always):
            add(f"{pad}if not always{i}(t):")
            add(f"{pad}    fail_always(always_name{i}, g, d1)")
        for i in range(sometimes):
            add(f"{pad}if sometimes{i}(t):")
            add(f"{pad}    hit_sometimes(sometimes_name{i}, g, d1)")
    elif check_new:
        add(f"{pad}for pn, pp in always:")
        add(f"{pad}    if not pp(t):")
        add(f"{pad}        fail_always(pn, g, d1)")
        add(f"{pad}for pn, pp in sometimes:")
        add(f"{pad}    if pp(t):")
        add(f"{pad}        hit_sometimes(pn, g, d1)")
    if graph:
        add(f"{pad}graph_node(t, g)")
    add(f"{pad}nxt_append((t, g))")


def expander(**flags: Any) -> Callable[[list[tuple[Any, int]], int, ExpandEnv], int]:
    """The compiled, cached expand function for `flags` (see `expander_source`)."""
    cache_key = tuple(sorted(flags.items()))
    fn = _cache.get(cache_key)
    if fn is None:
        namespace: dict[str, Any] = {"NO_SUCCESSOR": NO_SUCCESSOR}
        # One file name per variant: profilers tell functions apart by (file, line, name), and
        # a search switches variants as its properties are decided.
        filename = f"<checker-expand-{len(_cache)}>"
        exec(compile(expander_source(**flags), filename, "exec"), namespace)  # noqa: S102
        fn = namespace["expand"]
        _cache[cache_key] = fn
    return fn
