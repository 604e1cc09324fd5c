"""Framework interop for torch, JAX, CuPy and any DLPack producer: :func:`describe` an operand, :func:`check_layout`
(the kernels' stride and alignment rules, docs/api.md), zero-copy :func:`to_cupy` / :func:`from_cupy`, the
caller's stream (:func:`caller_stream`) and whether it captures a CUDA graph (:func:`capturing`).

NOTES: validation runs on plain attributes: :func:`describe` consumes no DLPack capsule and touches no GPU, so it
works on numpy / ``ml_dtypes`` arrays (the CPU tests). torch and jax are imported only when an input is theirs.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

DLPACK_CPU = 1
DLPACK_CUDA = 2
_DLPACK_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi",
                        10: "rocm", 11: "rocm_host", 13: "cuda_managed", 14: "oneapi", 15: "webgpu", 16: "hexagon"}

# Byte alignment required of every base pointer and every (non-unit) stride of a bf16/fp16 operand.
ALIGN_BYTES = 16

_ROOTS = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "cupy": "cupy", "numpy": "numpy"}
_FRAMEWORK_CACHE: dict = {}
_TORCH_DTYPE_NAMES: dict = {}


@dataclass(slots=True)
class TensorInfo:
    """What the validation needs to know about one operand, read from attributes only.

    ``strides`` are in elements (not bytes); ``dtype`` is a numpy-style name ("bfloat16", "float16", "float32",
    ...); ``device_type`` / ``device_id`` follow DLPack (1 = CPU, 2 = CUDA); ``data_ptr`` is the address of
    element ``[0, ..., 0]`` on that device, or None where it cannot be known without importing the tensor.
    """
    name: str
    shape: tuple
    strides: tuple
    dtype: str
    device_type: int
    device_id: int
    data_ptr: int | None
    framework: str
    itemsize: int = 0

    @property
    def is_cuda(self) -> bool:
        return self.device_type == DLPACK_CUDA

    @property
    def device(self) -> str:
        """Readable device, e.g. ``cuda:0`` or ``cpu``."""
        return device_name(self.device_type, self.device_id)


def device_name(device_type: int, device_id: int) -> str:
    kind = _DLPACK_DEVICE_NAMES.get(device_type, f"dlpack-device-{device_type}")
    return kind if device_type == DLPACK_CPU else f"{kind}:{device_id}"


def framework_of(x) -> str:
    """"torch", "jax", "cupy", "numpy" or "other", from the class hierarchy's top-level module (cached per type)."""
    t = type(x)
    fw = _FRAMEWORK_CACHE.get(t)
    if fw is None:
        fw = "other"
        for c in t.__mro__:
            root = (getattr(c, "__module__", None) or "").partition(".")[0]
            if root in _ROOTS:
                fw = _ROOTS[root]
                break
        _FRAMEWORK_CACHE[t] = fw
    return fw


def contiguous_strides(shape) -> tuple:
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(strides))


def _is_jax_tracer(x) -> bool:
    return any(c.__name__.endswith("Tracer") for c in type(x).__mro__)


def _byte_strides_to_elements(name, byte_strides, itemsize) -> tuple:
    out = []
    for s in byte_strides:
        s = int(s)
        if itemsize == 0 or s % itemsize:
            raise ValueError(f"{name}: byte stride {s} is not a multiple of the element size {itemsize}; "
                             f"copy it into a contiguous array first (e.g. .copy())")
        out.append(s // itemsize)
    return tuple(out)


_DTYPE_NAMES: dict = {}     # dtype object -> (name, itemsize): numpy's dtype.name is slow (~2 µs)


def _dtype_name_and_size(dt) -> tuple[str, int]:
    try:
        return _DTYPE_NAMES[dt]
    except (KeyError, TypeError):
        pass
    name = getattr(dt, "name", None)
    if not isinstance(name, str):
        name = str(dt)
    try:
        itemsize = int(getattr(dt, "itemsize"))
    except (AttributeError, TypeError, ValueError):
        try:
            itemsize = np.dtype(dt).itemsize
        except TypeError:
            itemsize = 0
    if len(_DTYPE_NAMES) < 256:
        try:
            _DTYPE_NAMES[dt] = name, itemsize
        except TypeError:       # unhashable
            pass
    return name, itemsize


def _dlpack_device(x, name) -> tuple[int, int]:
    fn = getattr(x, "__dlpack_device__", None)
    if fn is None:
        return DLPACK_CPU, 0        # no DLPack device: treat as a host object (rejected later as "not CUDA")
    try:
        dev_type, dev_id = fn()
    except Exception as e:          # e.g. a JAX array sharded over several devices
        raise ValueError(f"{name}: cannot determine its device through __dlpack_device__(): {e}") from e
    return int(dev_type), int(dev_id)


def describe(x, name: str) -> TensorInfo:
    """Describe ``x`` (torch / JAX / CuPy / numpy / any DLPack producer) from its attributes only.

    No DLPack capsule is consumed and no GPU is touched, so this also works on CPU objects (numpy and
    ``ml_dtypes`` arrays). Raises TypeError naming ``name`` for objects that are not arrays, and for JAX tracers
    (the functional API takes concrete arrays; :mod:`cupy_dash.jax` is the one for ``jax.jit`` / ``vmap``).
    """
    fw = framework_of(x)
    if fw == "torch":
        dt = x.dtype
        dtype = _TORCH_DTYPE_NAMES.get(dt)
        if dtype is None:
            dtype = _TORCH_DTYPE_NAMES[dt] = str(dt).rpartition(".")[2]
        if x.is_cuda:
            dev_type, dev_id, ptr = DLPACK_CUDA, x.get_device(), x.data_ptr()
        else:
            dev_type, dev_id, ptr = (DLPACK_CPU if x.device.type == "cpu" else 0), 0, None
        return TensorInfo(name, tuple(x.shape), tuple(x.stride()), dtype, dev_type, dev_id, ptr, fw,
                          x.element_size())
    if fw == "cupy":
        dtype, itemsize = _dtype_name_and_size(x.dtype)
        strides = _byte_strides_to_elements(name, x.strides, itemsize)
        return TensorInfo(name, tuple(x.shape), strides, dtype, DLPACK_CUDA, x.device.id, x.data.ptr, fw, itemsize)
    if fw == "numpy":
        if not isinstance(x, np.ndarray):                      # numpy scalars and the like
            raise TypeError(f"{name}: expected an array or tensor, got {type(x).__name__}")
        dtype, itemsize = _dtype_name_and_size(x.dtype)
        strides = _byte_strides_to_elements(name, x.strides, itemsize)
        ptr = x.__array_interface__["data"][0]
        return TensorInfo(name, tuple(x.shape), strides, dtype, DLPACK_CPU, 0, ptr, fw, itemsize)
    if fw == "jax":
        if _is_jax_tracer(x):
            raise TypeError(f"{name}: got a JAX tracer ({type(x).__name__}). This function takes concrete arrays "
                            f"only; inside jax.jit / grad / vmap use cupy_dash.jax.attention, "
                            f"cupy_dash.jax.attention_forward or cupy_dash.jax.attention_backward")
        dtype, itemsize = _dtype_name_and_size(x.dtype)
        shape = tuple(int(n) for n in x.shape)
        dev_type, dev_id = _dlpack_device(x, name)
        ptr = None
        if dev_type == DLPACK_CUDA:
            try:
                ptr = int(x.unsafe_buffer_pointer())
            except Exception:
                ptr = None
        return TensorInfo(name, shape, contiguous_strides(shape), dtype, dev_type, dev_id, ptr, fw, itemsize)
    # anything else speaking DLPack / the array interfaces
    if not (hasattr(x, "shape") and hasattr(x, "dtype")) or isinstance(x, type):
        raise TypeError(f"{name}: expected an array or tensor (torch, JAX, CuPy or any __dlpack__ object), "
                        f"got {type(x).__name__}")
    shape = tuple(int(n) for n in x.shape)
    dtype, itemsize = _dtype_name_and_size(x.dtype)
    dev_type, dev_id = _dlpack_device(x, name)
    iface = getattr(x, "__cuda_array_interface__", None) or getattr(x, "__array_interface__", None)
    strides, ptr = contiguous_strides(shape), None
    if isinstance(iface, dict):
        if iface.get("strides") is not None:
            strides = _byte_strides_to_elements(name, iface["strides"], itemsize)
        data = iface.get("data")
        if isinstance(data, tuple) and data:
            ptr = int(data[0])
    elif hasattr(x, "strides"):
        strides = _byte_strides_to_elements(name, x.strides, itemsize)
    return TensorInfo(name, shape, strides, dtype, dev_type, dev_id, ptr, fw, itemsize)


def check_layout(info: TensorInfo) -> None:
    """Raise ValueError (naming the argument) unless the kernels can read ``info`` through its strides.

    Rules: the last dimension has stride 1; every other dimension of size > 1 has a positive stride that is a
    multiple of 8 elements (16 bytes for bf16/fp16; the TMA maps take no broadcast, stride 0, dimension); the base
    pointer (when known) is 16-byte aligned. Dimensions of size 1 may have any stride (they are never stepped
    over).
    """
    name, shape, strides = info.name, info.shape, info.strides
    if not shape:
        return
    if shape[-1] > 1 and strides[-1] != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), got strides {strides} for "
                         f"shape {shape}; call .contiguous() (torch) or cupy.ascontiguousarray() first")
    step = ALIGN_BYTES // info.itemsize if info.itemsize and ALIGN_BYTES % info.itemsize == 0 else 1
    for dim, (n, s) in enumerate(zip(shape[:-1], strides[:-1])):
        if n > 1 and (s <= 0 or s % step):
            raise ValueError(f"{name}: stride {s} of dimension {dim} (strides {strides}, shape {shape}) must be a "
                             f"positive multiple of {step} elements ({ALIGN_BYTES} bytes) for the kernels' "
                             f"16-byte loads (an expanded tensor has stride 0: pass the kv heads once, as GQA); "
                             f".contiguous() fixes it")
    ptr = info.data_ptr
    if ptr is not None and ptr % ALIGN_BYTES:
        raise ValueError(f"{name}: base pointer {ptr:#x} is not {ALIGN_BYTES}-byte aligned (a view with an "
                         f"offset?); the kernels load 16 bytes at a time. A fresh copy fixes it: .contiguous() "
                         f"on a non-contiguous view, or .clone() / .copy()")


def check_contiguous(info: TensorInfo) -> None:
    """Raise ValueError (naming the argument) unless ``info`` is C-contiguous (size-1 dims ignored), aligned."""
    expected = contiguous_strides(info.shape)
    if any(n > 1 and s != e for n, s, e in zip(info.shape, info.strides, expected)):
        raise ValueError(f"{info.name}: must be contiguous, got strides {info.strides} for shape {info.shape}; "
                         f".contiguous() fixes it")
    if info.data_ptr is not None and info.data_ptr % ALIGN_BYTES:
        raise ValueError(f"{info.name}: base pointer {info.data_ptr:#x} is not {ALIGN_BYTES}-byte aligned; "
                         f"pass a fresh copy (.clone() / .copy())")


# ------------------------------------------------------------------------------------------------------------
# zero-copy in / out
# ------------------------------------------------------------------------------------------------------------
def to_cupy(x):
    """Zero-copy ``cupy.ndarray`` view of a CUDA tensor (``cupy.from_dlpack``) on the tensor's device.

    The producer orders its pending work before CuPy's current stream (DLPack stream handshake); JAX blocks
    until the buffer is ready. CuPy arrays are returned as they are.
    """
    import cupy
    if framework_of(x) == "cupy":
        return x
    dev_type, dev_id = _dlpack_device(x, "input")
    if dev_type != DLPACK_CUDA:
        raise ValueError(f"expected a CUDA tensor, got one on {device_name(dev_type, dev_id)}")
    with cupy.cuda.Device(dev_id):
        return cupy.from_dlpack(x)


def from_cupy(arr, like):
    """Return the ``cupy.ndarray`` ``arr`` as the caller's type, zero-copy.

    ``like`` is an input of a caller that is not torch's (torch callers' outputs are torch tensors already,
    ``api._new``): jax -> ``jax.dlpack.from_dlpack`` (or ``jax.numpy.from_dlpack``), otherwise the CuPy array
    itself. Call it while the stream that produced ``arr`` is CuPy's current stream, so that the consumer's stream
    is ordered after it by the DLPack handshake.
    """
    if framework_of(like) == "jax":
        import jax
        try:
            return jax.dlpack.from_dlpack(arr)
        except (AttributeError, TypeError):
            return jax.numpy.from_dlpack(arr)
    return arr


# ------------------------------------------------------------------------------------------------------------
# streams
# ------------------------------------------------------------------------------------------------------------
_EXTERNAL_STREAMS: dict = {}


def external_stream(ptr: int, device_id: int):
    """A CuPy view of a foreign stream handle (never destroys it), cached per (handle, device)."""
    key = (ptr, device_id)
    s = _EXTERNAL_STREAMS.get(key)
    if s is None:
        import cupy
        # NOTES: ExternalStream (deprecated in CuPy 14 in favour of Stream.from_external) is used on purpose: it
        # carries the device id and its object never destroys the handle, while from_external takes the
        # current device. The deprecation warning is silenced; the object is built once per stream.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            s = cupy.cuda.ExternalStream(ptr, device_id)
        if len(_EXTERNAL_STREAMS) > 1024:
            _EXTERNAL_STREAMS.clear()
        _EXTERNAL_STREAMS[key] = s
    return s


def caller_stream(x, device_id: int):
    """The caller's current stream on device ``device_id`` (``x``'s), as a CuPy stream.

    torch: ``torch.cuda.current_stream(device)``; CuPy, JAX and others: CuPy's current stream on that device
    (JAX synchronises at the DLPack boundary, see :func:`to_cupy`). Run all work of one call (allocations and
    kernels) inside ``with stream:`` so that CuPy's memory pool and the consumer see one ordered stream.
    """
    import cupy
    if framework_of(x) == "torch":
        return external_stream(_torch_stream_ptr(device_id), device_id)
    return cupy.cuda.get_current_stream(device_id)


def capturing(x) -> bool:
    """Whether the caller's current stream on ``x``'s device is capturing a CUDA graph.

    Only torch callers may capture (torch's current stream is the one cupy_dash launches on, its allocator serves the
    graph); a CuPy caller whose current stream is capturing gets RuntimeError (an eager call there would bake its
    error slot into the graph); other frameworks give False without touching the GPU.
    """
    import cupy
    fw = framework_of(x)
    if fw == "cupy":
        if cupy.cuda.runtime.streamIsCapturing(cupy.cuda.get_current_stream(x.device.id).ptr):
            raise RuntimeError("cupy_dash: CUDA graph capture is supported for torch callers (torch.cuda.graph, "
                               "torch.compile); CuPy's current stream is capturing: call cupy_dash outside the "
                               "capture, or capture through torch")
        return False
    if fw != "torch" or not x.is_cuda:
        return False
    return bool(cupy.cuda.runtime.streamIsCapturing(_torch_stream_ptr(x.get_device())))


_raw_torch_stream = None


def _torch_stream_ptr(device_id: int) -> int:
    """Handle of torch's current stream on ``device_id`` (the fast raw query when torch has it)."""
    global _raw_torch_stream
    if _raw_torch_stream is None:
        import torch
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _raw_torch_stream = raw if raw is not None else (
            lambda dev: torch.cuda.current_stream(dev).cuda_stream)
    return int(_raw_torch_stream(device_id))
