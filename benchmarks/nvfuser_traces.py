"""Bytes crossing nvFuser region boundaries: thunder_remat's fusion-pair pass against Thunder 0.2.6's own.

Static, from traces, on a CPU machine: nothing is executed. Run it in the nvFuser environment
(``.venv-nvfuser``, see .ci/run); it uses tests/test_nvfuser_traces.py's fakes (CUDA reported
available while Thunder imports and compiles, fake CUDA tensors) and sets REMAT_NVFUSER_TRACES=1
for that module itself.

For each tiny built-in model (and the zoo models asked for), one training step is traced through Thunder's nvFuser executor:

* **Thunder**: ``thunder.jit(model, executors=[nvfuser])``, Thunder's nvFuser pair pass runs;
* **ours**: the same with ``remat=True, remat_whole_graph=False`` (thunder_remat's pair pass alone,
  Thunder's gated off), and again with ``remat_producer_input_discount=1.0``;
* **defaults**: ``remat=True`` (thunder_remat's whole-graph pass, then its pair pass).

In each compilation's final forward and backward traces it sums the distinct storages (a view
counts its base once; parameters, inputs, saved values and cotangents count nothing where they are
read) that one region writes and another reads, in the forward and in the backward, and those the
forward saves for the backward. *total* is the three together.

Usage::

    .venv-nvfuser/bin/python benchmarks/nvfuser_traces.py --models "gpt,llama,mlp,litgpt pythia-14m,transformers BERT"

Progress goes to stderr; the markdown table goes to stdout (and to ``--output`` if given).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from pathlib import Path

log = logging.getLogger("nvfuser_traces")

MODELS = ("gpt", "llama", "mlp")
#: zoo models (real model code) the nvFuser tests also build, where litgpt / transformers are installed
ZOO_MODELS = ("litgpt pythia-14m", "transformers BERT")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma list of {', '.join(MODELS + ZOO_MODELS)} (default: the built-in ones)")
    p.add_argument("--dropout", type=float, default=None, help="dropout of the models (default: the tiny spec's, 0)")
    p.add_argument("--output", help="also write the markdown table to this file")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.models if m not in MODELS + ZOO_MODELS]
    if bad or not args.models:
        p.error(f"--models: choose from {', '.join(MODELS + ZOO_MODELS)}, got {args.models}")
    return args


def _pair(a: int, b: int) -> str:
    return f"{a:,} / {b:,}"


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(name)s: %(message)s")
    warnings.filterwarnings("ignore")
    os.environ["REMAT_NVFUSER_TRACES"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    # first: it reports CUDA available while it imports Thunder, so that Thunder finds nvFuser
    import test_nvfuser_traces as nvt
    import thunder
    import torch

    from helpers import bytes_crossing

    import thunder_remat
    from thunder_remat.executors.nvfuser import nvfuser_module

    header = ("| model | nvFuser regions (fw / bw) | pairs (visited / rewritten) | crossing in forward (Thunder / ours) "
              "| saved for backward (Thunder / ours) | crossing in backward (Thunder / ours) | total (Thunder / ours) "
              "| ours <= Thunder (total / saved) | ours, discount 1.0: total (saved) "
              "| thunder_remat defaults: total (saved) |")
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for name in args.models:
        start = time.perf_counter()
        builds = {
            "thunder": nvt.compile_traces(name, "thunder", dropout=args.dropout),
            "ours": nvt.compile_traces(name, "ours", dropout=args.dropout),
            "ours_d1": nvt.compile_traces(name, "ours", dropout=args.dropout, remat_producer_input_discount=1.0),
            "defaults": nvt.compile_traces(name, "defaults", dropout=args.dropout),
        }
        c = {k: bytes_crossing(b.forward, b.backward) for k, b in builds.items()}
        ours = builds["ours"]
        result = thunder_remat.last_pair_pass(ours.jitted)
        rewritten = sum(p.status.value == "rewritten" for p in result.pairs)
        n_fw, n_bw = (len(nvt.regions(t)) for t in (ours.forward, ours.backward))
        t, o = c["thunder"], c["ours"]
        ok = f"{'yes' if o.total <= t.total else '**no**'} / {'yes' if o.saved <= t.saved else '**no**'}"
        lines.append(
            f"| {name} | {n_fw} / {n_bw} | {len(result.pairs)} / {rewritten} | {_pair(t.forward, o.forward)} "
            f"| {_pair(t.saved, o.saved)} | {_pair(t.backward, o.backward)} | {_pair(t.total, o.total)} | {ok} "
            f"| {c['ours_d1'].total:,} ({c['ours_d1'].saved:,}) | {c['defaults'].total:,} ({c['defaults'].saved:,}) |"
        )
        log.info("%s: %d pairs, %d rewritten, %.1f s", name, len(result.pairs), rewritten, time.perf_counter() - start)
    dropout = args.dropout if args.dropout is not None else 0.0
    lines += ["", f"Bytes; tiny models (fp32, dropout {dropout}), traces only. torch {torch.__version__}, "
                  f"lightning-thunder {thunder.__version__}, {nvfuser_module()} {_nvfuser_version()}."]
    table = "\n".join(lines) + "\n"
    sys.stdout.write(table)
    if args.output:
        Path(args.output).write_text(table)
    return 0


def _nvfuser_version() -> str:
    import importlib.metadata

    for dist in importlib.metadata.distributions():
        if (dist.metadata["Name"] or "").startswith("nvfuser"):
            return f"({dist.metadata['Name']} {dist.version})"
    return ""


if __name__ == "__main__":
    sys.exit(main())
