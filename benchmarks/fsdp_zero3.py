"""Parameter bytes held between forward and backward under Thunder's FSDP, with and without thunder_remat.

Spawns 2 CPU processes (torch.distributed gloo on loopback) that run tests/fsdp_worker.py on a
5-layer MLP (Linear 8-16-16-8 with GELUs) for ZeRO-2, ZeRO-3 and DDP, with and without thunder_remat,
and prints, for rank 0: saved bytes, saved gathered (unsharded) parameter bytes, all-gathers in the
backward, and whether the gradients equal the un-sharded eager run.

Usage::

    python benchmarks/fsdp_zero3.py
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> int:
    import torch.multiprocessing as mp

    from fsdp_worker import MODES, run_rank

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(run_rank, args=(2, port, out, tuple(MODES)), nprocs=2, join=True)
        ranks = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(2)]
    print("| mode | saved bytes | saved gathered-parameter bytes | saved activation bytes (not module params) "
          "| all-gathers in backward | grads equal eager (rank 0 / rank 1) |")
    print("|---|---|---|---|---|---|")
    for mode in MODES:
        r = ranks[0][mode]
        ok = " / ".join("yes" if rk[mode]["grads_ok"] else "NO" for rk in ranks)
        print(f"| {mode} | {r['saved_bytes']:,} | {r['saved_gathered_param_bytes']:,} | {r['saved_activation_bytes']:,} "
              f"| {r['backward_all_gathers']} | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
