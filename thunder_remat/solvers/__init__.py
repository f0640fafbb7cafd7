"""Solvers on plain data: minimum cuts (``maxflow``), the value network both passes cut
(``split_network``), knapsacks (``knapsack``). Nothing in this package imports thunder."""

from thunder_remat.solvers.maxflow import CutResult, CutSolver, FlowNetwork, cut_from_source_side, min_cut
from thunder_remat.solvers.split_network import Side, SplitCut, SplitNetwork, Terminal, ValueNetwork, ValueNode

__all__ = ["CutResult", "CutSolver", "FlowNetwork", "cut_from_source_side", "min_cut", "Side", "SplitCut",
           "SplitNetwork", "Terminal", "ValueNetwork", "ValueNode"]
