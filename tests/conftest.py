# REMAT_NVFUSER_TRACES=1 (set by .ci/run only for tests/test_nvfuser_traces.py, in the nvFuser
# environment .venv-nvfuser): Thunder 0.2.6 looks for nvFuser at import only when
# torch.cuda.is_available(), and thunder_remat (imported below) imports Thunder. That module fakes
# the answer while it imports Thunder, so it is imported first. Unset, this block does nothing.
import os

if os.environ.get("REMAT_NVFUSER_TRACES") == "1":
    import test_nvfuser_traces  # noqa: F401

import math
import warnings

import pytest
import torch

warnings.filterwarnings("ignore", message="transformer_engine module not found")

import thunder_remat  # noqa: E402  (registers the plugin)
from thunder_remat.solvers.maxflow import CutSolver  # noqa: E402
from helpers import networkx_cut_value  # noqa: E402

torch.set_num_threads(2)

#: every test belongs to exactly one of these tiers (pyproject.toml registers the markers)
TIERS = ("unit", "jit")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t) is not None]
        if len(tiers) != 1:
            raise pytest.UsageError(f"{item.nodeid}: mark it with exactly one of {TIERS}, has {tiers}")
        if config.pluginmanager.hasplugin("xdist"):
            item.add_marker(pytest.mark.xdist_group(_worker_group(item)))


def _worker_group(item) -> str:
    """Which tests run in one pytest-xdist worker (``-n 2 --dist loadgroup``, the README's command):
    a module's tests together, as they share module fixtures (compiled models); a module whose
    fixtures are keyed by parameters names them in ``WORKER_GROUP_BY``, and splits by them."""
    module = item.nodeid.split("::")[0]
    keys = getattr(item.module, "WORKER_GROUP_BY", ())
    params = getattr(getattr(item, "callspec", None), "params", {})
    if keys and all(k in params for k in keys):
        return ":".join([module, *(str(params[k]) for k in keys)])
    return module


@pytest.fixture(autouse=True)
def unit_tests_never_jit(request, monkeypatch):
    """A unit test that reaches thunder.jit fails: the tier stays fast and honest."""
    if request.node.get_closest_marker("unit") is not None:
        import thunder

        def refused(*args, **kwargs):
            raise AssertionError("a unit test called thunder.jit; mark it jit or build its trace by hand")

        monkeypatch.setattr(thunder, "jit", refused)


@pytest.fixture(autouse=True)
def cut_values_match_networkx(monkeypatch):
    """Every min cut solved during a test (each fusion pair, each whole-graph plan): igraph's cut
    value equals networkx's on the same network."""
    solved = []
    original_cut = CutSolver.cut

    def checked_cut(self, capacities):
        cut = original_cut(self, capacities)
        solved.append((self.network(capacities), cut))
        return cut

    monkeypatch.setattr(CutSolver, "cut", checked_cut)
    yield solved
    for network, cut in solved:
        expected = networkx_cut_value(network)
        assert math.isclose(cut.value, expected, rel_tol=1e-9, abs_tol=1e-6) or (
            math.isinf(cut.value) and math.isinf(expected)
        ), (cut.value, expected)
