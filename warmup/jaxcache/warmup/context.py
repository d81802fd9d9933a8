"""What a warm-up entrypoint receives: the target topology and helpers to compile for it without data."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jaxcache.errors import InvalidInputError
from jaxcache.topology import AnyTopology


@dataclass
class WarmupContext:
    """Passed to ``--entrypoint pkg.module:function``.

    An entrypoint builds the job's programs for the target topology and compiles them without data::

        def warm(ctx):
            mesh = ctx.mesh(("data",))
            x = ctx.abstract((ctx.global_devices * 32, 1024), "float32", ("data", None), mesh)
            jax.jit(step).lower(params, x).compile()


    On TPU, ``topology`` is the slice (a :class:`jaxcache.topology.TpuSlice`: ``.name``, ``.chips``, ``.hosts``,
    ``.chips_per_host``), ``global_devices`` its chip count, and :meth:`devices` the slice's chips in the order a
    job on it sees ``jax.devices()``: compile-only devices that libtpu describes, on a machine without chips.
    """

    topology: AnyTopology
    platform: str
    gpu_model: str | None = None
    slice_devices: list[Any] | None = None  # TPU: the slice's devices (this process's own are its CPU)

    @property
    def global_devices(self) -> int:
        """Devices across the whole target job (S x H x D; a TPU slice's chips)."""
        return self.topology.global_devices

    def devices(self) -> list[Any]:
        """The job's global devices, as JAX sees them under the mocked topology (a TPU slice's chips)."""
        if self.slice_devices is not None:
            return list(self.slice_devices)
        import jax

        return jax.devices()

    def mesh(self, axis_names: Sequence[str] = ("data",), shape: Sequence[int] | None = None) -> Any:
        """A ``jax.sharding.Mesh`` over every global device; ``shape`` defaults to all devices on the first axis."""
        import numpy as np
        from jax.sharding import Mesh

        names = tuple(axis_names)
        dims = tuple(shape) if shape is not None else (self.global_devices,) + (1,) * (len(names) - 1)
        if len(dims) != len(names) or math.prod(dims) != self.global_devices:
            raise InvalidInputError(
                f"mesh shape {dims} for axes {names} must have one size per axis and cover all"
                f" {self.global_devices} devices of {self.topology}"
            )
        return Mesh(np.asarray(self.devices()).reshape(dims), names)

    def abstract(self, shape: Sequence[int], dtype: Any, spec: Sequence[str | None] | None = None,
                 mesh: Any | None = None) -> Any:
        """A ``jax.ShapeDtypeStruct`` with a ``NamedSharding`` (replicated when ``spec`` is None)."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        mesh = mesh if mesh is not None else self.mesh()
        sharding = NamedSharding(mesh, PartitionSpec(*(spec or ())))
        return jax.ShapeDtypeStruct(tuple(shape), jax.numpy.dtype(dtype), sharding=sharding)

    def compile(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(fn, **kwargs).lower(*args).compile()``: compile one program for the target, run nothing."""
        import jax

        return jax.jit(fn, **kwargs).lower(*args).compile()
