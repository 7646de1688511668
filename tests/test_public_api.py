"""The public API is chosen: both ``__all__`` lists are pinned, and ``prime_runs`` uses only
``prime_traces``' public surface (modules without a leading underscore)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import prime_runs
import prime_traces

PRIME_TRACES_API = [
    "APIError",
    "APITimeoutError",
    "AmbiguousDeleteError",
    "Batch",
    "BatchOutcome",
    "BatchStatus",
    "EpisodeDetail",
    "EpisodeError",
    "EpisodeListPage",
    "EpisodeSummary",
    "ErrorCode",
    "EpisodeTraceAggregate",
    "Execution",
    "ForbiddenError",
    "LineFormat",
    "LineFormatConflictError",
    "LineStatus",
    "LocalTracesService",
    "MetricRow",
    "MetricsPage",
    "ModelInfo",
    "NotFoundError",
    "PaymentRequiredError",
    "PrimeTracesError",
    "ResponseFormatError",
    "RetryableAPIError",
    "RunFinishedError",
    "RunListPage",
    "RunStep",
    "RunStepList",
    "RunSummary",
    "Score",
    "TraceListPage",
    "TraceSummary",
    "TraceTooLargeError",
    "TracesClient",
    "TransportError",
    "UnauthorizedError",
    "UploadError",
    "UploadReceipt",
    "UploadReport",
    "ValidationRejectedError",
    "__version__",
]

PRIME_RUNS_API = [
    "APIError",
    "CONFIG_SOURCE_KEY",
    "ConfigSource",
    "ConfigurationError",
    "RunDirectoryError",
    "EnvironmentRef",
    "EnvironmentResolutionError",
    "ForbiddenError",
    "KINDS",
    "MODES",
    "MODE_ENV",
    "NotFoundError",
    "PaymentRequiredError",
    "PrimeRunsError",
    "RetryableAPIError",
    "Run",
    "RunFinishedError",
    "RunKind",
    "RunStatus",
    "SinkError",
    "TRACES_OPT_OUT_ENV",
    "TrainingSpec",
    "TransportError",
    "UnauthorizedError",
    "__version__",
    "init",
    "metrics",
    "projection",
]


def test_prime_traces_exports_exactly_its_chosen_api():
    assert sorted(prime_traces.__all__) == sorted(PRIME_TRACES_API)
    for name in prime_traces.__all__:
        assert getattr(prime_traces, name) is not None, name


def test_prime_runs_exports_exactly_its_chosen_api():
    assert sorted(prime_runs.__all__) == sorted(PRIME_RUNS_API)
    for name in prime_runs.__all__:
        assert getattr(prime_runs, name) is not None, name


def test_every_error_of_prime_traces_lives_in_its_errors_module_under_one_root():
    for name in prime_traces.__all__:
        value = getattr(prime_traces, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert value.__module__ == "prime_traces.errors", name
            assert issubclass(value, prime_traces.PrimeTracesError), name


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, at any depth, with its line (``from a import b`` gives ``a.b`` too)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _private(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "prime_traces" and any(part.startswith("_") and part != "__version__" for part in parts[1:])


def test_prime_runs_imports_no_private_module_of_prime_traces():
    offences = []
    for path in sorted(Path(prime_runs.__file__).parent.rglob("*.py")):
        for line, module in _imports(path):
            if _private(module):
                offences.append(f"{path.name}:{line}: {module}")
    assert offences == []


def test_the_boundary_check_sees_a_private_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f():\n"
        "    from prime_traces._http.transport import Transport\n"
        "    from prime_traces._lines import encoder\n"
    )
    assert {m for _, m in _imports(probe) if _private(m)} >= {
        "prime_traces._http.transport",
        "prime_traces._lines.encoder",
    }


def test_public_modules_of_prime_traces_are_documented_and_import():
    for info in pkgutil.iter_modules(prime_traces.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"prime_traces.{info.name}")
        assert (module.__doc__ or "").strip(), f"prime_traces.{info.name} has no docstring"


@pytest.mark.parametrize(
    ("module", "name", "home"),
    [
        (prime_traces, "DEFAULT_TARGET_BATCH_BYTES", "prime_traces.client"),
        (prime_traces, "MAX_LINE_BYTES", "prime_traces.encoding"),
        (prime_traces, "GZIP_LEVEL", "prime_traces._upload.compress"),
        (prime_runs, "UploadWorker", "prime_runs._upload.worker"),
        (prime_runs, "Sink", "prime_runs._records.sink"),
        (prime_runs, "SinkStatus", "prime_runs._records.sink"),
        (prime_runs, "Ledger", "prime_runs._records.ledger"),
        (prime_runs, "RunStateError", "prime_runs.errors"),
    ],
)
def test_names_of_earlier_releases_still_resolve_with_a_deprecation_warning(module, name, home):
    with pytest.warns(DeprecationWarning, match=f"{module.__name__}.{name} is deprecated"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(home), name)
    assert name not in module.__all__


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError):
        prime_traces.NO_SUCH_NAME  # noqa: B018
    with pytest.raises(AttributeError):
        prime_runs.NO_SUCH_NAME  # noqa: B018


def test_the_local_service_loads_only_when_asked_for():
    script = (
        "import sys, prime_traces; assert 'prime_traces.server' not in sys.modules; prime_traces.LocalTracesService"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert "LocalTracesService" in dir(prime_traces)
