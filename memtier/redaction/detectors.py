"""The detectors: each pattern of the table paired with how its match is replaced, in order.

Owns :class:`Detector` (a compiled pattern, its replacement rule and its pre-filters), the
replacement rules that need more than "replace the whole match" (URLs keep scheme and host,
``Authorization`` keeps its scheme word, Basic must decode to ``user:password``, Telegram
keeps the public bot id), and :data:`DETECTORS`, the order they run in.  The patterns
themselves are data in :mod:`memtier.redaction.patterns`; running the list is
:func:`memtier.redaction.core.redact_once`, skipping what :mod:`memtier.redaction.prefilter`
rules out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from memtier.redaction.patterns import (
    AUTH_HEADER_RES,
    AUTH_SCHEME_WORDS,
    BASIC_RES,
    BEARER_RES,
    CAP_PARAM_RE,
    CAP_PATH_RE,
    DISCORD_HOOK_RE,
    JWT_RE,
    PEM_RE,
    SLACK_HOOK_RE,
    TEAMS_HOOK_RE,
    TELEGRAM_ID_RE,
    TELEGRAM_RE,
    TOKEN_SPECS,
    TRAILING_PUNCT,
    URL_RE,
    TokenSpec,
)
from memtier.redaction.placeholders import SecretKind, is_placeholder, placeholder
from memtier.redaction.shapes import basic_credentials, tokenish

__all__ = ["DETECTORS", "Detector", "Replace"]

# (replacement text for the whole match, kinds found) or None to leave the match as it is.
Replace = Callable[[re.Match[str]], "tuple[str, tuple[SecretKind, ...]] | None"]


@dataclass(frozen=True, slots=True)
class Detector:
    """One pattern, its replacement rule, and its pre-filters.

    The pre-filters are each a NECESSARY condition for a match, so skipping a detector whose
    filter fails changes nothing (the contract and the check: :mod:`memtier.redaction.prefilter`).
    """

    pattern: re.Pattern[str]
    replace: Replace
    # hints: lower-case literals, one of which occurs in the lower-cased text
    # (case-insensitive patterns).
    hints: tuple[str, ...] = ()
    # chars: characters that ALL occur in every match, checked first: a one-character
    # search is a memchr (~0.1 us for 4 KiB), a longer literal a skip search (~2.5 us).
    chars: str = ""
    # needles: literals, one of which occurs in the text as it is (case-sensitive patterns).
    needles: tuple[str, ...] = ()
    # gate: a regex that must find something in the text (a structure no literal captures).
    gate: re.Pattern[str] | None = None


def _splice(m: re.Match[str], group: str | int, new: str) -> str:
    """The whole match with one group's span replaced by ``new``."""
    start, end = m.span(group)
    base = m.start()
    whole = m.group(0)
    return whole[: start - base] + new + whole[end - base :]


def _whole(kind: SecretKind, valid: Callable[[str], bool] | None = None) -> Replace:
    def replace(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
        if valid is not None and not valid(m.group(0)):
            return None
        return placeholder(kind), (kind,)

    return replace


def _value(kind: SecretKind, group: str = "v") -> Replace:
    def replace(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
        return _splice(m, group, placeholder(kind)), (kind,)

    return replace


# --- URLs --------------------------------------------------------------------------------------


def _split_trailing(rest: str) -> tuple[str, str]:
    """Sentence punctuation after a URL is not part of it ("see https://x/?t=1.")."""
    end = len(rest)
    while end > 0:
        c = rest[end - 1]
        if c in TRAILING_PUNCT or (c == ")" and rest.count("(", 0, end) < rest.count(")", 0, end)):
            end -= 1
        else:
            break
    return rest[:end], rest[end:]


def _capability_params(rest: str) -> bool:
    for sep in ("?", "#"):
        idx = rest.find(sep)
        if idx < 0:
            continue
        tail = rest[idx + 1 :]
        for param in re.split(r"[&;?#]", tail, maxsplit=256):
            name, eq, value = param.partition("=")
            if eq and value and not is_placeholder(value) and CAP_PARAM_RE.fullmatch(name):
                return True
    return False


def _url_kind(host: str, rest: str) -> SecretKind | None:
    host = host.lower().rsplit(":", 1)[0] if not host.startswith("[") else host.lower()
    if host == "hooks.slack.com" and SLACK_HOOK_RE.match(rest):
        return SecretKind.SLACK_WEBHOOK
    if (host.endswith(("discord.com", "discordapp.com"))) and DISCORD_HOOK_RE.match(rest):
        return SecretKind.DISCORD_WEBHOOK
    if (host.endswith(".webhook.office.com") or host == "outlook.office.com") and (
        TEAMS_HOOK_RE.match(rest)
    ):
        return SecretKind.TEAMS_WEBHOOK
    if CAP_PATH_RE.search(rest) or _capability_params(rest):
        return SecretKind.CAPABILITY_URL
    return None


def _replace_url(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
    authority = m.group("authority")
    rest, trailing = _split_trailing(m.group("rest") or "")
    userinfo, at, host = authority.rpartition("@")
    kinds: list[SecretKind] = []
    # user:password, or a token used as the user name (https://ghp_...@github.com);
    # a bare user name (ssh://git@host) is not a credential.
    if (
        at
        and userinfo
        and not is_placeholder(userinfo)
        and (":" in userinfo or tokenish(userinfo, 16))
    ):
        userinfo = placeholder(SecretKind.URL_CREDENTIALS)
        kinds.append(SecretKind.URL_CREDENTIALS)
    url_kind = _url_kind(host, rest)
    if url_kind is not None:
        rest = "/" + placeholder(url_kind)
        kinds.append(url_kind)
    if not kinds:
        return None
    new_authority = f"{userinfo}@{host}" if at else host
    return f"://{new_authority}{rest}{trailing}", tuple(kinds)


# --- authorization values ----------------------------------------------------------------------


def _replace_auth_header(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
    if m.group("pscheme"):
        if is_placeholder(m.group("params")):
            return None
        kind = SecretKind.AUTHORIZATION_HEADER
        return _splice(m, "params", placeholder(kind)), (kind,)
    tok = m.group("tok")
    scheme = (m.group("scheme") or "").lower()
    if is_placeholder(tok):
        return None
    if not scheme and (tok.lower() in AUTH_SCHEME_WORDS or not tokenish(tok)):
        return None  # "Authorization: Bearer" with no value, or prose
    if scheme == "bearer":
        kind = SecretKind.BEARER_TOKEN
    elif scheme == "basic":
        kind = SecretKind.BASIC_AUTH
    else:
        kind = SecretKind.AUTHORIZATION_HEADER
    return _splice(m, "tok", placeholder(kind)), (kind,)


def _replace_bearer(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
    token = m.group("v").rstrip(".")
    if not tokenish(token):
        return None  # "bearer bonds", "the bearer instrument"
    kind = SecretKind.BEARER_TOKEN
    start = m.start("v") - m.start()
    return m.group(0)[:start] + placeholder(kind) + m.group("v")[len(token) :], (kind,)


def _replace_basic(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
    if not basic_credentials(m.group("v")):
        return None  # "basic training": not base64 of user:password
    return _value(SecretKind.BASIC_AUTH)(m)


# --- Telegram -----------------------------------------------------------------------------------


def _replace_telegram(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
    start = m.start()
    if not TELEGRAM_ID_RE.search(m.string, max(0, start - 16), start):
        return None
    return ":" + placeholder(SecretKind.TELEGRAM_BOT_TOKEN), (SecretKind.TELEGRAM_BOT_TOKEN,)


# --- the detector list -------------------------------------------------------------------------


def _token_detector(spec: TokenSpec) -> Detector:
    return Detector(
        re.compile(spec.regex),
        _whole(spec.kind, spec.valid),
        chars=spec.chars,
        needles=spec.needles,
        gate=spec.gate,
    )


# Order matters: whole structures (key blocks, URLs, headers) before the tokens inside
# them, specific vendor formats before the generic name=value rule.
DETECTORS: Final = (
    Detector(PEM_RE, _whole(SecretKind.PRIVATE_KEY), chars="-", needles=("-----BEGIN ",)),
    Detector(URL_RE, _replace_url, chars=":", needles=("://",)),
    *(Detector(r, _replace_auth_header, ("authorization",)) for r in AUTH_HEADER_RES),
    *(Detector(r, _replace_bearer, ("bearer",)) for r in BEARER_RES),
    *(Detector(r, _replace_basic, ("basic",)) for r in BASIC_RES),
    Detector(JWT_RE, _whole(SecretKind.JWT), chars="J", needles=("eyJ",)),
    *(_token_detector(spec) for spec in TOKEN_SPECS),
    Detector(TELEGRAM_RE, _replace_telegram, chars=":", needles=(":AA",)),
)
