"""The JAX wall, MLIR side: a program's entry signature, read from the module JAX hashes into its key (jaxlib's
MLIR bindings; docs/jax-internals.md, "Key parts")."""

from __future__ import annotations

import re
from typing import Any

from jaxcache.keyparts import ProgramSignature

_TENSOR = re.compile(r"^tensor<((?:[0-9?]+x)*)([^x][^,]*)>$")
_ELEMENTS = {"i1": "bool", "complex<f32>": "c64", "complex<f64>": "c128"}
_MAX_OPERANDS, _MAX_OPERAND = 4096, 1000  # what ProgramSignature holds
MLIR_NAMES = ("FunctionType", "TypeAttr", "ArrayAttr", "DictAttr", "StringAttr")  # what entry_signature uses


def entry_signature(module: Any) -> ProgramSignature | None:
    """The argument and result types of the module's ``main`` as it declares them (``f32[32,128]``), each with
    its sharding, memory kind and donation when it has them. Reads top-level operations only: cheap."""
    from jaxlib.mlir import ir  # the MLIR bindings JAX builds its modules with

    meshes: dict[str, str] = {}
    main = None
    for op in module.body.operations:
        kind, attrs = op.operation.name, op.operation.attributes
        if kind == "sdy.mesh" and "mesh" in attrs:
            meshes["@" + ir.StringAttr(attrs["sym_name"]).value] = str(attrs["mesh"]).removeprefix("#sdy.")
        elif kind == "func.func" and "sym_name" in attrs and ir.StringAttr(attrs["sym_name"]).value == "main":
            main = op.operation.attributes
    if main is None:
        return None
    function = ir.FunctionType(ir.TypeAttr(main["function_type"]).value)

    def operands(types: Any, name: str) -> tuple[str, ...]:
        dicts = [ir.DictAttr(d) for d in ir.ArrayAttr(main[name])] if name in main else []
        out = [(_type(str(t)) + (_annotations(dicts[i], meshes, ir) if i < len(dicts) else ""))[:_MAX_OPERAND]
               for i, t in enumerate(types)]
        if len(out) > _MAX_OPERANDS:
            out[_MAX_OPERANDS - 1:] = [f"... {len(out) - _MAX_OPERANDS + 1} more"]
        return tuple(out)

    return ProgramSignature(args=operands(function.inputs, "arg_attrs"),
                            results=operands(function.results, "res_attrs"))


def _type(text: str) -> str:
    """``tensor<8x4xf32>`` → ``f32[8,4]``, in JAX's short dtype names; anything else as MLIR prints it."""
    m = _TENSOR.match(text)
    if m is None:
        return text
    element = m.group(2)
    element = _ELEMENTS.get(element) or ("u" + element[2:] if element.startswith("ui") else element)
    return f"{element}[{','.join(d for d in m.group(1).split('x') if d)}]"


def _annotations(attributes: Any, meshes: dict[str, str], ir: Any) -> str:
    text = ""
    if "sdy.sharding" in attributes:  # "#sdy.sharding<@mesh, [...]>": inline the mesh, so a resize shows here
        sharding = str(attributes["sdy.sharding"]).removeprefix("#sdy.sharding")
        ref = re.match(r"<(@[\w.$-]+)", sharding)
        if ref is not None and ref.group(1) in meshes:
            sharding = "<" + meshes[ref.group(1)] + sharding[ref.end():]
        text += f" sharding={sharding}"
    elif "mhlo.sharding" in attributes:
        text += f" sharding={ir.StringAttr(attributes['mhlo.sharding']).value}"
    if "mhlo.memory_kind" in attributes:
        text += f" memory={ir.StringAttr(attributes['mhlo.memory_kind']).value}"
    if "tf.aliasing_output" in attributes or "jax.buffer_donor" in attributes:
        text += " donated"
    return text
