"""Reading what the passes did: ``report`` (``explain``), ``draw`` (the stored cuts), ``tradeoff``
(the memory/recompute frontier), ``measure`` (what autograd really holds)."""
