"""Dashboard fixtures: a real cluster (head + agents with fake GPUs), people with tokens,
and Playwright driving Debian's chromium (never a browser Playwright downloads)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from phalanx.api.models import TeamSpec, UserCreate
from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from tests.e2e.helpers import cancel_all

CHROMIUM = os.environ.get("PHALANX_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Screenshots and page dumps the browser tests leave (gitignored; CI keeps them).
# Live updates arrive within a second; a busy 2-core test machine gets more room.
expect.set_options(timeout=20_000)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"


@dataclass(frozen=True)
class People:
    """Tokens of an admin and two plain users in different teams, and their teams."""

    admin: str
    alice: str  # team `red_…`
    bob: str  # team `blue_…`
    alice_name: str
    bob_name: str
    red: str
    blue: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A head (TLS, as `phalanx up` runs it) and agents 127.0.0.2 and 127.0.0.3, each with
    two fake GPUs (busy while a job's process holds them, idle otherwise)."""
    state = tmp_path_factory.mktemp("dashboard")
    with LocalCluster(state, nodes=2, gpus_per_node=2) as running:
        yield running


@pytest.fixture(scope="module")
def people(cluster: LocalCluster) -> People:
    suffix = uuid.uuid4().hex[:6]
    red, blue = f"red_{suffix}", f"blue_{suffix}"
    alice, bob = f"alice_{suffix}", f"bob_{suffix}"
    with cluster.client() as api:
        for team in (red, blue):
            api.set_team(TeamSpec(name=team))
        api.create_user(UserCreate(name=alice, teams=[red]))
        api.create_user(UserCreate(name=bob, teams=[blue]))
        return People(
            admin=cluster.admin_token,
            alice=api.create_token(alice).token,
            bob=api.create_token(bob).token,
            alice_name=alice,
            bob_name=bob,
            red=red,
            blue=blue,
        )


@pytest.fixture
def api(cluster: LocalCluster) -> Iterator[PhalanxClient]:
    """The admin's client; every job a test leaves is cancelled afterwards."""
    with cluster.client() as client:
        yield client
        try:
            cancel_all(client)
        finally:
            cluster.check()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    # The head's certificate is from its own CA, which this browser profile does not know.
    ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(20_000)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


def sign_in(page: Page, url: str, token: str, then: str = "/ui/") -> None:
    """Sign in through the login page as a person would."""
    page.goto(f"{url}/ui/login?next={then}")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}{then}*")


def shot(page: Page, name: str) -> Path:
    """Save a full-page screenshot as a test artefact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The test's job working directory (absolute, as the head requires)."""
    path = tmp_path.resolve() / "work"
    path.mkdir(exist_ok=True)
    return path
