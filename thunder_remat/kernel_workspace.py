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
walks, plans and compilations in the process read the kept figure.

The figure is what the op holds beyond its output while it runs. Where it cannot be measured (a
meta or other device, a profiler already recording, the op failing on zeros) it is 0 and the
reason is logged once: the estimate is then what it was before the probe existed. Under a
profiler that is already recording nothing is measured (the probe would disturb the user's
profile) nor remembered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["ConvolutionCall", "TensorSpec", "convolution_workspace"]

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


_measured: dict[ConvolutionCall, int] = {}
_MEASURABLE_DEVICES = ("cpu", "cuda")


def convolution_workspace(call: ConvolutionCall) -> int:
    """Bytes ``torch.convolution`` holds beyond its output while it runs ``call`` (measured the
    first time, then remembered for the process)."""
    known = _measured.get(call)
    if known is None:
        known = _measure(call)
        if known is not None:
            _measured[call] = known
    return known or 0


def _measure(call: ConvolutionCall) -> int | None:
    """The workspace's bytes; None where it cannot be measured now (a profiler recording)."""
    import torch

    from thunder_remat.allocator import allocator_step_peak

    device = torch.device(call.input.device)
    if device.type not in _MEASURABLE_DEVICES or (device.type == "cuda" and not torch.cuda.is_available()):
        log.info("convolution workspace not measured on device %s: counted as 0", device)
        return 0
    if torch.autograd.profiler._is_profiler_enabled:
        _log_once("a profiler is already recording: convolution workspaces are counted as 0 in this estimate")
        return None

    def zeros(spec: TensorSpec | None):
        if spec is None:
            return None
        dtype = getattr(torch, spec.dtype.removeprefix("torch."))
        return torch.empty_strided(spec.sizes, spec.strides, dtype=dtype, device=spec.device).zero_()

    args = (zeros(call.input), zeros(call.weight), zeros(call.bias), list(call.stride), list(call.padding),
            list(call.dilation), call.transposed, list(call.output_padding), call.groups)
    made = []
    try:
        with torch.no_grad():
            made.append(torch.convolution(*args))  # the first call may set up what the next reuse
            made.clear()
            peak = allocator_step_peak(lambda: made.append(torch.convolution(*args)), device=device)
    except Exception as error:  # noqa: BLE001 - any failure leaves the estimate as it was
        _log_once(f"convolution workspace not measured ({type(error).__name__}: {error}): counted as 0")
        return 0
    workspace = max(0, peak.peak_bytes - made[0].untyped_storage().nbytes())
    log.debug("convolution %s: %d B of workspace", call, workspace)
    return workspace


_logged: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.warning(message)
