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


def test_a_program_whose_backward_starts_before_get_grad_saves_the_plans_bytes_with_torch_compile():
    """Found by benchmarks/fuzz_programs.py (budget 0.0, torch.compile): the rewrite made copies
    when the backward starts, before Thunder's first ``get_grad``; Thunder fused them into the
    forward's last region and its split saved them (32 B where the plan saves none). ``check``
    asserts that the storages really saved equal the plan's bytes, and gradients equal Thunder's."""
    from thunder.executors.torch_compile import torch_compile_ex

    from random_programs import Program

    program = Program(batch=2, width=4, dtype="bfloat16", outputs=2, steps=(
        ("inplace_matmul", 46, 59), ("mul", 21, 31), ("add", 23, 39), ("add", 23, 39), ("mul", 17, 30),
        ("mul", 17, 30), ("neg", 59, 1), ("add", 23, 39)))
    check(program, torch_compile_ex, budget=0.0)
