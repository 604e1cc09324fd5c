"""Host side of the kernels' parameter structs and shared constants, read from ``kernels_src/params.cuh`` and
``kernels_src/constants.cuh`` (the one definition of each): ``FWD_PARAMS_DTYPE`` / ``BWD_PARAMS_DTYPE`` (numpy
dtypes with C's layout), :func:`pack_fwd_params` / :func:`pack_bwd_params`, :func:`params_layout_check_source`
(compiles iff the layouts agree) and :data:`CONSTANTS`. Anything the parsers do not understand raises. Field kinds
and rules: docs/architecture.md, "Parameter blocks".
"""
from __future__ import annotations

import collections
import re
import struct

import numpy as np

from . import jit

# C type -> (kind, size, alignment)
_SCALARS = {"int64_t": ("i64", 8, 8), "float": ("f32", 4, 4), "TmaDesc": ("tma", 128, 64),
            "Strides": ("strides", 24, 8)}
_POINTER = ("ptr", 8, 8)
_KIND_LAYOUT = {kind: (size, align) for kind, size, align in (_POINTER, *_SCALARS.values())}  # -> (size, align)
_NP = {"ptr": "<u8", "i64": "<i8", "f32": "<f4", "tma": "V128"}
_FMT = {"ptr": "Q", "i64": "q", "f32": "f", "tma": "128s", "strides": "qqq"}
STRUCT_NAMES = ("Strides", "FwdParams", "BwdParams")
_ZERO_TMA = bytes(128)


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def parse_structs(text: str, names=STRUCT_NAMES) -> dict:
    """``{struct: [(field, kind), ...]}`` for the named structs of a C header (data members only: one or more
    declarators per declaration, optional ``const``, pointers). Raises ValueError on anything else, so a header
    edit the parser does not understand fails loudly instead of packing wrong bytes."""
    text = _strip_comments(text)
    out = {}
    for name in names:
        m = re.search(r"\bstruct\s+" + name + r"\s*\{(.*?)\};", text, flags=re.S)
        if m is None:
            raise ValueError(f"params.cuh: struct {name} not found")
        fields = []
        for decl in m.group(1).split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            dm = re.fullmatch(r"(?:const\s+)?(\w+)\s*(\*?)\s*(\w+(?:\s*,\s*\*?\s*\w+)*)", decl)
            if dm is None:
                raise ValueError(f"params.cuh: struct {name}: cannot parse declaration {decl!r}")
            ctype, star, declarators = dm.groups()
            for d in declarators.split(","):
                d = d.strip()
                is_ptr = bool(star) or d.startswith("*")
                field = d.lstrip("* ")
                if is_ptr:
                    kind = _POINTER[0]
                elif ctype in _SCALARS and ctype != name:
                    kind = _SCALARS[ctype][0]
                else:
                    raise ValueError(f"params.cuh: struct {name}.{field}: unsupported type {ctype!r}")
                fields.append((field, kind))
        out[name] = fields
    return out


def parse_constants(text: str) -> dict:
    """``{name: int}`` of a header made only of ``constexpr int kName = <integer literal>;`` declarations (and
    ``#pragma once``, comments). Raises ValueError on anything else, so that a constant the parser would miss or
    misread fails loudly."""
    out = {}
    for line in _strip_comments(text).splitlines():
        line = line.strip()
        if not line or line == "#pragma once":
            continue
        m = re.fullmatch(r"constexpr\s+int\s+(k[A-Za-z0-9_]+)\s*=\s*(-?(?:0|[1-9][0-9]*))\s*;", line)
        if m is None:
            raise ValueError(f"constants.cuh: expected 'constexpr int kName = <integer>;', got {line!r}")
        name, value = m.group(1), int(m.group(2))
        if name in out:
            raise ValueError(f"constants.cuh: {name} defined twice")
        out[name] = value
    return out


_STRIDES_DTYPE = np.dtype([("batch", "<i8"), ("row", "<i8"), ("head", "<i8")])


def layout(fields) -> tuple:
    """C layout of a field list: (numpy dtype with explicit offsets, struct.Struct format, alignment)."""
    names, formats, offsets = [], [], []
    fmt, offset, align = "<", 0, 1
    for name, kind in fields:
        size, a = _KIND_LAYOUT[kind]
        pad = -offset % a
        fmt += "x" * pad
        offset += pad
        names.append(name)
        formats.append(_STRIDES_DTYPE if kind == "strides" else _NP[kind])
        offsets.append(offset)
        fmt += _FMT[kind]
        offset += size
        align = max(align, a)
    fmt += "x" * (-offset % align)
    offset += -offset % align
    dt = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": offset})
    assert struct.calcsize(fmt) == offset, (fmt, offset)
    return dt, struct.Struct(fmt), align


def _load():
    parsed = parse_structs((jit.kernel_dir() / "params.cuh").read_text())
    strides = [n for n, _ in parsed["Strides"]]
    if strides != ["batch", "row", "head"] or any(k != "i64" for _, k in parsed["Strides"]):
        raise ValueError(f"params.cuh: Strides must be int64_t batch, row, head; got {parsed['Strides']}")
    return {name: (fields, *layout(fields)) for name, fields in parsed.items()}


_LAYOUTS = _load()
FWD_PARAMS_DTYPE = _LAYOUTS["FwdParams"][1]
BWD_PARAMS_DTYPE = _LAYOUTS["BwdParams"][1]
# C struct name -> (numpy dtype, C alignment), for the layout check
PARAMS_STRUCTS = {name: (lay[1], lay[3]) for name, lay in _LAYOUTS.items()}
_CONSTANTS = parse_constants((jit.kernel_dir() / "constants.cuh").read_text())
CONSTANTS = collections.namedtuple("Constants", tuple(_CONSTANTS))(**_CONSTANTS)


def _pointer(name: str, value) -> int:
    if value is None:
        return 0
    data = getattr(value, "data", None)          # a cupy ndarray: its device pointer
    ptr = getattr(data, "ptr", None)
    if ptr is not None:
        return int(ptr)
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if not 0 <= int(value) < 1 << 64:
            raise ValueError(f"pointer field {name!r} out of range: {value}")
        return int(value)
    raise TypeError(f"pointer field {name!r} needs an int address (or a cupy array / None), "
                    f"got {type(value).__name__}")


def _pack(struct_name: str, fields: dict) -> np.ndarray:
    kinds, dtype, layout_struct, _ = _LAYOUTS[struct_name]
    if len(fields) != len(kinds) or any(name not in fields for name, _ in kinds):
        missing = [n for n, _ in kinds if n not in fields]
        if missing:
            raise TypeError(f"{struct_name}: missing field(s) {', '.join(missing)}")
        unknown = [n for n in fields if n not in dtype.names]
        raise TypeError(f"{struct_name}: unknown field(s) {', '.join(unknown)}")
    # NOTES: plain ints, 3-tuples of strides, floats and 128-byte maps pack as they are; anything else (a map of
    # another length too: struct.pack would pad it) takes the checking path below, which converts or names the field.
    values = []
    fast = True
    for name, kind in kinds:
        if kind == "strides":
            values.extend(fields[name])
        else:
            v = fields[name]
            if kind == "tma" and (type(v) is not bytes or len(v) != 128):
                fast = False
            values.append(v)
    if fast:
        try:
            return np.frombuffer(layout_struct.pack(*values), dtype=dtype)
        except (struct.error, TypeError):
            pass
    values = []
    for name, kind in kinds:
        value = fields[name]
        where = f"{struct_name}.{name}"
        if kind == "strides":
            if len(value) != 3:
                raise ValueError(f"{where}: expected 3 strides (batch, row, head), got {len(value)}")
            values.extend(int(x) for x in value)
        elif kind == "ptr":
            values.append(value if type(value) is int and value >= 0 else _pointer(where, value))
        elif kind == "i64":
            if isinstance(value, (float, np.floating)):
                raise TypeError(f"{where} is an integer field, got {value!r}")
            values.append(int(value))
        elif kind == "tma":
            value = _ZERO_TMA if value is None else bytes(value)
            if len(value) != 128:
                raise ValueError(f"{where}: a tensor map is 128 bytes, got {len(value)}")
            values.append(value)
        else:
            values.append(float(value))
    # NOTES: one struct.pack and a zero-copy view: assigning field by field into a structured array costs ~50 µs.
    return np.frombuffer(layout_struct.pack(*values), dtype=dtype)


def pack_fwd_params(**fields) -> np.ndarray:
    """A size-1 ``FWD_PARAMS_DTYPE`` array; pointers as ints (or CuPy arrays; None: null), Strides as (batch, row,
    head) element strides, tensor maps as 128-byte values (None: all zero)."""
    return _pack("FwdParams", fields)


def int_field_offsets(dtype: np.dtype, names) -> tuple:
    """Byte offsets in the struct ``dtype`` of the 8-byte integer fields ``names``: where they are written into a
    block packed before (cupy_dash.cuda.executor.patched_block: plans.rebased, the varlen expansion). Raises
    TypeError for another field."""
    offsets = []
    for name in names:
        field, offset = dtype.fields[name][:2]
        if field.itemsize != 8 or field.kind not in "iu":
            raise TypeError(f"{name}: not an 8-byte integer field ({field})")
        offsets.append(offset)
    return tuple(offsets)


def pack_bwd_params(**fields) -> np.ndarray:
    """A size-1 ``BWD_PARAMS_DTYPE`` array; as :func:`pack_fwd_params`, tensor maps as 128-byte values."""
    return _pack("BwdParams", fields)


def params_layout_check_source(offsetof: str = "auto", structs=None) -> str:
    """CUDA source that ``static_assert``s size, alignment and every field offset/size of the C parameter
    structs against ``structs`` (default :data:`PARAMS_STRUCTS`: ``{name: (numpy dtype, alignment)}``).
    Compiles iff the layouts agree (tests/unit/test_params_layout.py).

    ``offsetof``: "auto" uses ``__builtin_offsetof`` where NVRTC has it (13.5 does, 13.0 does not) and the
    front end's ``__INTADDR__`` otherwise; "intaddr" forces the latter."""
    if offsetof not in ("auto", "intaddr"):
        raise ValueError(f"offsetof must be 'auto' or 'intaddr', got {offsetof!r}")
    structs = PARAMS_STRUCTS if structs is None else structs
    lines = ['#include "params.cuh"']
    if offsetof == "auto":
        lines += ["#if defined(__has_builtin)", "#if __has_builtin(__builtin_offsetof)",
                  "#define DASH_OFFSETOF(T, m) __builtin_offsetof(T, m)", "#endif", "#endif"]
    lines += ["#ifndef DASH_OFFSETOF",
              "#define DASH_OFFSETOF(T, m) ((unsigned long long)__INTADDR__(&(((T*)0)->m)))",
              "#endif"]
    for name, (dt, align) in structs.items():
        lines.append(f'static_assert(sizeof({name}) == {dt.itemsize}, "sizeof({name}) != {dt.itemsize}");')
        lines.append(f'static_assert(alignof({name}) == {align}, "alignof({name}) != {align}");')
        for field in dt.names:
            fdt, off = dt.fields[field][:2]
            lines.append(f'static_assert(DASH_OFFSETOF({name}, {field}) == {off}, '
                         f'"offsetof({name}, {field}) != {off}");')
            lines.append(f'static_assert(sizeof((({name}*)0)->{field}) == {fdt.itemsize}, '
                         f'"sizeof({name}::{field}) != {fdt.itemsize}");')
    lines.append('extern "C" __global__ void dash_params_layout_check(const __grid_constant__ FwdParams f, '
                 'const __grid_constant__ BwdParams b) {}')
    return "\n".join(lines) + "\n"
