"""The rules a configuration value is checked by when it loads, each in one place.

Names (of pipelines, tables, databases, catalogs), topic names and patterns,
durations, time zones, starting points, and service URLs with their credentials: a
rule a section's validator and the loader both need lives here, so that a value is
refused everywhere for the same reason, in the same words.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator

from strata.durations import parse_duration_ms

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
NAME_RULE = "use 1 to 63 lower-case letters, digits and '_', starting with a letter"
"""What a name of a pipeline, table, database or catalog may hold, in words."""


def is_name(value: str) -> bool:
    """Whether a value may name a pipeline, a table, a database or a catalog."""
    return bool(_NAME.match(value))


def valid_name(value: str, what: str) -> str:
    """A name of a pipeline, a table, a database or a catalog, checked.

    Args:
        value: The name.
        what: What it names, for the message (`pipeline`, `table`, ...).

    Returns:
        The name.

    Raises:
        ValueError: Saying what a name may hold.
    """
    if not is_name(value):
        raise ValueError(f"{value!r} is not a valid {what} name; {NAME_RULE}")
    return value


def valid_topic(value: str) -> str:
    """A Kafka topic name, checked.

    Raises:
        ValueError: Saying what a topic name may hold.
    """
    if not _TOPIC.match(value) or value in (".", ".."):
        raise ValueError(
            f"{value!r} is not a Kafka topic name; use letters, digits, '.', '_' and '-'"
        )
    return value


def _valid_duration(value: str) -> str:
    parse_duration_ms(value)
    return value


# A duration written with its unit ("90s", "1h", "7d"), checked when the config loads.
Duration = Annotated[str, AfterValidator(_valid_duration)]


def _valid_zone(value: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {value!r}; use an IANA name such as 'UTC'") from exc
    return value


# An IANA time zone name ("UTC", "Europe/Berlin"), checked when the config loads.
Zone = Annotated[str, AfterValidator(_valid_zone)]


def service_url(value: str, service: str, credentials: str, example: str, path: bool = True) -> str:
    """An http(s) URL of a service the configuration names, checked when it loads.

    The value is never quoted back: a URL can carry a secret in many places (a user
    and password, a bare token before `@`, a query string), and the error goes to the
    terminal and into Airflow's import errors.

    Args:
        value: The URL.
        service: The service, as the error names it.
        credentials: The keys where credentials go instead.
        example: URLs the error suggests.
        path: Whether a path may follow the port.

    Returns:
        The URL without a trailing slash.

    Raises:
        ValueError: If it holds credentials, or is not `http(s)://host[:port]`.
    """
    if re.match(r"^https?://[^\s/]*@", value):
        raise ValueError(
            f"the {service} url holds credentials (before '@'); put them in {credentials} "
            "instead, so that they are never printed"
        )
    tail = r"(/[^\s?#@]*)?$" if path else r"/?$"
    if not re.match(r"^https?://[A-Za-z0-9.-]+(:\d+)?" + tail, value):
        raise ValueError(
            f"the {service} url is not http(s)://host[:port]{'[/path]' if path else ''} "
            f"(with no query string); write {example}"
        )
    return value.rstrip("/")


def basic_auth(section: str, username: str | None, password: str | None) -> None:
    """Basic auth takes a user and a password, or neither.

    Raises:
        ValueError: Naming the key that is set and the one missing.
    """
    if (username is None) != (password is None):
        given, missing = ("username", "password") if password is None else ("password", "username")
        raise ValueError(
            f"{section}.{given} is set without {section}.{missing}; basic auth needs both "
            "(or remove both)"
        )


def loopback(url: str) -> bool:
    """Whether a URL's host is this machine (127.0.0.0/8, ::1, `localhost`)."""
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def credentials_over_http(
    section: str, key: str, url: str | None, signed: bool, allow_loopback: bool
) -> None:
    """Credentials cross the network only encrypted: over https, or to this machine if allowed.

    Raises:
        ValueError: Naming the keys and both ways out.
    """
    if not signed or url is None or not url.startswith("http:"):
        return
    if allow_loopback and loopback(url):
        return
    local = (
        f"{section}.allow_http_on_loopback applies only to a {key} on this machine "
        "(127.0.0.1, ::1 or localhost)"
        if allow_loopback
        else f"for a {key} on this machine (127.0.0.1, ::1 or localhost) set "
        f"{section}.allow_http_on_loopback: true"
    )
    raise ValueError(
        f"{section}.username and {section}.password would cross the network readable over a "
        f"plain http:// {key}; use https://, or {local}"
    )


def pem_file(value: str | None, whose: str) -> str | None:
    """A `ca_file` setting: the PEM file of a service's certificate authority, if set.

    Raises:
        ValueError: If it names no file.
    """
    if value is not None and not Path(value).is_file():
        raise ValueError(
            f"{value!r} is not a file; point ca_file at the PEM file of {whose} certificate "
            "authority, or remove it"
        )
    return value


@functools.lru_cache(maxsize=64)
def topic_pattern(pattern: str) -> Any:  # noqa: ANN401 - re2 ships no type hints
    """A `topics_pattern` compiled for matching in time linear in the topic's name.

    Every topic name on the cluster is matched on every plan, and topic names are
    chosen by whoever may create topics: Python's backtracking `re` can take minutes
    on one name against a careless pattern (`(a+)+$`). RE2 never backtracks; it has
    no lookaround and no backreferences, which a pattern over topic names never needs.

    Args:
        pattern: The regular expression, matched against whole topic names.

    Returns:
        The compiled pattern (`fullmatch`, `search`).

    Raises:
        ValueError: Naming the construct RE2 refused, and what to write instead.
    """
    import re2

    options = re2.Options()
    # RE2 would also print the refusal to stderr itself; the error below says it.
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        why = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        raise ValueError(
            f"{pattern!r} cannot be matched in linear time ({why}). Topics are matched with "
            "RE2, which has no lookaround ((?=, (?!, (?<=, (?<!), no backreferences (\\1) and "
            "no possessive or atomic groups; rewrite it without them, e.g. 'clicks\\..*'"
        ) from None


def starting_point(value: object) -> tuple[str, int | None]:
    """A `starting_offsets` value as written canonically, and its moment in epoch ms.

    Args:
        value: `earliest`, `latest`, an ISO-8601 moment with its UTC offset (YAML may
            hand it over as a datetime), or epoch milliseconds.

    Returns:
        The canonical text (`earliest`, `latest`, or the moment in UTC, ISO-8601), and
        the moment in epoch milliseconds (None for `earliest` and `latest`).

    Raises:
        ValueError: Saying what is accepted.
    """
    from datetime import UTC, datetime

    if value in ("earliest", "latest"):
        return str(value), None
    moment: datetime | None = None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, int) and not isinstance(value, bool):
        moment = datetime.fromtimestamp(value / 1000, tz=UTC)
    elif isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?\d+", text):
            moment = datetime.fromtimestamp(int(text) / 1000, tz=UTC)
        else:
            try:
                moment = datetime.fromisoformat(text.replace("z", "Z"))
            except ValueError:
                moment = None
    if moment is None:
        raise ValueError(
            f"{value!r} is not a starting point; write earliest, latest, an ISO-8601 moment "
            "with its offset (2026-01-31T00:00:00Z) or epoch milliseconds"
        )
    if moment.tzinfo is None:
        raise ValueError(
            f"{value!r} has no UTC offset, so the moment it names depends on a time zone; "
            "add one (2026-01-31T00:00:00Z or +01:00)"
        )
    ms = int(moment.timestamp() * 1000)
    if ms < 0:
        raise ValueError(f"{value!r} is before 1970-01-01, where no Kafka timestamp lies")
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds"), ms
