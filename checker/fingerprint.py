"""State fingerprints: fast ones for the visited set of one process, stable ones for what leaves it.

A fingerprint is a 64-bit int standing for a state (more exactly, its `fingerprint_key`) in the
visited set, in parent pointers, in checkpoints and when states are exchanged between worker
processes.  Two kinds, as TLC's: a collision (two distinct states, one fingerprint) makes the
search skip a state, so every result reports the probability of one (`collision_probability`).

**Fast** (`fast_fingerprint`): ``hash(key)``, Python's own hash, computed in C (~80 ns for a
named tuple of a tuple of strings, a string and two frozensets; strings and frozensets cache
theirs), a signed 64-bit int on 64-bit builds.  It is the engine's default for ordinary states
(`hashes_by_value` says which), and is valid *within one process and its forks* only:
``str``/``bytes`` hashes are salted per interpreter (``PYTHONHASHSEED``), ``None``'s is its
address before Python 3.12.  Forked BFS
workers share the hash secret of the process that forked them, so they can route states by it.
Python's hash is not a fingerprint function by design: unequal values of these types collide
*structurally* in a few documented cases, which the random-fingerprint estimate does not cover:
``hash(-1) == hash(-2)`` (-1 is C's error code); ints congruent modulo ``2**61 - 1`` (only ints
of magnitude >= 2**61); an enum member and the string of its name; and a frozenset's hash is a
XOR of its elements' (mixed) hashes, so sets drawn from a universe of more than 64 elements can
collide (only when they differ in many elements).  A model whose states may hold such values
passes ``fingerprints="stable"`` to `Checker`.

**Stable** (`fingerprint`): the same in every process and every run, needed where states leave
the process: checkpoints (a resumed search re-fingerprints the states it generates), graphs
written to files, and partitioning across processes that do not share a hash seed.  How a key is
fingerprinted (measured on CPython 3.11, this machine, ns per call):

* a non-negative ``int`` below 2**64 is **its own fingerprint** (~75 ns, and in the engine's
  loop no call at all): exact and collision free, in both kinds, which makes compactly encoded
  states (bit-packed ints) the fastest possible keys;
* otherwise the key is encoded canonically and the first 8 bytes of its SHA-1 are taken.
  SHA-1 was the fastest stable digest here (SHA-1 ~370 ns, MD5 ~480, BLAKE2b/8 ~550 for a
  100-byte input; only the first 64 bits are used, as a hash, not for security).
* the canonical encoding is ``marshal.dumps(key, 2)`` when `marshal` accepts the key
  (exact ``tuple``/``int``/``str``/``bytes``/``float``/``bool``/``None`` trees; ~300 ns, about
  twice as fast as pickle).  Version 2 is used on purpose: versions >= 3 (the default) and
  ``pickle`` both emit back-references for objects that are *shared*, so two equal states
  built differently would get different bytes – and be counted twice.
  Keys holding sets, dataclasses, enums, named tuples or anything else go through `canonical`
  first, which rewrites them to a marshal-able tree of tagged nodes: sets and dicts sorted by
  the encoding of their elements, dataclasses as (class name, the values of the fields that
  take part in equality), enums as (class name, member name); unknown objects fall back to a
  memo-free pickle.  Sets are detected by their marshal type codes (a byte scan; a false alarm
  costs a structural check); dicts too.  The two paths' encodings are disjoint (the canonical
  one is prefixed with 0xFF).

Whole-pipeline figures of the stable kind (``fingerprint(key)``, this machine): int ~80 ns;
6-tuple of ints/strs ~0.9-1.1 µs; a tuple holding a frozenset ~4 µs; a small frozen dataclass
with sets inside ~7 µs (the canonical path is pure Python).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
import marshal
import pickle
from collections.abc import Hashable, Iterable
from typing import Any

__all__ = [
    "MASK64",
    "canonical",
    "collision_probability",
    "encode_key",
    "fast_fingerprint",
    "fingerprint",
    "hashes_by_value",
    "owner_of",
]

MASK64 = (1 << 64) - 1

_sha1 = hashlib.sha1
_dumps = marshal.dumps
_from_bytes = int.from_bytes
_MARSHAL_SIMPLE = (int, str, bytes, float, bool, type(None))
# marshal type codes of set "<" (60), frozenset ">" (62) and dict "{" (123): their order is not
# canonical.  (An int needle: ``b"<" in data`` first tries the needle as an int, raises and
# clears a TypeError, and costs ~400 ns.)
_field_names: dict[type, tuple[str, ...]] = {}


def _pickle_canonical(obj: Any) -> bytes:
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=5)
    pickler.fast = True  # no memo: equal objects give equal bytes whatever their sharing
    pickler.dump(obj)
    return buf.getvalue()


def _unordered_inside(obj: Any) -> bool:
    """True when a marshal-able tree holds a set or dict (whose order is not canonical)."""
    cls = obj.__class__
    if cls is frozenset or cls is set or cls is dict:
        return True
    if cls is tuple or cls is list:
        for x in obj:
            if _unordered_inside(x):
                return True
    return False


def _sort_key(item: Any) -> bytes:
    return _dumps(item, 2)


def canonical(obj: Any) -> Any:
    """A marshal-able tree, equal for equal values, in which every tuple is a tagged node.

    ``tuple -> ("t", *items)``, ``frozenset/set -> ("set", *items sorted by encoding)``,
    ``dict -> ("dict", *("kv", k, v) sorted)``, ``list -> ("list", *items)``,
    enum -> ``("enum", class, member name)``, dataclass -> ``("dc", class, *fields)``, tuple
    subclass (named tuple) -> ``("nt", class, *items)``, int subclass -> ``("int", class,
    value)``, anything else -> ``("pickle", memo-free pickle)``; ``None``, ``bool``, ``int``,
    ``float``, ``str`` and ``bytes`` stay as they are.  Because *every* tuple in the result is
    a tagged node, no user value can be mistaken for a tag.
    """
    cls = obj.__class__
    if cls in _MARSHAL_SIMPLE:
        return obj
    if cls is tuple:
        return ("t", *[canonical(x) for x in obj])
    if cls is frozenset or cls is set:
        return ("set", *sorted((canonical(x) for x in obj), key=_sort_key))
    if cls is dict:
        items = (("kv", canonical(k), canonical(v)) for k, v in obj.items())
        return ("dict", *sorted(items, key=_sort_key))
    if cls is list:
        return ("list", *[canonical(x) for x in obj])
    name = cls.__module__ + "." + cls.__qualname__
    if isinstance(obj, enum.Enum):
        return ("enum", name, obj.name)
    names = _field_names.get(cls)
    if names is None and isinstance(cls, type) and dataclasses.is_dataclass(cls):
        # The fields that take part in equality only: equal states, one fingerprint.
        names = tuple(f.name for f in dataclasses.fields(cls) if f.compare)
        _field_names[cls] = names
    if names is not None:
        return ("dc", name, *[canonical(getattr(obj, n)) for n in names])
    if isinstance(obj, tuple):  # named tuples and other tuple subclasses
        return ("nt", name, *[canonical(x) for x in obj])
    if isinstance(obj, int):  # bool is exact (above); other int subclasses
        return ("int", name, int(obj))
    return ("pickle", _pickle_canonical(obj))


# Encodings of the canonical path start with this byte, never the first byte of a marshal
# (version 2) encoding, so plain keys (fast path) and tagged trees can never collide.
_CANON_PREFIX = b"\xff"


def encode_key(key: Hashable) -> bytes:
    """The canonical byte encoding of a fingerprint key (what `fingerprint` hashes)."""
    try:
        data = _dumps(key, 2)  # type: ignore[arg-type]  # a ValueError when not marshallable
    except ValueError:
        return _CANON_PREFIX + _dumps(canonical(key), 2)
    # The set/dict type codes may also be plain payload bytes: only real ones need sorting.
    if (60 in data or 62 in data or 123 in data) and _unordered_inside(key):
        return _CANON_PREFIX + _dumps(canonical(key), 2)
    return data


def fingerprint(key: Hashable) -> int:
    """A stable 64-bit fingerprint of `key` (see the module docstring)."""
    if key.__class__ is int and 0 <= key <= MASK64:
        return key
    try:
        data = _dumps(key, 2)  # type: ignore[arg-type]  # a ValueError when not marshallable
    except ValueError:
        data = _CANON_PREFIX + _dumps(canonical(key), 2)
    else:
        if (60 in data or 62 in data or 123 in data) and _unordered_inside(key):
            data = _CANON_PREFIX + _dumps(canonical(key), 2)
    return _from_bytes(_sha1(data).digest()[:8], "little")


def owner_of(fp: int, nparts: int) -> int:
    """The worker that owns fingerprint `fp` among `nparts` (mixes the bits first)."""
    if nparts <= 1:
        return 0
    return (((fp * 0x9E3779B97F4A7C15) & MASK64) >> 32) % nparts


def fast_fingerprint(key: Hashable) -> int:
    """Python's hash of `key`: valid in this process and its forks only, and only for keys
    `hashes_by_value` accepts (see the module docstring).  A signed 64-bit int, never -1
    (CPython's error code), so it never reads as the engine's "no parent" mark."""
    return hash(key)


def collision_probability(distinct: int, generated: int) -> float:
    """TLC's "calculated (optimistic)" estimate that a fingerprint collision made the search
    miss a state: ``n * (g - n) / 2**64`` for n distinct states and g generated.

    Each of the g - n generated states found already visited could have been a new state
    whose fingerprint equals one of the (at most) n stored, with probability n / 2**64 each
    for random 64-bit fingerprints.  Optimistic because it assumes uniformly random
    fingerprints (see the module docstring for where Python's hash is not).
    """
    return distinct * max(generated - distinct, 0) / 2.0**64


# How each class's instances hash (memo for `hashes_by_value`): a kind, or the reason they do
# not hash by value.  Kinds: "leaf" (hash from the value, nothing inside to check), "items"
# (a tuple or frozenset whose hash combines its items'), or a tuple of the dataclass fields
# its generated __hash__ combines.
_hash_kind: dict[type, str | tuple[str, ...]] = {
    int: "leaf",
    str: "leaf",
    bytes: "leaf",
    float: "leaf",
    complex: "leaf",
    bool: "leaf",
    type(None): "leaf",
    tuple: "items",
    frozenset: "items",
}
_LEAF_HASHES = {int.__hash__, str.__hash__, bytes.__hash__, float.__hash__, enum.Enum.__hash__}
_REASON_PREFIX = "!"  # reasons are stored with this prefix, kinds never start with it


def _classify(cls: type, obj: Any) -> str | tuple[str, ...]:
    h: Any = cls.__hash__
    name = f"{cls.__module__}.{cls.__qualname__}"
    if h is None:
        return f"{_REASON_PREFIX}{name} is not hashable"
    if issubclass(cls, (tuple, frozenset)) and h in (tuple.__hash__, frozenset.__hash__):
        return "items"
    if h in _LEAF_HASHES:  # enums (by member name), and subclasses of int, str, bytes, float
        return "leaf"
    params = getattr(cls, "__dataclass_params__", None)
    if params is not None and params.eq and (params.frozen or params.unsafe_hash):
        names = tuple(
            f.name
            for f in dataclasses.fields(cls)
            if (f.compare if f.hash is None else f.hash)
        )
        # The generated __hash__ is hash() of the tuple of these fields; a hand-written one
        # that agrees with it on an instance hashes the same value.
        if hash(obj) == hash(tuple(getattr(obj, n) for n in names)):
            return names
    if h is object.__hash__:
        return f"{_REASON_PREFIX}{name} hashes by identity"
    return f"{_REASON_PREFIX}{name} has its own __hash__ (it may hash only part of the value)"


def hashes_by_value(key: Any, verified: dict[int, Any] | None = None) -> str | None:
    """None when Python's hash of `key` is computed from its whole value, recursively (ints,
    strings, bytes, floats, None, enums, tuples, named tuples, frozensets, and frozen
    dataclasses with the generated __hash__ made of such values); otherwise why not: the
    first object found that hashes by identity, hashes with its own __hash__, or not at all.
    Such keys need the stable `fingerprint`.

    `verified` (a search's own, `id(obj) -> obj`): the parts of keys found to hash by value
    before, not walked again (the states of a search share most of their parts, and keys are
    sampled all along it). A key's parts are added only when the whole key is made of
    immutable parts (no dataclass with `unsafe_hash` and fields that can still change), so
    what was found of a part stays true of it."""
    stack: list[Any] = [key]
    kinds = _hash_kind
    walked: list[Any] = []
    immutable = True
    while stack:
        obj = stack.pop()
        cls = obj.__class__
        kind = kinds.get(cls)
        if kind is None:
            kind = kinds[cls] = _classify(cls, obj)
        if kind == "leaf":
            continue
        if verified is not None:
            if verified.get(id(obj)) is obj:
                continue
            walked.append(obj)
        if kind == "items":
            stack.extend(obj)
        elif isinstance(kind, tuple):
            if immutable and not cls.__dataclass_params__.frozen:
                immutable = False
            stack.extend(getattr(obj, n) for n in kind)
        else:
            return kind[len(_REASON_PREFIX) :]
    if verified is not None and immutable:
        if len(verified) > _VERIFIED_KEPT:
            verified.clear()
        for obj in walked:
            verified[id(obj)] = obj
    return None


_VERIFIED_KEPT = 1 << 16


def all_hash_by_value(keys: Iterable[Any], verified: dict[int, Any] | None = None) -> str | None:
    """The first reason `hashes_by_value` gives for one of `keys`, or None."""
    for key in keys:
        problem = hashes_by_value(key, verified)
        if problem is not None:
            return problem
    return None
