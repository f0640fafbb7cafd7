"""Where thunder_remat keeps what a compilation did: one record per compilation (per cache entry),
kept on Thunder's ``CompileData``.

Written against Thunder 0.2.6. One ``CompileData`` serves every compilation of a jitted function
(one per cache entry: another input shape, a ``torch.no_grad`` call, ...), so a plain attribute on
it would mix them up; the record of a compilation is found through the list of computation traces
Thunder keeps with that cache entry:

* during a compilation, ``apply_transforms_and_build_cache_entry`` sets ``cs.last_traces`` of the
  ``CompileStats`` (``thunder.core.compile_data._compile_data``, private, holds the pair
  ``(cd, cs)`` while Thunder compiles) to the very list it then stores as the ``CacheEntry``'s
  ``computation_traces``, before it calls ``transform_for_execution``, where both passes run;
* on every call, ``get_computation_and_inputs`` sets ``cs.last_traces`` to that list of the cache
  entry whose computation is about to run (cache hit) or to the new one's (cache miss), so
  ``thunder.compile_stats(jitted).last_traces`` names the compilation whose computation last ran.
  (``cs.last_computation`` cannot: Thunder wraps the entry's ``computation_fn`` in a fresh timer on
  every call.) ``cs.interpreter_cache`` lists the cache entries in the order they were made.

Everything thunder_remat keeps there lives in one attribute, ``_thunder_remat_state``, on the
``CompileData`` (the records, and whether the linear-time stand-ins of ``thunder_speedups`` are on
for the function); this module is the only one that writes it, and the only one that reads
Thunder's compile data and stats (the transforms of the compilation in progress, re-entering a
compilation's context to build or fuse later).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import contextlib

__all__ = ["STASHED", "Compilation", "stash", "stashed_now", "stashed", "stash_for", "compilation_of",
           "compilations", "cache_entry_of", "last_index", "computation_traces_of", "is_inference",
           "training_compilations", "transforms_now", "context_now", "context_of", "entered",
           "mark_speedups", "speedups_marked"]

#: everything stored per compilation: the joint trace as first seen, the session record both passes
#: read (``records.RematSession``), each pass's result, the cached bytes Thunder alone would save,
#: the executors the joint trace was fused with, the jit call's cache info (default dtype and
#: device, grad mode, ...), the provenance lines
STASHED = ("joint_trace", "session", "save_result", "pair_result", "alone", "executors", "cache_info", "provenance")

_STATE = "_thunder_remat_state"


@dataclass(eq=False)
class Compilation:
    """What thunder_remat kept for one compilation (one cache entry) of a jitted function."""

    #: the list of computation traces of the compilation's cache entry (identifies it)
    traces: list
    values: dict = field(default_factory=dict)

    def get(self, name: str):
        return self.values.get(_checked(name))


@dataclass(eq=False)
class _State:
    """thunder_remat's state on one ``CompileData`` (one jitted function)."""

    compilations: list = field(default_factory=list)
    #: the stand-ins of ``thunder_speedups`` are on for this function's compilations
    speedups: bool = False


def _state(cd, create: bool) -> _State | None:
    if cd is None:
        return None
    state = getattr(cd, _STATE, None)
    if state is None and create:
        state = _State()
        setattr(cd, _STATE, state)
    return state


def _checked(name: str) -> str:
    if name not in STASHED:
        raise ValueError(f"thunder_remat stash: name must be one of {STASHED}, got {name!r}")
    return name


def _in_progress():
    """(cd, cs) of the compilation in progress, (None, None) outside one (Thunder 0.2.6, private)."""
    from thunder.core.compile_data import _compile_data

    return _compile_data.get()


def _record(cd, traces, create: bool) -> Compilation | None:
    state = _state(cd, create) if traces is not None else None
    if state is None:
        return None
    for record in state.compilations:
        if record.traces is traces:
            return record
    if not create:
        return None
    record = Compilation(traces)
    state.compilations.append(record)
    return record


def transforms_now() -> tuple:
    """The transforms of the compilation in progress (empty outside one)."""
    cd, _ = _in_progress()
    return tuple(getattr(cd, "transforms", None) or ())


def context_now():
    """The compile data and stats of the compilation in progress, to re-enter with ``entered``."""
    return _in_progress()


def context_of(jitted):
    """The compile data and stats of ``jitted``, to re-enter with ``entered``."""
    import thunder

    return thunder.compile_data(jitted), thunder.compile_stats(jitted)


@contextlib.contextmanager
def entered(context, *, language: bool = False):
    """Inside a compilation's compile data and stats (``context_now``/``context_of``) again, as
    Thunder 0.2.6 holds them while it compiles; ``language``: in its language context too."""
    from thunder.core.compile_data import compile_data_and_stats
    from thunder.core.langctxs import langctx

    cd, cs = context
    with compile_data_and_stats(cd, cs), (langctx(cd.langctx) if language else contextlib.nullcontext()):
        yield


def mark_speedups() -> None:
    """Turn the ``thunder_speedups`` stand-ins on for the function being compiled (the rest of this
    compilation and its later ones)."""
    cd, _ = _in_progress()
    state = _state(cd, create=True)
    if state is not None:
        state.speedups = True


def speedups_marked(jitted=None) -> bool:
    """The compilation in progress (or ``jitted``) belongs to a function ``mark_speedups`` was
    called for."""
    if jitted is None:
        cd, _ = _in_progress()
    else:
        import thunder

        cd = thunder.compile_data(jitted)
    state = _state(cd, create=False)
    return state is not None and state.speedups


def stash(name: str, value) -> None:
    """Keep ``value`` with the compilation in progress (nothing happens outside one)."""
    _checked(name)
    cd, cs = _in_progress()
    record = _record(cd, getattr(cs, "last_traces", None), create=True)
    if record is not None:
        record.values[name] = value


def stashed_now(name: str):
    """What the compilation in progress kept under ``name`` so far (None outside one)."""
    cd, cs = _in_progress()
    record = _record(cd, getattr(cs, "last_traces", None), create=False)
    return None if record is None else record.get(name)


def _traces_of(jitted, compilation: int | None):
    import thunder

    cs = thunder.compile_stats(jitted)
    if cs is None:
        return None
    if compilation is None:
        return cs.last_traces
    entries = cs.interpreter_cache
    if not -len(entries) <= compilation < len(entries):
        raise IndexError(f"thunder_remat: compilation {compilation} out of range: the function has "
                         f"{len(entries)} compilations (thunder.compile_stats(fn).interpreter_cache)")
    return entries[compilation].computation_traces


def compilation_of(jitted, compilation: int | None = None) -> Compilation | None:
    """The record of one compilation of ``jitted``: by default the one whose computation last ran
    (``thunder.last_traces(jitted)`` is its traces); else the index of its cache entry in
    ``thunder.compile_stats(jitted).interpreter_cache`` (the order compilations were made in)."""
    import thunder

    return _record(thunder.compile_data(jitted), _traces_of(jitted, compilation), create=False)


def cache_entry_of(jitted, compilation: int | None = None):
    """Thunder's ``CacheEntry`` of that compilation (None if it is not cached, e.g. ``cache="no caching"``)."""
    import thunder

    traces = _traces_of(jitted, compilation)
    cs = thunder.compile_stats(jitted)
    for entry in getattr(cs, "interpreter_cache", ()):
        if entry.computation_traces is traces:
            return entry
    return None


def compilations(jitted) -> list[int]:
    """Indexes of ``jitted``'s cache entries, in the order they were made (``compilation=`` values)."""
    import thunder

    cs = thunder.compile_stats(jitted)
    return list(range(len(cs.interpreter_cache))) if cs is not None else []


def last_index(jitted) -> int | None:
    """The index of the cache entry whose computation last ran (None if it is not cached)."""
    import thunder

    cs = thunder.compile_stats(jitted)
    if cs is None:
        return None
    for i, entry in enumerate(cs.interpreter_cache):
        if entry.computation_traces is cs.last_traces:
            return i
    return None


def stashed(jitted, name: str, compilation: int | None = None):
    """What that compilation of ``jitted`` (default: the one that last ran) kept under ``name``."""
    _checked(name)
    record = compilation_of(jitted, compilation)
    return None if record is None else record.get(name)


def stash_for(jitted, name: str, value, compilation: int | None = None) -> None:
    """Keep ``value`` with that compilation of ``jitted`` (for caches filled after it; nothing
    happens if thunder_remat kept no record of it)."""
    _checked(name)
    record = compilation_of(jitted, compilation)
    if record is not None:
        record.values[name] = value


def computation_traces_of(jitted, compilation: int | None = None) -> list:
    """The computation traces of that compilation (``thunder.last_traces(jitted)`` by default);
    the last is the forward trace Thunder runs."""
    import thunder

    if compilation is None:
        return thunder.last_traces(jitted)
    return _traces_of(jitted, compilation)


def is_inference(jitted, compilation: int | None = None) -> bool:
    """That compilation has no backward: Thunder 0.2.6 keeps no ``backward_fn`` in its cache entry
    (uncached: thunder_remat saw no joint trace in it)."""
    entry = cache_entry_of(jitted, compilation)
    if entry is not None:
        return entry.backward_fn is None
    record = compilation_of(jitted, compilation)
    return record is not None and record.get("joint_trace") is None


def training_compilations(jitted) -> list[int]:
    """Indexes of the cache entries that have a backward."""
    import thunder

    cs = thunder.compile_stats(jitted)
    return [i for i, e in enumerate(getattr(cs, "interpreter_cache", ())) if e.backward_fn is not None]
