"""A report's header rows of the machine: the GPU, clocks, driver, cuBLAS and how the run was
measured (env.json, or a bare table's own provenance columns), and the roofline figures its
findings were judged with. Shared by the sweep, map and atlas reports."""

from __future__ import annotations

from cublas_audit.judge.roofline import Machine
from cublas_audit.report.markdown import md_text
from cublas_audit.table.inputs import Dataset, first_value
from cublas_audit.table.rundir import env_value

_ENV_ROWS = (
    ("GPU", ("gpu_name", "cc", "sm_count", "memory_gb"), "{} (cc {}, {} SMs, {} GB)"),
    ("SM clock", ("sm_clock_mhz", "sm_clock_max_mhz"), "{} MHz (max {} MHz)"),
    ("driver", ("driver_version",), "{}"),
    ("CUDA runtime", ("cuda_runtime",), "{}"),
    ("cuBLAS", ("cublas_version",), "{}"),
    ("ncu", ("ncu_version", "ncu_clock_control"), "{} (clock control {})"),
    ("probe environment", ("probe_env",), "{}"),
    ("run", ("started", "finished"), "{} to {}"),
    ("tool", ("tool_version",), "cublas-audit {}"),
)


def env_rows(dataset: Dataset) -> list[tuple[str, str]]:
    """Header rows from env.json; a bare table falls back on its own provenance columns."""
    env = dataset.env.raw or {
        key: first_value(dataset.frame, key)
        for key in ("gpu_name", "cc", "driver_version", "cublas_version")
    }
    rows = [("GPU label", md_text(dataset.gpu_label))]
    for title, keys, pattern in _ENV_ROWS:
        values = [env.get(key) for key in keys]
        if values[0] in (None, ""):
            continue
        complete = all(v not in (None, "") for v in values)
        # The details in the pattern only when all are known: a bare table has the name alone.
        text = pattern.format(*map(env_value, values)) if complete else env_value(values[0])
        rows.append((title, md_text(text)))
    if not dataset.env.recorded:
        rows.append(("source", md_text("a bare table: no env.json, environment not recorded")))
    else:  # docs/report.md, "How each number is measured"
        rows.append(("operands", md_text(dataset.env.operands)))
    return rows


def roofline_rows(machine: Machine | None) -> list[tuple[str, str]]:
    """The roofline's figures the findings were judged with, and where each comes from."""
    if machine is None:
        return [("roofline", "not known for this GPU: utilization judged without a bound")]
    peaks = ", ".join(f"{mode} {peak:.1f}" for mode, peak in machine.peaks.items())
    dram = f"{machine.dram_gbps / 1000:.2f} TB/s" if machine.dram_gbps else "unknown"
    return [
        ("roofline DRAM", md_text(f"{dram} ({machine.dram_source})")),
        (
            "roofline peaks",
            md_text(f"TFLOP/s {peaks} ({machine.peak_source})" if peaks else "unknown"),
        ),
    ]
