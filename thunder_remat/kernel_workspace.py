"""Memory a library kernel allocates inside itself, measured once per call: what the storage walk
cannot derive from the trace.

A convolution runs in oneDNN (CPU) or cuDNN (CUDA). Those reorder operands into blocked layouts
and take scratch memory of their own choosing, and how much depends on the implementation the
library picks for the shapes, the machine and the thread count (on CPU, torch 2.11: a depthwise
7x7 convolution copies its input and weight, a 3x3 one its input and weight, a 4x4 patch
embedding of 3 channels its weight only). No rule from the trace would stay true, so the walk does
not guess: the first time it meets a call it runs the op once on zeros of the same sizes,
strides, dtype and device, reads the allocator's peak during the call
(``allocator.allocator_step_peak``) and keeps the bytes above the output's storage. Later
walks, plans and compilations in the process read the kept figure. The same holds for a matmul
in bfloat16 or float16 on CPU, which oneDNN runs by packing its operands into buffers of its own
(a float32 matmul allocates nothing there beyond the operand copies ``storage`` derives).

The figure is what the op holds beyond its output while it runs. Where it cannot be measured (a
meta or other device, a profiler already recording, the op failing on zeros) it is 0 and the
reason is logged once: the estimate is then what it was before the probe existed. Under a
profiler that is already recording nothing is measured (the probe would disturb the user's
profile) nor remembered. Dispatch modes (a fake tensor mode, a user's memory tracker) are set
aside while the probe runs, so it measures real tensors and the tracker does not see them. Checked against the allocator on CPU; on CUDA the probe runs the same
way with the caching allocator's counters (cuDNN's workspace), not yet checked on a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["ConvolutionCall", "MatmulCall", "TensorSpec", "convolution_workspace", "matmul_workspace"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument, as plain data: sizes and strides in elements, torch dtype and device
    as strings (``"torch.float32"``, ``"cpu"``)."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: str


@dataclass(frozen=True)
class ConvolutionCall:
    """The arguments of ``torch.convolution`` (Thunder's ``prims.convolution``)."""

    input: TensorSpec
    weight: TensorSpec
    bias: TensorSpec | None
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    output_padding: tuple[int, ...]
    groups: int


@dataclass(frozen=True)
class MatmulCall:
    """``torch.matmul(a, b)``, or ``torch.nn.functional.linear(a, b, bias)`` where ``linear``."""

    a: TensorSpec
    b: TensorSpec
    bias: TensorSpec | None = None
    linear: bool = False


_measured: dict = {}
_MEASURABLE_DEVICES = ("cpu", "cuda")


def convolution_workspace(call: ConvolutionCall) -> int:
    """Bytes ``torch.convolution`` holds beyond its output while it runs ``call`` (measured the
    first time, then remembered for the process)."""
    return _remembered(call)


def matmul_workspace(call: MatmulCall) -> int:
    """Bytes ``torch.matmul`` (``linear``) holds beyond its output while it runs ``call``: its
    operand copies and, in reduced precision on CPU, the buffers oneDNN packs operands into
    (measured the first time, then remembered for the process)."""
    return _remembered(call)


def _remembered(call) -> int:
    known = _measured.get(call)
    if known is None:
        known = _measure(call)
        if known is not None:
            _measured[call] = known
    return known or 0


def _run(call, zeros):
    """The op ``call`` describes, run on ``zeros(spec)`` tensors."""
    import torch

    if isinstance(call, ConvolutionCall):
        return torch.convolution(zeros(call.input), zeros(call.weight), zeros(call.bias), list(call.stride),
                                 list(call.padding), list(call.dilation), call.transposed, list(call.output_padding),
                                 call.groups)
    if call.linear:
        return torch.nn.functional.linear(zeros(call.a), zeros(call.b), zeros(call.bias))
    return torch.matmul(zeros(call.a), zeros(call.b))


def _measure(call) -> int | None:
    """The workspace's bytes; None where it cannot be measured now (a profiler recording)."""
    import torch

    from thunder_remat.allocator import allocator_step_peak

    what = type(call).__name__.removesuffix("Call").lower()
    first = call.input if isinstance(call, ConvolutionCall) else call.a
    device = torch.device(first.device)
    if device.type not in _MEASURABLE_DEVICES or (device.type == "cuda" and not torch.cuda.is_available()):
        log.info("%s workspace not measured on device %s: counted as 0", what, device)
        return 0
    # torch 2.11: whether a profiler is recording on this thread (no public getter)
    if torch.autograd.profiler._is_profiler_enabled:
        _log_once(f"a profiler is already recording: {what} workspaces are counted as 0 in this estimate")
        return None
    made, held = [], {}

    def zeros(spec: TensorSpec | None):
        if spec is None:
            return None
        if spec not in held:  # made before the measured call, so not counted in it
            dtype = getattr(torch, spec.dtype.removeprefix("torch."))
            held[spec] = torch.empty_strided(spec.sizes, spec.strides, dtype=dtype, device=spec.device).zero_()
        return held[spec]

    # the probe runs outside any dispatch mode (a fake tensor mode, a user's memory tracker) on
    # real tensors: the same figure whatever mode the compilation runs under (torch 2.11, private)
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with torch.no_grad(), _disable_current_modes():
            _run(call, zeros)  # the first call may set up what later calls reuse
            peak = allocator_step_peak(lambda: made.append(_run(call, zeros)), device=device)
    except Exception as error:  # noqa: BLE001 - any failure leaves the estimate as it was
        _log_once(f"{what} workspace not measured ({type(error).__name__}: {error}): counted as 0")
        return 0
    workspace = max(0, peak.peak_bytes - made[0].untyped_storage().nbytes())
    log.debug("%s %s: %d B of workspace", what, call, workspace)
    return workspace


_logged: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.warning(message)
