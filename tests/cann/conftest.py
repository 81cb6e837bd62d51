"""CANN tier: our C++ registrations run through CANN's own registries on this CPU, beside upstream's.

The tier builds `make cann-host-drivers` against the CANN source kit (env CANN_SRC, default
<repo>/../shared/cann-src): build/cann-host/libattnres_ge_cann_host.a and two copies of the driver
tests/cann/cann_driver.cpp, one linked with our archive, one with upstream's. Without a kit (or without g++)
the tier is skipped with the reason, except under CI (env CI set), where it fails.

At the end of the session the tier prints its counts (cases compared; cold / late / strict outcomes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 900
RUN_TIMEOUT_S = 120

# Filled by the tests, printed by pytest_terminal_summary.
COUNTS: dict[str, int] = {}


def _count(name: str, by: int = 1) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + by


@pytest.fixture(scope="session")
def count():
    """count(name, by=1): add to a counter printed at the end of the session."""
    return _count


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _kit_dir() -> Path:
    return Path(os.environ.get("CANN_SRC") or REPO.parent / "shared" / "cann-src").resolve()


def _unavailable(reason: str):
    if _in_ci():
        pytest.fail(f"CANN tier: {reason}; CI must run this tier", pytrace=False)
    pytest.skip(f"CANN tier SKIPPED: {reason}")


@dataclass
class DriverRun:
    lines: list[dict]
    output: str  # stdout + stderr, with the registrations' log lines


@dataclass
class Drivers:
    bin_dir: Path
    runs: dict = field(default_factory=dict)

    def run(self, which: str, commands: list[str], **env) -> DriverRun:
        """Feed `commands` to driver_<which> ("ours" | "upstream"); JSON lines in order, and the whole output."""
        environment = dict(os.environ, CANN_SIM_ERRMSG_QUIET="1", ASCEND_GLOBAL_LOG_LEVEL="2")
        environment.pop("ATTNRES_GE_STRICT_PLATFORM", None)
        environment.update(env)
        done = subprocess.run(
            [str(self.bin_dir / f"driver_{which}")],
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env=environment,
            check=False,
        )
        assert done.returncode == 0, f"driver_{which} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr}"
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"cmd"')]
        wanted = sum(1 for c in commands if c.strip() and not c.startswith("#") and c.split()[0] != "opdef")
        assert len([x for x in lines if x["cmd"] != "opdef"]) == wanted, "driver skipped commands"
        return DriverRun(lines, done.stdout + done.stderr)


@pytest.fixture(scope="session")
def drivers() -> Drivers:
    kit = _kit_dir()
    if not (kit / "build.sh").is_file():
        _unavailable(f"no CANN source kit at {kit} (set CANN_SRC)")
    if shutil.which("g++") is None or shutil.which("make") is None:
        _unavailable("g++ or make not found")
    jobs = str(max(1, min(os.cpu_count() or 1, 4)))
    done = subprocess.run(
        ["make", "--no-print-directory", f"-j{jobs}", "cann-host-drivers", f"CANN_SRC={kit}", f"CANN_JOBS={jobs}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"make cann-host-drivers failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}", pytrace=False)
    return Drivers(REPO / "build" / "cann-host" / "bin")


@pytest.fixture(scope="session")
def cann_kit(drivers) -> Path:
    """The CANN source kit the drivers were built against."""
    return _kit_dir()


def pytest_terminal_summary(terminalreporter):
    if not COUNTS:
        return
    terminalreporter.write_sep("-", "CANN tier counts")
    for name in sorted(COUNTS):
        terminalreporter.write_line(f"{name}: {COUNTS[name]}")
