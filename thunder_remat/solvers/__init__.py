"""Solvers on plain data. Nothing in this package imports thunder."""

from thunder_remat.solvers.maxflow import CutResult, CutSolver, FlowNetwork, min_cut

__all__ = ["CutResult", "CutSolver", "FlowNetwork", "min_cut"]
