"""The NVML binding (nvidia-ml-py's `pynvml`) and the calls every NVML reader makes through it: one field read
without sinking the others (read_field), the first of several renamed functions that works (call_first), field
values as numbers, and NVML's texts in the forms the rest of gpufleet uses."""

from __future__ import annotations

# nvidia-ml-py is one of the engine's dependencies, yet every `gpufleet` command imports the readers (commands/main.py), the
# controller's too, and a node's Python may lack the binding: the readers then say so (BINDING_MISSING) in their
# reading, and a command that reads no GPU works as before.
try:
    import pynvml
except ImportError as exc:
    pynvml = None
    BINDING_ERROR: ImportError | None = exc
    BINDING_MISSING: str | None = f"nvidia-ml-py is not installed: {exc}"
else:
    BINDING_ERROR = BINDING_MISSING = None

MIB = 1024 * 1024


def init_nvml() -> None:
    """nvmlInit(); without the binding, raises its ImportError, so that a caller's `except` says what is missing."""
    if pynvml is None:
        raise BINDING_ERROR
    pynvml.nvmlInit()


def error_text(exc: Exception) -> str:
    try:
        text = str(exc)
    except Exception:  # str() of an NVMLError can call back into NVML
        text = ""
    return text or type(exc).__name__


def read_field(fn, *args):
    """(value, None) or (None, "error text"): one field never sinks the others."""
    try:
        return fn(*args), None
    except pynvml.NVMLError as exc:
        return None, error_text(exc)
    except Exception as exc:  # binding/driver mismatch (ctypes, missing symbol): record it too
        return None, f"{type(exc).__name__}: {error_text(exc)}"


def call_first(*calls):
    """Call (fn, *args) in turn, for functions that newer bindings or drivers renamed.

    Returns the first success; raises the first error. A None fn (a name the
    installed binding lacks) is passed over.
    """
    first = None
    for fn, *args in calls:
        if fn is None:
            continue
        try:
            return fn(*args)
        except Exception as exc:
            first = first or exc
    raise first or RuntimeError("the installed nvidia-ml-py has no function for this field")


def bus_id(raw) -> str | None:
    """NVML's "00000000:18:00.0" -> "0000:18:00.0", the form lspci and sysfs use."""
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    raw = (raw or "").strip().lower()
    if not raw:
        return None
    domain, _, rest = raw.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else raw


def cuda_version(value: int) -> str:
    """NVML's 13000 -> "13.0", 12020 -> "12.2"."""
    return f"{value // 1000}.{value % 1000 // 10}"


def as_text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def field_value(handle, field_id: int, scope_id: int = 0):
    """One NVML field value as a Python number; raises NVMLError like the other calls."""
    (val,) = pynvml.nvmlDeviceGetFieldValues(handle, [(field_id, scope_id)])
    if val.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(val.nvmlReturn)
    member = {
        pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(val.valueType, "ullVal")
    return getattr(val.value, member)
