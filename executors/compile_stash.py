"""Where thunder_remat keeps what a compilation did: attributes on Thunder's ``CompileData``.

Written against Thunder 0.2.6: ``get_compile_data()`` is the compilation in progress (None outside
one), ``thunder.compile_data(jitted)`` the latest compilation of a jitted function; both are plain
objects, so a result is stored as an attribute named ``_thunder_remat_<name>``.
"""

from __future__ import annotations

from thunder.core.compile_data import get_compile_data

__all__ = ["STASHED", "stash", "stashed", "stash_for"]

#: everything stored: the joint trace as first seen, each pass's result, and the cached bytes
#: Thunder alone would save
STASHED = ("joint_trace", "save_result", "pair_result", "alone")


def _attribute(name: str) -> str:
    if name not in STASHED:
        raise ValueError(f"thunder_remat stash: name must be one of {STASHED}, got {name!r}")
    return f"_thunder_remat_{name}"


def stash(name: str, value) -> None:
    """Keep ``value`` with the compilation in progress (nothing happens outside one)."""
    cd = get_compile_data()
    if cd is not None:
        setattr(cd, _attribute(name), value)


def stashed(jitted, name: str):
    """What the latest compilation of ``jitted`` kept under ``name`` (None if nothing)."""
    import thunder

    return getattr(thunder.compile_data(jitted), _attribute(name), None)


def stash_for(jitted, name: str, value) -> None:
    """Keep ``value`` with the latest compilation of ``jitted`` (for caches filled after it)."""
    import thunder

    setattr(thunder.compile_data(jitted), _attribute(name), value)
