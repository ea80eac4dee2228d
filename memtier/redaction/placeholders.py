"""The secret kinds, their placeholders, and control-character normalisation.

Owns the vocabulary every other redaction module speaks: :class:`SecretKind` (stable names,
in the order they are reported), the placeholder text ``[REDACTED:<kind>]`` and how to
recognise one, the fail-closed :data:`FALLBACK_TEXT`, and :func:`normalize_controls` (the
first step of every redaction: a NUL inside a token would otherwise hide it from the
patterns).  Nothing here knows any secret format.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Final

__all__ = [
    "ASCII_CONTROLS",
    "CONTROL_RE",
    "FALLBACK_TEXT",
    "KIND_ORDER",
    "SecretKind",
    "is_placeholder",
    "normalize_controls",
    "placeholder",
    "sorted_kinds",
]


class SecretKind(StrEnum):
    """Stable names of the secret patterns; the placeholder is ``[REDACTED:<value>]``.

    Kinds are reported in declaration order (roughly the order the detectors run in).
    Values are stable: they appear in stored text, metrics labels and the README.
    """

    PRIVATE_KEY = "private_key"
    URL_CREDENTIALS = "url_credentials"
    CAPABILITY_URL = "capability_url"
    SLACK_WEBHOOK = "slack_webhook"
    DISCORD_WEBHOOK = "discord_webhook"
    TEAMS_WEBHOOK = "teams_webhook"
    AUTHORIZATION_HEADER = "authorization_header"
    BEARER_TOKEN = "bearer_token"
    BASIC_AUTH = "basic_auth"
    JWT = "jwt"
    AWS_ACCESS_KEY = "aws_access_key"
    AWS_SECRET_KEY = "aws_secret_key"
    GITHUB_TOKEN = "github_token"
    GITLAB_TOKEN = "gitlab_token"
    SLACK_TOKEN = "slack_token"
    STRIPE_KEY = "stripe_key"
    ANTHROPIC_KEY = "anthropic_key"
    OPENAI_KEY = "openai_key"
    GOOGLE_API_KEY = "google_api_key"
    GOOGLE_OAUTH = "google_oauth"
    NPM_TOKEN = "npm_token"
    PYPI_TOKEN = "pypi_token"
    HUGGINGFACE_TOKEN = "huggingface_token"
    TWILIO_API_KEY = "twilio_api_key"
    SENDGRID_KEY = "sendgrid_key"
    TELEGRAM_BOT_TOKEN = "telegram_bot_token"
    DISCORD_BOT_TOKEN = "discord_bot_token"
    SHOPIFY_TOKEN = "shopify_token"
    DIGITALOCEAN_TOKEN = "digitalocean_token"
    DATABRICKS_TOKEN = "databricks_token"
    AGE_SECRET_KEY = "age_secret_key"
    SECRET_ASSIGNMENT = "secret_assignment"


KIND_ORDER: Final = {kind: i for i, kind in enumerate(SecretKind)}

# What sanitize stores when redaction does not converge within its rounds: fail closed.
FALLBACK_TEXT: Final = "[REDACTED]"


def placeholder(kind: SecretKind) -> str:
    """The stable replacement text for one secret: ``[REDACTED:<kind>]``."""
    return f"[REDACTED:{kind.value}]"


_PLACEHOLDER_RE: Final = re.compile(r"\[REDACTED(?::[a-z_]{1,40})?\]")


def is_placeholder(value: str) -> bool:
    """True for a value that is already a placeholder (or :data:`FALLBACK_TEXT`): left alone."""
    return _PLACEHOLDER_RE.fullmatch(value.strip()) is not None


def sorted_kinds(kinds: Sequence[SecretKind] | Mapping[SecretKind, int]) -> tuple[SecretKind, ...]:
    """The distinct kinds, in :class:`SecretKind` declaration order."""
    return tuple(sorted(set(kinds), key=KIND_ORDER.__getitem__))


# --- control characters ------------------------------------------------------------------------

# What normalize_controls removes (also matched inline by the flush's page check).
CONTROL_RE: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


ASCII_CONTROLS: Final = bytes(c for c in range(0x80) if CONTROL_RE.match(chr(c)))


def normalize_controls(text: str) -> str:
    """Remove C0 controls except TAB/LF/CR, DEL, and C1 controls (U+0080..U+009F)."""
    if text.isascii():  # fast path: bytes.translate is a plain C loop
        data = text.encode("ascii")
        kept = data.translate(None, ASCII_CONTROLS)
        return text if len(kept) == len(data) else kept.decode("ascii")
    return CONTROL_RE.sub("", text)
