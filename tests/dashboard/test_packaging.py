"""The dashboard's templates and static files ship in the wheel: every file under them
matches a pattern pyproject.toml's package-data declares for the package."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "phalanx" / "head" / "dashboard"


def test_every_template_and_static_file_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["phalanx.head.dashboard"]
    files = [
        p.relative_to(PACKAGE).as_posix()
        for folder in ("templates", "static")
        for p in (PACKAGE / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert len(files) >= 20
    # What setuptools ships: the patterns globbed in the package's folder (a `*` stays
    # within one folder, as there).
    shipped = {p.relative_to(PACKAGE).as_posix() for pat in patterns for p in PACKAGE.glob(pat)}
    assert sorted(set(files) - shipped) == []
