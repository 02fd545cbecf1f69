"""A pinned cuBLASLt algorithm rebuilt from a fix file's `Pin`, on an `LtGemm`'s descriptors.

cublasLtMatmulAlgoInit(handle, compute type, scale type, A/B/C/D types, algo id) makes the
struct, cublasLtMatmulAlgoConfigSetAttribute sets every attribute of ALGO_ATTRIBUTES
(planning.lt_enums), and cublasLtMatmulAlgoCheck says whether this cuBLASLt can run it on the
problem and how much workspace it needs. Anything on the way that fails is a PinRefused naming
the pin and cuBLAS's status: a pin is run as recorded or not at all.

Enum attributes arrive as the names lt._enum_name gives them (tile '128x64', stages '8x5',
reduction 'INPLACE', cluster '4x1x1' or 'AUTO') or, where the binding had no name, as the number
itself ('24'): both turn back into cuBLASLt's numbers through nvmath's enums.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from cublas_audit.device.lt import LtCandidate, LtGemm, algo_config_get
from cublas_audit.errors import PinRefused
from cublas_audit.planning.lt_enums import ALGO_ATTRIBUTES, SPECS
from cublas_audit.planning.modes import CUDA_R_32F
from cublas_audit.planning.modes import mode as mode_of
from cublas_audit.table.fix_file import Pin


def pinned_candidate(gemm: LtGemm, pin: Pin) -> LtCandidate:
    """The pin as a candidate `gemm.run` / `gemm.launch` can launch, its workspace_bytes what
    cublasLtMatmulAlgoCheck says it needs; PinRefused where this cuBLASLt cannot build it."""
    import numpy

    lt = gemm.lt
    algo = numpy.zeros(1, dtype=lt.matmul_algo_dtype)
    spec = mode_of(gemm.mode)
    types = (spec.data_type,) * 4  # A, B, C and D share the mode's data type
    try:
        # The scale type (alpha, beta) is FP32 in every mode, as LtGemm's descriptor says.
        lt.matmul_algo_init(
            gemm.handle, spec.compute_type, CUDA_R_32F, *types, pin.algo_id, algo.ctypes.data
        )
    except Exception as exc:
        raise refused(pin, gemm, f"cublasLtMatmulAlgoInit: {status_of(exc)}") from exc
    for attribute, name in ALGO_ATTRIBUTES:
        _set_attribute(gemm, pin, algo, attribute, attribute_number(lt, pin, name))
    try:
        result = gemm.check(algo)
    except Exception as exc:
        raise refused(pin, gemm, f"cublasLtMatmulAlgoCheck: {status_of(exc)}") from exc
    # The check raises on a failed status; a result it marked failed is refused all the same.
    state = int(result["state"][0]) if "state" in (result.dtype.names or ()) else 0
    if state != 0:  # 0: CUBLAS_STATUS_SUCCESS
        raise refused(pin, gemm, f"cublasLtMatmulAlgoCheck: {_status_name(lt, state)}")
    workspace = int(result["workspace_size"][0])
    return gemm.describe(0, algo, workspace, float(result["waves_count"][0]))


def attribute_number(lt: ModuleType, pin: Pin, name: str) -> int:
    """The pin's value of one attribute as cuBLASLt's number: an int field as it is, an enum
    field's name through nvmath's enum (a bare number as that number)."""
    value = getattr(pin, name)
    if isinstance(value, int):
        return value
    text = str(value)
    if text.isdigit():
        return int(text)
    spec = SPECS.get(name)
    enum, prefix = (spec.nvmath_enum, spec.nvmath_prefix) if spec else ("", "")
    members = getattr(lt, enum, None) if enum else None
    if members is None:
        names = f"this nvmath has no {enum} to name it" if enum else "it takes a number"
        raise PinRefused(f"{_pin_words(pin)}: {name} {text!r} is not a number ({names})")
    try:
        return int(members[prefix + text])
    except KeyError:
        raise PinRefused(
            f"{_pin_words(pin)}: {name} {text!r} is not a name of nvmath's {enum}"
        ) from None


def _set_attribute(gemm: LtGemm, pin: Pin, algo: Any, attribute: str, value: int) -> None:
    """One config attribute of the algo struct. An attribute this binding lacks is left at
    cuBLASLt's initial value only where the pin asks for that value (0) anyway."""
    import numpy

    lt = gemm.lt
    attr = getattr(lt.MatmulAlgoConfigAttribute, attribute, None)
    if attr is None:
        if value != 0:
            raise refused(pin, gemm, f"this nvmath cannot set {attribute} (wanted {value})")
        return
    dtype = lt.get_matmul_algo_config_attribute_dtype(attr)
    # Wrapped to the attribute's width: TunableOp writes the unsigned split-K value
    # 0xFFFFFFFF as -1, and means those same four bytes.
    buf = numpy.array([value], dtype=numpy.int64).astype(dtype)
    try:
        lt.matmul_algo_config_set_attribute(algo.ctypes.data, attr, buf.ctypes.data, buf.nbytes)
    except Exception as exc:
        raise refused(pin, gemm, f"{attribute} {value}: {status_of(exc)}") from exc
    kept = algo_config_get(lt, algo, attribute)
    if kept is not None and kept != int(buf[0]):  # read back: the struct holds what was asked
        raise refused(pin, gemm, f"{attribute} {value} was set, the algorithm holds {kept}")


def pin_of(candidate: LtCandidate) -> Pin:
    """A candidate's configuration as a Pin (what fix.json records for it); a ValueError where
    this cuBLASLt did not report one of its attributes."""
    values = {name: getattr(candidate, name) for _, name in ALGO_ATTRIBUTES}
    missing = [name for name, value in values.items() if value is None]
    if candidate.algo_id is None or missing:
        raise ValueError(f"candidate {candidate.index} lacks {', '.join(missing) or 'algo_id'}")
    return Pin(
        algo_id=candidate.algo_id,
        tile=str(values["tile"]),
        stages=str(values["stages"]),
        split_k=int(values["split_k"]),
        reduction_scheme=str(values["reduction_scheme"]),
        cta_swizzling=int(values["cta_swizzling"]),
        custom_option=int(values["custom_option"]),
        inner_shape=int(values["inner_shape"]),
        cluster_shape=str(values["cluster_shape"]),
        workspace_bytes=candidate.workspace_bytes,
    )


def refused(pin: Pin, gemm: LtGemm, why: str) -> PinRefused:
    """One line: the pin, the problem, this cuBLASLt's version and what it said."""
    version = gemm.lt.get_version()
    problem = f"{gemm.mode} {gemm.m}x{gemm.n}x{gemm.k} {gemm.case.layout}"
    return PinRefused(f"cuBLASLt {version} cannot run {_pin_words(pin)} on {problem}: {why}")


def status_of(exc: BaseException) -> str:
    """cuBLASLt's status in an nvmath error ('CUBLAS_STATUS_NOT_SUPPORTED (15): ...'), one
    line."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _status_name(lt: ModuleType, status: int) -> str:
    try:
        return f"{lt.get_status_name(status)} ({status})"
    except Exception:
        return f"status {status}"


def _pin_words(pin: Pin) -> str:
    return f"the pin ({pin.words()})"
