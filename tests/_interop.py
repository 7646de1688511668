"""Virtualenvs for the interoperability tests: the published prime-runs, and verifiers beside this project.

Building one downloads and installs tens of packages (verifiers brings about a
hundred), so each is kept under ``.cache/interop/`` in the repository, named by
a digest of everything that decides its content (the interpreter, what is
installed and in which order, and this project's packaging files), and built
once: a second test session, or the suite under another Python, reuses it.
This project is installed editable, so a reused virtualenv runs the working
tree's code. A build that fails leaves nothing behind; the index must be
reachable (it is the one network these tests use). Without an interpreter or
the index, the tests skip, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "interop"
PUBLISHED_SDK = "prime-runs==0.1.4"
VERIFIERS = "verifiers==0.4.0"
OURS = ("-e", str(REPO / "packaging" / "prime-traces"), "-e", str(REPO))
_BUILD_TIMEOUT_S = 900


def unavailable(reason: str) -> None:
    """Skip the test, or fail it under ``CI=true``, where nothing may be skipped."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and the interoperability tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def python_at_least(minor: int) -> str:
    """An interpreter of Python 3.``minor`` or newer: this one, else one of pyenv's, else one on ``PATH``."""
    if sys.version_info >= (3, minor):
        return sys.executable
    candidates = sorted(glob.glob(f"/root/.pyenv/versions/3.{minor}.*/bin/python"))
    found = candidates[-1] if candidates else shutil.which(f"python3.{minor}")
    if found is None:
        unavailable(f"no Python 3.{minor} on this machine")
    assert found is not None
    return found


def _digest(python: str, steps: Sequence[Sequence[str]]) -> str:
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=True
    ).stdout
    hashed = hashlib.sha256(version.encode())
    for step in steps:
        hashed.update(repr(list(step)).encode())
    for packaging in ("setup.cfg", "setup.py", "packaging/prime-traces/setup.py"):
        hashed.update((REPO / packaging).read_bytes())
    return hashed.hexdigest()[:16]


def virtualenv(name: str, python: str, steps: Sequence[Sequence[str]]) -> Path:
    """A virtualenv of ``python`` with ``steps`` (each the arguments of one ``pip install``) run in order."""
    target = CACHE / f"{name}-{_digest(python, steps)}"
    ready = target / ".ready"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent session waits for the build instead of doing it again
        if ready.exists():
            return target
        shutil.rmtree(target, ignore_errors=True)
        try:
            _run([python, "-m", "venv", str(target)])
            for step in steps:
                _run([str(target / "bin" / "python"), "-m", "pip", "install", "-q", *step])
        except subprocess.CalledProcessError as err:
            shutil.rmtree(target, ignore_errors=True)
            unavailable(f"building the {name} virtualenv failed: {err.stderr[-2000:] if err.stderr else err}")
        ready.write_text("built\n")
    return target


def _run(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, cwd=REPO)


def pip_check(venv: Path) -> str:
    """``pip check``'s verdict on ``venv``."""
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True)
    return (done.stdout + done.stderr).strip()


def run_script(venv: Path, script: Path, *args: str, env: dict[str, str], timeout_s: float = 300) -> str:
    """Run ``script`` with ``venv``'s interpreter; its stdout (its stderr in the assertion when it fails)."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={"PATH": os.environ.get("PATH", ""), **env},
        cwd=str(script.parent),
    )
    assert done.returncode == 0, f"{script.name} {' '.join(args)} failed:\n{done.stderr[-5000:]}"
    return done.stdout
