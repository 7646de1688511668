"""The prime-traces distribution: the prime_traces package (the client and the local service) of this repository.

Built beside prime-runs (the repository's top-level setup.cfg) from the same source tree, with the same
version; ``pip install -e ./packaging/prime-traces -e .`` installs both.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

SOURCE = Path(__file__).resolve().parents[2]
VERSION = re.search(r'__version__ = "([^"]+)"', (SOURCE / "prime_traces" / "version.py").read_text()).group(1)

setup(
    name="prime-traces",
    version=VERSION,
    description="Client for the Prime Traces service, and a local Traces service (prime-traces serve).",
    long_description=(SOURCE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(where=str(SOURCE), include=["prime_traces", "prime_traces.*"]),
    package_dir={"prime_traces": "../../prime_traces"},
    package_data={"prime_traces": ["py.typed", "server/ui/*", "server/ui/vendor/*"]},
    include_package_data=False,
    install_requires=["requests>=2.31", "orjson>=3.9", "zstandard>=0.22", "tenacity>=8.2", "urllib3>=2.0"],
    extras_require={
        # The client deflates gzip uploads with ISA-L when it is installed: 3 to 5 times less CPU than zlib.
        "gzip": ["isal>=1.6"],
        # The local service inflates gzip uploads with ISA-L when it is installed.
        "server": ["isal>=1.6"],
    },
    entry_points={"console_scripts": ["prime-traces = prime_traces.cli:main"]},
    zip_safe=False,
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Typing :: Typed",
    ],
)
