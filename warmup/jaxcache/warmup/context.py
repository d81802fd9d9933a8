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
    job on it sees ``jax.devices()``: compile-only devices that libtpu describes, on a machine without chips. A
    multi-slice job (``2xv5e:16x16``) has ``num_slices`` slices; :meth:`mesh` then spans them as the job's mesh
    does, with JAX's ``mesh_utils.create_hybrid_device_mesh`` (the slice axis over the data-centre network).
    """

    topology: AnyTopology
    platform: str
    gpu_model: str | None = None
    slice_devices: list[Any] | None = None  # TPU: the slice's devices (this process's own are its CPU)

    @property
    def global_devices(self) -> int:
        """Devices across the whole target job (S x H x D; a TPU job's chips, every slice's)."""
        return self.topology.global_devices

    @property
    def num_slices(self) -> int:
        """Slices of the job (S of S x H x D; N of a multi-slice TPU job Nxv5e:16x16)."""
        return self.topology.slices

    def devices(self) -> list[Any]:
        """The job's global devices, as JAX sees them under the mocked topology (a TPU slice's chips)."""
        if self.slice_devices is not None:
            return list(self.slice_devices)
        import jax

        return jax.devices()

    def mesh(self, axis_names: Sequence[str] = ("data",), shape: Sequence[int] | None = None,
             dcn_shape: Sequence[int] | None = None) -> Any:
        """A ``jax.sharding.Mesh`` over every global device; ``shape`` defaults to all devices on the first axis.

        On a multi-slice TPU job the mesh is ``mesh_utils.create_hybrid_device_mesh``'s, as MaxText builds it:
        ``dcn_shape`` (default: every slice on the first axis) says how each axis spans slices, ``shape // dcn_shape``
        how it spans one slice's chips. The job must build its mesh the same way: the device order enters the key.
        """
        import numpy as np
        from jax.sharding import Mesh

        names = tuple(axis_names)
        dims = tuple(shape) if shape is not None else (self.global_devices,) + (1,) * (len(names) - 1)
        if len(dims) != len(names) or math.prod(dims) != self.global_devices:
            raise InvalidInputError(
                f"mesh shape {dims} for axes {names} must have one size per axis and cover all"
                f" {self.global_devices} devices of {self.topology}"
            )
        if self.platform == "tpu" and self.num_slices > 1:
            return Mesh(self._hybrid(names, dims, dcn_shape), names)
        if dcn_shape is not None and math.prod(dcn_shape) != 1:
            raise InvalidInputError(f"dcn_shape {tuple(dcn_shape)} spans slices, and {self.topology} is not a"
                                    " multi-slice TPU job (write one as Nxv5e:16x16)")
        return Mesh(np.asarray(self.devices()).reshape(dims), names)

    def _hybrid(self, names: tuple[str, ...], dims: tuple[int, ...], dcn_shape: Sequence[int] | None) -> Any:
        from jax.experimental import mesh_utils

        dcn = tuple(dcn_shape) if dcn_shape is not None else (self.num_slices,) + (1,) * (len(names) - 1)
        fits = len(dcn) == len(names) and math.prod(dcn) == self.num_slices
        if not fits or any(d % s for d, s in zip(dims, dcn, strict=True)):
            raise InvalidInputError(
                f"dcn_shape {dcn} for axes {names} and mesh shape {dims} must have one size per axis, multiply to"
                f" the {self.num_slices} slices of {self.topology} and divide the mesh shape axis by axis"
            )
        ici = tuple(d // s for d, s in zip(dims, dcn, strict=True))
        return mesh_utils.create_hybrid_device_mesh(ici, dcn, self.devices())

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
