"""Estimate, from shapes alone, the most tensor bytes alive at once while a joint trace runs.

Used to compare rewrites of one trace (which backward checkpoints give the lowest peak), not to
predict an allocator: it walks the joint forward+backward trace in order, allocates each op's
tensor outputs, frees a tensor after the last op that reads it, and counts views as sharing their
base's storage (``thunder_remat.storage``: a reshape is a view when the input's strides allow
it, as in PyTorch), which then lives until the last read of any of its views. Forward inputs and
parameters are held anyway and not counted. The forward/backward split keeps exactly the forward
values the backward reads, which the walk keeps alive the same way.
"""

from __future__ import annotations

from thunder.core.proxies import TensorProxy

from thunder_remat.joint_analysis import forward_storages, is_backward
from thunder_remat.storage import StorageMap

__all__ = ["estimate_peak_bytes"]


def estimate_peak_bytes(trace, forward: StorageMap | None = None) -> int:
    """The estimated peak of live tensor bytes (inputs excluded) over a joint trace.

    ``forward``: the storages of the trace's forward part, when already known (rewrites of one
    trace share their forward); only the backward is then walked again.
    """
    if forward is None:
        storages = forward_storages(trace, with_backward=True)
    else:
        storages = forward.extended(b for b in trace.bound_symbols[:-1] if is_backward(b))
    bsyms = trace.bound_symbols
    born: dict[str, int] = {}  # storage owner -> index of the op that allocates it
    last_read: dict[str, int] = {}  # storage owner -> index of the last op reading a tensor on it
    for idx, bsym in enumerate(bsyms):
        for p in bsym.flat_proxy_args:
            if isinstance(p, TensorProxy):
                owner = storages.owner_of(p.name)
                if owner not in storages.held:
                    last_read[owner] = idx
        for p in bsym.flat_proxy_outs:
            if isinstance(p, TensorProxy):
                owner = storages.owner_of(p.name)
                if owner not in storages.held and owner not in born:
                    born[owner] = idx
                    last_read.setdefault(owner, idx)
    change = [0] * (len(bsyms) + 1)  # bytes allocated at each op, freed after its index
    for owner, idx in born.items():
        change[idx] += storages.owner_bytes[owner]
    frees: dict[int, int] = {}
    for owner, idx in last_read.items():
        if owner in born:
            frees[idx] = frees.get(idx, 0) + storages.owner_bytes[owner]
    live = peak = 0
    for idx in range(len(bsyms)):
        live += change[idx]
        peak = max(peak, live)
        live -= frees.get(idx, 0)
    return peak
