"""Job notifications in a spec: --notify-url, and Slurm's --mail-type/--mail-user mapped
to it, from flags, #SBATCH lines and YAML; a mail address or an unsupported type warns
(unchanged Slurm scripts still run), a malformed value is an error."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.api.models import JobSpec
from phalanx.jobspec import JobSpecError, SubmitOptions, build_spec, load_yaml, parse_sbatch

URL = "https://hooks.example/phalanx/k3y"


def _build(**options: Any) -> tuple[JobSpec, list[str]]:
    return build_spec(SubmitOptions(**options), command=["true"], script=None, cwd="/w", environ={})


@pytest.mark.parametrize(
    ("mail_type", "events", "warning"),
    [
        (None, None, None),  # the head's default: END (which covers failures)
        ("END,FAIL", ["END", "FAIL"], None),
        ("begin,requeue", ["BEGIN", "REQUEUE"], None),
        ("ALL", ["BEGIN", "END", "FAIL", "REQUEUE"], None),
        ("END,ALL", ["END", "BEGIN", "FAIL", "REQUEUE"], None),
        ("NONE", [], None),
        ("END,TIME_LIMIT_90", ["END"], "TIME_LIMIT_90 is not supported by Phalanx; ignored"),
    ],
)
def test_mail_types_become_events(
    mail_type: str | None, events: list[str] | None, warning: str | None
) -> None:
    spec, warnings = _build(notify_url=URL, mail_type=mail_type)
    assert (spec.notify_url, spec.notify_on) == (URL, events)
    assert warnings == ([f"--mail-type={mail_type}: {warning}"] if warning else [])


def test_an_unknown_mail_type_is_an_error() -> None:
    with pytest.raises(JobSpecError, match=r"--mail-type=END,BEGINN: unknown type 'BEGINN'"):
        _build(notify_url=URL, mail_type="END,BEGINN")


def test_a_mail_user_url_is_the_webhook_and_an_address_is_warned_about() -> None:
    spec, warnings = _build(mail_user=URL, mail_type="FAIL")
    assert (spec.notify_url, spec.notify_on, warnings) == (URL, ["FAIL"], [])
    spec, warnings = _build(mail_user="ada@example.org", mail_type="END")
    assert spec.notify_url is None and spec.notify_on is None
    assert warnings[0].startswith("--mail-user=ada@example.org: Phalanx posts job notifications")
    assert (
        warnings[1] == "--mail-type=END: no --notify-url (or --mail-user URL) to post to; ignored"
    )


def test_two_different_webhooks_are_an_error() -> None:
    with pytest.raises(JobSpecError, match="name different webhooks"):
        _build(mail_user=URL, notify_url="https://other.example/x")


@pytest.mark.parametrize("url", ["ftp://hooks.example/x", "hooks.example/x", "http://a b/"])
def test_only_http_urls(url: str) -> None:
    with pytest.raises(JobSpecError, match=r"--notify-url / --mail-user: .*must be an http"):
        _build(notify_url=url)


def test_sbatch_directives() -> None:
    script = f"#!/bin/bash\n#SBATCH --mail-type=BEGIN,END\n#SBATCH --mail-user={URL}\nrun\n"
    opts, warnings = parse_sbatch(script)
    assert warnings == []
    spec, more = build_spec(opts, command=None, script=script, cwd="/w", environ={})
    assert (spec.notify_url, spec.notify_on, more) == (URL, ["BEGIN", "END"], [])
    opts, _ = parse_sbatch(f"#SBATCH --notify-url {URL}\nrun\n")
    assert opts.notify_url == URL


def test_yaml() -> None:
    spec, _ = load_yaml(
        f"command: [true]\nnotify_url: {URL}\nmail_type: [END, FAIL]\n", cwd="/w", environ={}
    )
    assert (spec.notify_url, spec.notify_on) == (URL, ["END", "FAIL"])
    spec, _ = load_yaml(
        f"command: [true]\nnotify_url: {URL}\nnotify_on: [BEGIN]\n", cwd="/w", environ={}
    )
    assert spec.notify_on == ["BEGIN"]
    with pytest.raises(JobSpecError, match="notify_on names events but notify_url is not set"):
        load_yaml("command: [true]\nnotify_on: [END]\n", cwd="/w", environ={})
