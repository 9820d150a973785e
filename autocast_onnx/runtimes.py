"""The runtimes a plan can be made for: the one list every surface reads (--runtime's choices,
the configuration's `runtime`, the plan file's "kernels", the kernel and compute tables)."""

from __future__ import annotations

# the runtimes with a kernel table and a compute table (data/kernels_*.json, data/compute_*.json)
RUNTIMES = ("cuda", "tensorrt", "dml")
ANY = "any"  # a plan for every runtime: no runtime's kernels decide it
RUNTIME_CHOICES = (*RUNTIMES, ANY)  # --runtime, the configuration's runtime, a plan's "kernels"
