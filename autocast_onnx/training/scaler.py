"""Dynamic loss scaling, as the mixed-precision training literature and the major frameworks'
scalers do it: multiply the loss by a scale so that small gradients survive fp16 (whose smallest
subnormal is about 6e-8), divide the gradients by the same scale in fp32, and adapt the scale:

  - a step whose gradients are all finite counts as good; after `growth_interval` good steps in a
    row the scale is multiplied by `growth_factor` (never above `max_scale`);
  - a step with an inf or NaN gradient is skipped (the optimizer must not apply it), the scale is
    multiplied by `backoff_factor` (never below `min_scale`) and the count of good steps restarts.

Defaults: start at 2**16, double after 2000 good steps, halve on overflow, bounds 1 and 2**24.
With power-of-two factors and start, the scale stays a power of two, so scaling and unscaling
are exact in floating point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import AutocastError


@dataclass
class DynamicLossScaler:
    """The loss scale of a training run and its update rule (see the module docstring).

    scaler = DynamicLossScaler()
    for batch in data:
        all_finite = run_step(batch, loss_scale=scaler.scale)   # gradients computed with the scale
        if scaler.update(all_finite):
            optimizer_step()                                      # else: skip, reset the gradients
    """

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    min_scale: float = 1.0
    max_scale: float = 2.0**24
    scale: float = field(init=False)
    good_steps: int = field(init=False, default=0)  # finite steps since the last change of scale
    steps: int = field(init=False, default=0)
    skipped_steps: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        def bad(what: str, value) -> AutocastError:
            return AutocastError(f"{what}, not {value!r}", "DynamicLossScaler", "see autocast_onnx.training.scaler")

        for name in ("init_scale", "growth_factor", "backoff_factor", "min_scale", "max_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise bad(f"{name} must be a finite number > 0", value)
        if not self.min_scale <= self.init_scale <= self.max_scale:
            raise bad(
                f"init_scale must lie in [min_scale, max_scale] = [{self.min_scale:g}, {self.max_scale:g}]",
                self.init_scale,
            )
        if self.growth_factor <= 1:
            raise bad("growth_factor must be > 1", self.growth_factor)
        if not 0 < self.backoff_factor < 1:
            raise bad("backoff_factor must be in (0, 1)", self.backoff_factor)
        if (
            isinstance(self.growth_interval, bool)
            or not isinstance(self.growth_interval, int)
            or self.growth_interval < 1
        ):
            raise bad("growth_interval must be a whole number >= 1", self.growth_interval)
        self.scale = float(self.init_scale)

    @property
    def inverse(self) -> float:
        """1 / scale: what the gradients are multiplied by (in fp32) before they are used."""
        return 1.0 / self.scale

    def update(self, all_finite: bool) -> bool:
        """Record one step's verdict and adapt the scale. Returns whether the step's gradients
        may be applied (False: skip the optimizer step and reset the gradients)."""
        self.steps += 1
        if all_finite:
            self.good_steps += 1
            if self.good_steps >= self.growth_interval:
                self.scale = min(self.scale * self.growth_factor, self.max_scale)
                self.good_steps = 0
            return True
        self.skipped_steps += 1
        self.scale = max(self.scale * self.backoff_factor, self.min_scale)
        self.good_steps = 0
        return False

    def state_dict(self) -> dict:
        """What a checkpoint needs to resume the scaler where it stopped."""
        return {
            "scale": self.scale,
            "good_steps": self.good_steps,
            "steps": self.steps,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        try:
            scale, good, steps, skipped = (
                float(state["scale"]),
                int(state["good_steps"]),
                int(state["steps"]),
                int(state["skipped_steps"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AutocastError(
                f"not a loss-scaler state ({exc})",
                "DynamicLossScaler.load_state_dict",
                "pass what state_dict() returned",
            ) from None
        if not (math.isfinite(scale) and self.min_scale <= scale <= self.max_scale) or min(good, steps, skipped) < 0:
            raise AutocastError(
                f"loss-scaler state out of range (scale {scale!r})",
                "DynamicLossScaler.load_state_dict",
                "pass what state_dict() returned",
            )
        self.scale, self.good_steps, self.steps, self.skipped_steps = scale, good, steps, skipped
