"""The fusion-pair pass: for each producer/consumer pair of fusion regions, what crosses and what
the consumer recomputes.

Stages, each a module, plain records between them: ``analysis`` (two regions -> ``problem.PairProblem``),
``solve`` (problem -> ``solve.PairPlan`` through a min cut; no thunder import), ``rewrite`` (plan ->
two new regions); ``run`` drives them over the trace and re-emits changed regions.
"""
