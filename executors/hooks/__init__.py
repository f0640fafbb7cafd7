"""Thunder hooks (installed as ``thunder_remat.executors.hooks``): how thunder_remat takes part in
a Thunder compilation, apart from the executor adapters one level up.

Written against lightning-thunder 0.2.6; every private touch of Thunder outside the adapters is
here, one concern per module:

* ``pipeline``: puts thunder_remat's executor after every fusion executor and runs the
  whole-graph pass on the joint trace before fusion; fuses a joint trace again as Thunder alone;
* ``builtin_pass``: switches Thunder's own fusion-pair pass off while thunder_remat runs;
* ``compile_stash``: the one module that reads and writes thunder_remat's state on Thunder's
  ``CompileData`` (per-compilation records, the speed-up mark);
* ``thunder_speedups``: linear-time stand-ins for two quadratic Thunder helpers;
* ``fsdp``: recognises an FSDP ZeRO-3 compilation;
* ``thunderfx``: the subgraphs ThunderFX compiled;
* ``op_timing``: times single ops for the measured cost model.
"""
