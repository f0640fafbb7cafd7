"""Solvers on plain data. Nothing in this package imports thunder."""

from thunder_remat.solvers.maxflow import CutResult, FlowNetwork, min_cut

__all__ = ["CutResult", "FlowNetwork", "min_cut"]
