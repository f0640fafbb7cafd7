import math
import warnings

import pytest
import torch

warnings.filterwarnings("ignore", message="transformer_engine module not found")

import thunder_remat  # noqa: E402  (registers the plugin)
import thunder_remat.fusion_pairs as fusion_pairs  # noqa: E402
from helpers import networkx_cut_value  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def cut_values_match_networkx(monkeypatch):
    """Every pair the pass visits during a test: igraph's cut value equals networkx's."""
    solved = []
    original = fusion_pairs.solve_pair

    def checked(problem):
        out = original(problem)
        solved.append(out)
        return out

    monkeypatch.setattr(fusion_pairs, "solve_pair", checked)
    yield solved
    for pair_network, cut, _ in solved:
        expected = networkx_cut_value(pair_network.network)
        assert math.isclose(cut.value, expected, rel_tol=1e-9, abs_tol=1e-6) or (
            math.isinf(cut.value) and math.isinf(expected)
        ), (cut.value, expected)
