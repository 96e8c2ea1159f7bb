"""`--notify-url`, `--mail-type` and `--mail-user`: job notifications as a webhook."""

from __future__ import annotations

from typing import Any

from phalanx.api.models import NotifyEvent
from phalanx.jobspec.errors import JobSpecError
from phalanx.jobspec.options import SubmitOptions

EVENTS: tuple[NotifyEvent, ...] = ("BEGIN", "END", "FAIL", "REQUEUE")
# Slurm mail types with no webhook counterpart here: warned about, not an error, so that
# unchanged batch scripts still run.
_UNSUPPORTED = frozenset(
    {
        "INVALID_DEPEND",
        "STAGE_OUT",
        "TIME_LIMIT",
        "TIME_LIMIT_90",
        "TIME_LIMIT_80",
        "TIME_LIMIT_50",
        "ARRAY_TASKS",
    }
)


def parse_mail_type(text: str, warnings: list[str]) -> list[NotifyEvent]:
    """`END,FAIL` → the events, in Slurm's names; `ALL` is all four, `NONE` none.
    Slurm types Phalanx cannot post (TIME_LIMIT_90, …) add a warning."""
    events: list[NotifyEvent] = []
    for raw in text.split(","):
        item = raw.strip().upper()
        if item == "ALL":
            events.extend(EVENTS)
        elif item == "NONE":
            continue
        elif item in EVENTS:
            events.append(item)
        elif item in _UNSUPPORTED:
            warnings.append(f"--mail-type={text}: {item} is not supported by Phalanx; ignored")
        else:
            raise JobSpecError(
                f"--mail-type={text}: unknown type {raw.strip()!r}; use BEGIN, END, FAIL, "
                "REQUEUE, ALL or NONE (comma-separated)"
            )
    return list(dict.fromkeys(events))


def _is_web_url(text: str) -> bool:
    return text.lower().startswith(("http://", "https://"))


def notify_fields(opts: SubmitOptions) -> tuple[dict[str, Any], list[str]]:
    """The JobSpec's `notify_url`/`notify_on` from the options, and warnings. A mail
    address is not an error (Slurm scripts carry them): warned about and ignored."""
    warnings: list[str] = []
    url = opts.notify_url
    if opts.mail_user is not None:
        if not _is_web_url(opts.mail_user.strip()):
            warnings.append(
                f"--mail-user={opts.mail_user}: Phalanx posts job notifications to a webhook, "
                "it sends no mail; ignored (give --notify-url URL, or --mail-user URL)"
            )
        elif url is not None and url != opts.mail_user.strip():
            raise JobSpecError(
                f"--mail-user={opts.mail_user} and --notify-url={url} name different "
                "webhooks; give one"
            )
        else:
            url = opts.mail_user.strip()
    events = parse_mail_type(opts.mail_type, warnings) if opts.mail_type is not None else None
    if url is None:
        if events:
            warnings.append(
                f"--mail-type={opts.mail_type}: no --notify-url (or --mail-user URL) to post "
                "to; ignored"
            )
        return {}, warnings
    fields: dict[str, Any] = {"notify_url": url}
    if events is not None:
        fields["notify_on"] = events
    return fields, warnings
