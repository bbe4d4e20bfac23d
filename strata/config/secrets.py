"""Secrets are never shown: one rule for what is a credential, one redaction for all text.

The resolved configuration is pickled to every Spark task and shows up in logs,
tracebacks and error messages, so one rule decides what is a credential
(`is_secret_key`: a key naming a password, secret, token, key or credential, at any
depth; and the password of any `scheme://user:password@` URL), and everything that
shows text goes through one redaction (`redact`):

- the configuration models' reprs and `ConfigError` texts (`strata.config`);
- the command line's output and JSON, an Airflow task's log and XCom;
- every log record of a `strata` logger (`strata.log.get_logger` installs
  `RedactingFilter` on it, so whatever handler a host attaches sees it redacted).

The secrets `redact` removes are those of every configuration this process loaded
(`remember_secrets`) and those of its environment: a variable whose name is a secret
key (`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `KAFKA_PASSWORD`) holds one, even
when it reaches a client library without passing through the configuration. A secret
of `MIN_SCRUBBED` characters or more is removed wherever it stands; a shorter one
only where it stands as the value of a secret key (`password=abc`, `"token": "abc"`),
since searching free text for it would blank out ordinary words and numbers.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar, cast

_Json = TypeVar("_Json")

REDACTED = "***"
# Words of a key (split at `.`, `_`, `-` and case changes, lower-cased) that make its
# value a credential: sasl.password, ssl.key.password, ssl.keystore.password,
# sasl.oauthbearer.client.secret, AWS_SECRET_ACCESS_KEY, AWS_ACCESS_KEY_ID,
# AWS_SESSION_TOKEN, spark.hadoop.fs.s3a.secret.key, GOOGLE_APPLICATION_CREDENTIALS,
# sasl.jaas.config. Whole words, so `keystrokes` or `ssl.keystore.type` are not.
_SECRET_WORDS = frozenset(
    {"password", "passwd", "secret", "token", "key", "credential", "credentials", "jaas"}
)
# Keys that name no secret word but carry one inside.
_SECRET_KEYS = frozenset({"sasl.oauthbearer.config"})
# A last word that says the value describes a credential rather than holds it.
_NOT_A_VALUE = frozenset({"type", "location", "provider", "class", "mechanism"})
_KEY_WORDS = re.compile(r"[._\-\s]+|(?<=[a-z0-9])(?=[A-Z])")
# Sections whose keys are data (column names), not settings.
_DATA_SECTIONS = frozenset({"quality"})
# The password of a URL (thrift://user:password@host), whatever key holds the URL.
_URL_PASSWORD = re.compile(
    r"(?P<user>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)(?P<password>[^\s/@]+)@"
)
# Secrets at least this long are removed from any text; shorter ones only where they
# stand as a secret key's value (`_KEY_VALUE`).
MIN_SCRUBBED = 6
# `key=value`, `key: value`, `"key": "value"`: a value as it stands after its key.
_KEY_VALUE = re.compile(
    r"(?P<key>[A-Za-z_][A-Za-z0-9_.\-]*)(?P<sep>[\"']?\s*[=:]\s*[\"']?)(?P<value>[^\s\"',;&)}\]]+)"
)

# Every secret value of the configurations this process has loaded.
_loaded_secrets: set[str] = set()


@functools.lru_cache(maxsize=4096)
def is_secret_key(key: object) -> bool:
    """Whether a configuration key (at any depth) or an environment variable holds a credential.

    Args:
        key: A key of the configuration (a model field, a Kafka property, a storage
            option, a Spark property), or an environment variable's name.

    Returns:
        True if its value must never be shown.
    """
    if not isinstance(key, str):
        return False
    if key.lower() in _SECRET_KEYS:
        return True
    words = [w.lower() for w in _KEY_WORDS.split(key) if w]
    if not words or words[-1] in _NOT_A_VALUE:
        return False
    return any(w in _SECRET_WORDS for w in words)


def secrets_in(value: Any, secret: bool = False) -> Iterator[str]:  # noqa: ANN401 - YAML
    """The credentials inside parsed YAML or a model dump: values of secret keys, URL passwords.

    Args:
        value: A mapping, list or scalar.
        secret: Whether `value` sits under a secret key.

    Yields:
        Each credential, as text.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            if key in _DATA_SECTIONS and not secret:
                continue
            yield from secrets_in(item, secret or is_secret_key(key))
    elif isinstance(value, list):
        for item in value:
            yield from secrets_in(item, secret)
    elif secret and value is not None and not isinstance(value, bool):
        yield str(value)
    elif isinstance(value, str):
        yield from (m.group("password") for m in _URL_PASSWORD.finditer(value))


def remember_secrets(data: Any) -> None:  # noqa: ANN401 - parsed YAML or a model dump
    """Record the credentials in configuration data, so `redact` removes them from any text.

    Args:
        data: Parsed (and environment-expanded) YAML, or a model dump.
    """
    _loaded_secrets.update(s for s in secrets_in(data) if s)


def _environment_secrets() -> set[str]:
    """The values of this process's environment variables whose names are secret keys.

    Read on every redaction: a variable set after start-up (by a test, by Airflow for a
    task) counts as soon as it is set.
    """
    return {value for name, value in os.environ.items() if value and is_secret_key(name)}


def _known_secrets() -> tuple[list[str], frozenset[str]]:
    """Every secret to remove: (the long ones, longest first; the short ones)."""
    every = _loaded_secrets | _environment_secrets()
    long = sorted((s for s in every if len(s) >= MIN_SCRUBBED), key=len, reverse=True)
    return long, frozenset(s for s in every if len(s) < MIN_SCRUBBED)


def redact(text: str) -> str:
    """Text with every credential replaced by `***`, ready to print or log.

    Removes the password of any `scheme://user:password@` URL, and every secret this
    process knows (see the module docstring), wherever it appears: in a message of
    ours or of a client library.

    Args:
        text: Any text bound for a terminal, a log, an exception or a JSON summary.

    Returns:
        The text without credentials.
    """
    return _redact_known(text, *_known_secrets())


def _redact_known(text: str, long: list[str], short: frozenset[str]) -> str:
    """`redact` with the secrets to remove already gathered (`_known_secrets`)."""
    text = _URL_PASSWORD.sub(rf"\g<user>{REDACTED}@", text)
    # Longest first, so a secret that contains another is removed whole.
    for secret in long:
        text = text.replace(secret, REDACTED)
    if short:
        text = _scrub_values(text, short)
    return text


def _scrub_values(text: str, secrets: Iterable[str]) -> str:
    """Short secrets removed where they stand as the value of a secret key."""
    wanted = frozenset(secrets)

    def hide(match: re.Match[str]) -> str:
        if match.group("value") in wanted and is_secret_key(match.group("key")):
            return f"{match.group('key')}{match.group('sep')}{REDACTED}"
        return match.group(0)

    return _KEY_VALUE.sub(hide, text)


def redact_json(value: _Json) -> _Json:
    """A JSON-ready body with `redact` applied to every string in it.

    For what leaves the process as data (`--json` output, an Airflow task's XCom);
    before serialising, since JSON escapes a secret's quotes or backslashes and the
    escaped form would no longer match. The secrets are gathered once per body, not
    once per string: a summary of thousands of partitions holds tens of thousands.
    """
    long, short = _known_secrets()

    def walk(item: _Json) -> _Json:
        if isinstance(item, str):
            return cast("_Json", _redact_known(item, long, short))
        if isinstance(item, dict):
            return cast("_Json", {k: walk(v) for k, v in item.items()})
        if isinstance(item, list | tuple):
            return cast("_Json", [walk(v) for v in item])
        return item

    return walk(value)


def masked(key: object, value: Any) -> Any:  # noqa: ANN401 - any field's value
    """A field's value as reprs show it: credentials replaced by `***`, nested maps too."""
    if value is None:
        return None
    if is_secret_key(key):
        return REDACTED
    if isinstance(value, dict):
        return {k: masked(k, v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(key, v) for v in value]
    if isinstance(value, str):
        return redact(value)
    return value


class RedactingFilter(logging.Filter):
    """Redacts a log record's message and traceback before any handler formats it.

    Installed on each `strata` logger (`strata.log.get_logger`): a logger's filters run
    before the record reaches any handler, the host's (Airflow's, a notebook's) included.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace the record's message (and traceback text) by its redacted form.

        Args:
            record: The record being logged.

        Returns:
            True: the record is always let through.
        """
        message = record.getMessage()
        shown = redact(message)
        if shown != message:
            record.msg, record.args = shown, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True
