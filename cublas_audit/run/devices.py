"""Which GPUs of this host a run spreads over (run.multi_gpu's Spread): --devices' syntax
(checked before any GPU is looked up), the GPUs it names among nvidia-smi's, and one model
unless --allow-mixed."""

from __future__ import annotations

from collections.abc import Sequence

from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.observe.environment import Gpu


def device_indices(text: str) -> list[int] | None:
    """--devices' syntax, which needs no GPU: None for `all`, else the indices `0,1,...`
    (nvidia-smi's numbering: non-negative integers, each once)."""
    if text.strip() == "all":
        return None
    picked: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        if not (item.isascii() and item.isdigit()):  # 'gpu0', '-1', '' (a stray comma)
            raise AuditError(
                f"--devices: {item!r} is not a GPU index; give all or indices 0,1,... "
                "(nvidia-smi's numbering)"
            )
        if int(item) in picked:
            raise AuditError(f"--devices: GPU {item} is named twice")
        picked.append(int(item))
    return picked


def parse_devices(text: str, gpus: Sequence[Gpu]) -> list[Gpu]:
    """`all` or indices `0,1,...` of this host's GPUs (nvidia-smi's numbering)."""
    indices = device_indices(text)
    if not gpus:
        raise ToolMissingError("--devices: no NVIDIA GPU found here (nvidia-smi lists none)")
    if indices is None:
        return list(gpus)
    by_index = {gpu.index: gpu for gpu in gpus}
    for index in indices:
        if index not in by_index:
            known = ", ".join(str(i) for i in by_index)
            has = f"{len(by_index)} GPU{'s' if len(by_index) > 1 else ''}, index {known}"
            raise AuditError(f"--devices: '{index}' is not a GPU of this host (it has {has})")
    return [by_index[index] for index in indices]


def check_models(devices: Sequence[Gpu], allow_mixed: bool) -> None:
    """One model unless --allow-mixed: a table of two models is two audits, not one."""
    models = sorted({gpu.name for gpu in devices})
    if len(models) > 1 and not allow_mixed:
        raise AuditError(
            f"--devices: the GPUs are of different models ({', '.join(models)}); give "
            "--allow-mixed to run on all of them, reported per model"
        )
