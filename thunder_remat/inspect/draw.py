"""Drawings of a min cut: Graphviz DOT text, rendered to PNG/SVG/PDF when asked.

``draw(jm)`` draws the whole-graph network of the plan the latest compilation chose;
``draw(jm, pair="P -> C")`` (or ``pair=0``) one fusion pair's network. Cut edges are red and bold,
every edge carries its capacity in bytes (``inf``: may not be cut), nodes on the source side are
filled. Nothing is written unless ``path`` is given. ``.dot``/``.gv`` paths get the text;
``.png``/``.svg``/``.pdf`` need the ``graphviz`` Python package and Graphviz's ``dot`` program
(``pip install 'thunder-remat[draw]'``).
"""

from __future__ import annotations

import math
from pathlib import Path

from thunder_remat.solvers.maxflow import CutResult, FlowNetwork
from thunder_remat.solvers.split_network import Terminal

__all__ = ["to_dot", "draw"]

_RENDERED = {".png", ".svg", ".pdf"}


def _quote(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(network: FlowNetwork, labels, cut: CutResult, title: str = "min cut", unit: str = "B") -> str:
    """DOT text for ``network`` with ``cut`` highlighted; ``labels[i]`` names node ``i``."""
    cut_edges = set(cut.cut_edges)
    lines = [f"digraph {_quote(title)} {{", "  rankdir=LR;", f"  label={_quote(f'{title}: cut {cut.value:g} {unit}')};"]
    for i, label in enumerate(labels):
        style = ', style=filled, fillcolor="lightblue"' if i in cut.source_side else ""
        shape = "doublecircle" if i in (network.source, network.sink) else "box"
        lines.append(f"  n{i} [label={_quote(label)}, shape={shape}{style}];")
    for k, ((u, v), cap) in enumerate(zip(network.edges, network.capacities)):
        text = "inf" if math.isinf(cap) else f"{cap:g}"
        attrs = [f"label={_quote(text)}"]
        if k in cut_edges:
            attrs += ['color="red"', "penwidth=3", 'fontcolor="red"']
        lines.append(f"  n{u} -> n{v} [{', '.join(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _label(node) -> str:
    return node.value if isinstance(node, Terminal) else str(node)


def _whole_graph_dot(jitted) -> str:
    from thunder_remat.plugin import last_save_plan

    result = last_save_plan(jitted)
    if result is None or result.choice is None:
        raise ValueError("draw: no whole-graph plan; jit with remat=True (remat_whole_graph=True) and call it once")
    plan = result.choice.plan
    # the plan's own network (its kept soft bans and recompute price) and the cut it was solved with
    net, cut = result.choice.networks.cut_of(plan)
    unit = "B" if plan.price == 0 else f"(B + {plan.price:.3g} x recompute {result.problem.cost_unit})"
    return to_dot(net.network, [_label(n) for n in net.labels], cut, "whole-graph saved-for-backward cut", unit)


def _pair_dot(jitted, pair) -> str:
    from thunder_remat.plugin import last_pair_pass

    result = last_pair_pass(jitted)
    records = [r for r in (result.pairs if result else []) if r.network is not None]
    names = [f"{r.producer} -> {r.consumer}" for r in records]
    if isinstance(pair, int) and not isinstance(pair, bool) and 0 <= pair < len(records):
        record = records[pair]
    elif pair in names:
        record = records[names.index(pair)]
    else:
        raise ValueError(f"draw: pair must be an index or one of {names}, got {pair!r}")
    labels = [_label(n) for n in record.network.labels]
    return to_dot(record.network.network, labels, record.cut, f"fusion pair {names[records.index(record)]}")


def draw(jitted, *, pair=None, path=None) -> str:
    """DOT text of the whole-graph cut (``pair=None``) or of one fusion pair; written to ``path`` if given."""
    dot = _whole_graph_dot(jitted) if pair is None else _pair_dot(jitted, pair)
    if path is None:
        return dot
    path = Path(path)
    if path.suffix in _RENDERED:
        try:
            import graphviz
        except ImportError as exc:
            raise ImportError(
                f"draw: rendering {path.suffix} needs the graphviz package and Graphviz's dot program "
                "(pip install 'thunder-remat[draw]'); write a .dot file instead"
            ) from exc
        graphviz.Source(dot).render(outfile=str(path), format=path.suffix[1:], cleanup=True)
    else:
        path.write_text(dot)
    return dot
