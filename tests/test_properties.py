"""Property-based tests: random programs through thunder.jit with and without thunder_remat.

The CI profile is small and derandomized (fixed examples, a few minutes); benchmarks/fuzz_programs.py
runs the long profile. Every min cut solved here is also checked against networkx (conftest).
"""

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from random_programs import check, programs
from thunder_remat.executors.eager import eager_fusion_ex

pytestmark = pytest.mark.jit

# No shrinking in CI: each example compiles with Thunder (seconds); a failure prints its program.
CI = settings(max_examples=12, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.slow
@CI
@given(program=programs())
def test_random_programs_light_executor(program):
    check(program, eager_fusion_ex)


@settings(CI, max_examples=6)
@given(program=programs(max_steps=6, dtypes=("float32",)))
@pytest.mark.parametrize("budget", [0.5, 0.0])
def test_random_programs_under_a_budget(program, budget):
    check(program, eager_fusion_ex, budget=budget)


@settings(CI, max_examples=2)
@given(program=programs(max_steps=5, dtypes=("float32",)))
def test_random_programs_torch_compile(program):
    from thunder.executors.torch_compile import torch_compile_ex

    check(program, torch_compile_ex)
