"""The login link `make demo` and `phalanx up` print (`/ui/login#token=…`): the browser
signs in with the token from the URL's fragment, which never reaches the server, and the
token leaves the address bar and history at once."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from phalanx.local import LocalCluster
from tests.dashboard.conftest import People, shot


def test_a_login_link_signs_in_and_leaves_no_token_in_the_address(
    cluster: LocalCluster, people: People, page: Page
) -> None:
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.goto(f"{cluster.url}/ui/login#token={people.alice}")
    expect(page).to_have_url(f"{cluster.url}/ui/")
    expect(page.locator("body")).to_contain_text(people.alice_name)
    assert people.alice not in page.url
    assert not [u for u in requested if people.alice in u]  # the fragment is never sent
    assert page.evaluate("window.history.length") <= 2
    shot(page, "login-link")


def test_a_login_link_with_a_bad_token_shows_the_error_and_does_not_loop(
    cluster: LocalCluster, page: Page
) -> None:
    page.goto(f"{cluster.url}/ui/login#token=phx_not-a-real-token")
    expect(page.locator("#login-error")).to_contain_text("unknown or revoked token")
    assert "#token" not in page.url
