"""The whole-graph pass: what the forward saves for backward, under a memory budget.

Stages, each a module, plain records between them: ``analysis`` (joint trace -> ``problem.SaveProblem``),
``planner`` (problem -> ``planner.BudgetChoice``; no thunder import), ``checkpoints`` (choice ->
``checkpoints.CheckpointChoice``, with ``peak`` for the "auto" estimates), ``rewrite`` (schedule ->
trace), ``zero3`` (FSDP re-gathers); ``run`` drives them.
"""
