"""The one error type the CLI turns into a one-line message and a non-zero exit."""


class AuditError(Exception):
    """A user-facing failure: bad input, missing tool, no permission. Its text is the message."""

    exit_code = 2


class ToolMissingError(AuditError):
    """ncu, a GPU, or a Python package the command needs is not available here."""

    exit_code = 3


class InterruptedSweepError(AuditError):
    """The sweep was stopped before all cases finished; what finished is on disk."""

    exit_code = 130


class PinRefused(AuditError):
    """This cuBLASLt cannot build a pinned algorithm for a problem (an unknown algorithm id or
    attribute name, a configuration cublasLtMatmulAlgoCheck rejects, more workspace than given):
    refused at once, never run as something else or as nothing."""


class OperandMismatch(AuditError, ValueError):
    """An array handed to a pinned GEMM is not the one it was built for (shape, strides, dtype,
    device, alignment): one line, before anything is launched, never a wrong result."""
