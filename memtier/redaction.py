"""Redaction and bounding of untrusted text: pure, I/O-free, run on every append.

Text reaches Redis, logs and snapshot files only after :func:`sanitize` (or
:func:`redact` followed by :func:`bound_utf8`) ran in the caller's process.

Order: **redact first, then bound.**  Cutting first could split a secret so
that the remaining half no longer matches its pattern (``ghp_`` + 20 of its 36
characters) and would be stored in clear.  The opposite hazard -- a cut that
turns a harmless over-long run into something that now matches (``AKIA`` + 17
characters cut to ``AKIA`` + 16) -- is closed by :func:`sanitize`, which
re-checks the bounded text and redacts again (at most
:data:`MAX_SANITIZE_ROUNDS` rounds, then it returns :data:`FALLBACK_TEXT`).

Guarantees (property-tested in ``tests/test_redaction.py``):

* deterministic, and idempotent: ``redact(redact(x).text) == redact(x)``'s text;
* placeholders (``[REDACTED:<kind>]``) never match any pattern, so
  ``contains_secret(redact(x).text)`` is ``False``;
* linear time, and fast (about 1 ms for 16 KiB of chat or JSON): every regex
  starts with a literal character, so the engine skips straight to candidates
  (one pattern per case where needed: ``Bearer``/``bearer``); a match can start
  only at the beginning of a token run; every quantifier is bounded or
  possessive (``*+``, ``{m,n}+``: nothing backtracks into it), and the values
  that get replaced (URL parts, key bodies, header and assignment values) are
  possessive runs consumed whole, so a second pass finds nothing left.  The
  ``name=value`` rule finds ``:``/``=`` with ``str.find`` and matches the
  name backwards from there.

Control characters: :func:`redact` removes C0 controls except TAB, LF and CR,
DEL and C1 controls (U+0080..U+009F).  They have no place in chat text, and a
NUL inside a token (``gh\\x00p_...``) would otherwise hide it from the
patterns.  Text that cannot be encoded as UTF-8 (a lone surrogate) is refused
by :func:`bound_utf8` and :func:`sanitize` with a
:class:`~memtier.errors.ValidationError` (code ``invalid_input``).

Every pattern, with an example, is listed in README.md (section *Redaction and text bounding*).
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, NamedTuple

from memtier.errors import ValidationError

__all__ = [
    "FALLBACK_TEXT",
    "MAX_SANITIZE_ROUNDS",
    "RedactionResult",
    "SanitizedText",
    "SecretKind",
    "bound_utf8",
    "contains_secret",
    "json_contains_secret",
    "normalize_controls",
    "placeholder",
    "redact",
    "redact_json",
    "redact_text",
    "sanitize",
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


_KIND_ORDER: Final = {kind: i for i, kind in enumerate(SecretKind)}

# A secret that the bounded text re-exposes is redacted again; after this many rounds
# (never reached by real text: each round needs a new cut-created match) sanitize gives up
# on the content and stores FALLBACK_TEXT instead -- fail closed.
MAX_SANITIZE_ROUNDS: Final = 4
FALLBACK_TEXT: Final = "[REDACTED]"

# Grapheme heuristics of bound_utf8 look back at most this many code points; past that
# (e.g. "zalgo" text with hundreds of combining marks) the cut is only a UTF-8 boundary.
_MAX_CLUSTER_BACKOFF: Final = 32
# bound JSON nesting in redact_json (threads events and exports are shallow).
_MAX_JSON_DEPTH: Final = 64


def placeholder(kind: SecretKind) -> str:
    """The stable replacement text for one secret: ``[REDACTED:<kind>]``."""
    return f"[REDACTED:{kind.value}]"


_PLACEHOLDER_RE: Final = re.compile(r"\[REDACTED(?::[a-z_]{1,40})?\]")


def _is_placeholder(value: str) -> bool:
    return _PLACEHOLDER_RE.fullmatch(value.strip()) is not None


# --- control characters ------------------------------------------------------------------------

_CONTROL_RE: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


_ASCII_CONTROLS: Final = bytes(c for c in range(0x80) if _CONTROL_RE.match(chr(c)))


def normalize_controls(text: str) -> str:
    """Remove C0 controls except TAB/LF/CR, DEL, and C1 controls (U+0080..U+009F)."""
    if text.isascii():  # fast path: bytes.translate is a plain C loop
        data = text.encode("ascii")
        kept = data.translate(None, _ASCII_CONTROLS)
        return text if len(kept) == len(data) else kept.decode("ascii")
    return _CONTROL_RE.sub("", text)


# --- detector engine ---------------------------------------------------------------------------

# (replacement text for the whole match, kinds found) or None to leave the match as it is.
_Replace = Callable[[re.Match[str]], "tuple[str, tuple[SecretKind, ...]] | None"]


@dataclass(frozen=True, slots=True)
class _Detector:
    pattern: re.Pattern[str]
    replace: _Replace
    # Pre-filters, each a NECESSARY condition for a match (a detector whose filter fails
    # cannot match, so skipping it changes nothing); empty = always run.  They are checked on
    # the current text before every run, so a replacement made by an earlier detector is
    # seen.  The patterns start with one literal character followed by a lookbehind, so the
    # regex engine stops at every occurrence of that (often common) character; a substring
    # search for a longer literal is 3-10x cheaper than running the pattern.
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


def _whole(kind: SecretKind, valid: Callable[[str], bool] | None = None) -> _Replace:
    def replace(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
        if valid is not None and not valid(m.group(0)):
            return None
        return placeholder(kind), (kind,)

    return replace


def _value(kind: SecretKind, group: str = "v") -> _Replace:
    def replace(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
        return _splice(m, group, placeholder(kind)), (kind,)

    return replace


def _has_digit(value: str) -> bool:
    return any(c.isdigit() for c in value)


def _tokenish(value: str, min_len: int = 8) -> bool:
    """A credential-looking word: long enough, and either containing a digit or very long.

    Keeps prose ("Bearer instrument", "Authorization: required") out of the placeholders.
    """
    return len(value) >= min_len and (_has_digit(value) or len(value) >= 20)


_TOKEN_CHARS: Final = r"A-Za-z0-9_\-"


def _start(first: str, boundary: str = _TOKEN_CHARS) -> str:
    """Regex for ``first`` (one character or a one-character class) beginning a token run.

    The pattern starts with ``first`` itself, so the regex engine skips straight to candidate
    positions (a leading lookbehind would make it try every position: ~25x slower); the
    boundary is a fixed-width lookbehind right after it: the character before ``first`` is
    not a token character.  So a match starts only at the beginning of a run, once per run.
    """
    return f"{first}(?<![{boundary}]{first})"


# --- private keys ------------------------------------------------------------------------------

_PEM_LABEL: Final = r"(?:[A-Z0-9]{1,24}[ ]){0,3}PRIVATE[ ]KEY(?:[ ]BLOCK)?"
# A line break in a key: a real one, or JSON/string-escaped (a service-account file).
_PEM_BREAK: Final = r"(?:\r?\n|\\r\\n|\\n)"
# What may start a line of a pasted key besides indentation: Markdown/e-mail quote markers
# and comment markers ("> MIIE...", "# MIIE...", "// MIIE...").
_PEM_INDENT: Final = r"[ \t]{0,16}+(?:(?:>|\#|//)[ \t]{0,4}+){0,8}+"
# A run of base64 key material.  A short one (under 16 characters) must end where a word
# ends (at a space, a line break, a quote or bracket, an escape, sentence punctuation, or the
# end): "https" in "https://" is not key material, and swallowing it would hide the URL from
# its detector.  A run after the first must look like key material (a digit or + / =, or 16+
# characters), so the prose after a truncated key ("The webhook is ...") is not swallowed.
_PEM_RUN: Final = (
    r"(?:[A-Za-z0-9+/=]{16}[A-Za-z0-9+/=]*+"
    r"|[A-Za-z0-9+/=]{1,15}+(?=[\s\\\"'`,;)\]}>|*]|[.!?:](?:\s|\Z)|\Z))"
)
_PEM_MORE: Final = rf"(?=[A-Za-z]*+[0-9+/=]|[A-Za-z0-9+/=]{{16}}){_PEM_RUN}"
# Armor headers right after the BEGIN line (Proc-Type: 4,ENCRYPTED; PGP's Version: ...), and
# the one blank line that PGP armor puts after them.
_PEM_HEADERS: Final = (
    rf"(?:{_PEM_BREAK}{_PEM_INDENT}[A-Za-z][A-Za-z0-9\-]{{0,40}}+:[ \t][^\r\n\\]{{0,256}}+)*+"
    rf"(?:[ \t]{{0,16}}+{_PEM_BREAK}{_PEM_INDENT}(?={_PEM_BREAK}))?"
)
# Two forms.  With an END line, the body is everything a key block holds up to it: base64,
# whitespace (blank lines too), escaped newlines, armor headers, quote and comment markers; a
# dash only when it does not start the END line.  Without one (a truncated paste), the body
# is base64 runs separated by line breaks or spaces (keys pasted on one line), and ends at
# the first character that cannot be key material or at a blank line, so every later
# detector still sees the rest of the text (fail closed for the key, and nothing more).
_PEM_RE: Final = re.compile(
    rf"-----BEGIN[ ]{_PEM_LABEL}-----"
    r"(?:(?:[A-Za-z0-9+/=\s\\:,.>\#]|-(?!----))*+"
    rf"-----END[ ]{_PEM_LABEL}-----"
    rf"|{_PEM_HEADERS}"
    rf"(?:(?:[ \t]{{0,16}}+{_PEM_BREAK})?{_PEM_INDENT}{_PEM_RUN})?"
    rf"(?:(?:[ \t]{{0,16}}+{_PEM_BREAK}{_PEM_INDENT}|[ \t]{{1,16}}+){_PEM_MORE})*+)"
)

# --- URLs --------------------------------------------------------------------------------------

# Anchored on "://" (scheme characters before it); the scheme itself is kept as it is.
_URL_RE: Final = re.compile(
    r":(?<=[A-Za-z0-9+.\-]:)//"
    r"(?P<authority>[^\s/?#<>\"'`\\]*+)"
    r"(?P<rest>[/?#][^\s<>\"'`\\]*+)?"
)
# Second Life / OpenSim capability URLs: http(s)://sim:port/cap/<uuid> and /CAPS/<uuid>0000/.
_CAP_PATH_RE: Final = re.compile(
    r"/(?:caps?|capability|capabilities)/(?:[A-Za-z0-9_\-]{1,32}/){0,2}"
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    re.IGNORECASE,
)
# Query/fragment parameters that make a URL a bearer capability (pre-signed S3/GCS, Azure
# SAS `sig`, OAuth tokens in fragments, `?key=` API keys, `?token=`...).
_CAP_PARAM_RE: Final = re.compile(
    r"x-amz-(?:signature|credential|security-token)|x-goog-(?:signature|credential)"
    r"|googleaccessid|awsaccesskeyid|sig|signature|key|auth|jwt|code_verifier"
    r"|[a-z0-9_.\-]{0,32}(?:token|secret|password|passwd|pwd|api[_\-]?key|apikey"
    r"|access[_\-]?key|secret[_\-]?key|session[_\-]?key)",
    re.IGNORECASE,
)
_SLACK_HOOK_RE: Final = re.compile(r"/(?:services|workflows|triggers)/[^/?#]{4,}")
_DISCORD_HOOK_RE: Final = re.compile(r"/api(?:/v\d{1,2})?/webhooks/\d{5,}/[^/?#]{8,}")
_TEAMS_HOOK_RE: Final = re.compile(r"/webhook(?:b2)?/[^/?#]{8,}", re.IGNORECASE)
_TRAILING_PUNCT: Final = ".,;:!?'"


def _split_trailing(rest: str) -> tuple[str, str]:
    """Sentence punctuation after a URL is not part of it ("see https://x/?t=1.")."""
    end = len(rest)
    while end > 0:
        c = rest[end - 1]
        if c in _TRAILING_PUNCT or (c == ")" and rest.count("(", 0, end) < rest.count(")", 0, end)):
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
            if eq and value and not _is_placeholder(value) and _CAP_PARAM_RE.fullmatch(name):
                return True
    return False


def _url_kind(host: str, rest: str) -> SecretKind | None:
    host = host.lower().rsplit(":", 1)[0] if not host.startswith("[") else host.lower()
    if host == "hooks.slack.com" and _SLACK_HOOK_RE.match(rest):
        return SecretKind.SLACK_WEBHOOK
    if (host.endswith(("discord.com", "discordapp.com"))) and _DISCORD_HOOK_RE.match(rest):
        return SecretKind.DISCORD_WEBHOOK
    if (host.endswith(".webhook.office.com") or host == "outlook.office.com") and (
        _TEAMS_HOOK_RE.match(rest)
    ):
        return SecretKind.TEAMS_WEBHOOK
    if _CAP_PATH_RE.search(rest) or _capability_params(rest):
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
        and not _is_placeholder(userinfo)
        and (":" in userinfo or _tokenish(userinfo, 16))
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

# Header form, including JSON/dict spellings ("Authorization": "Bearer ...").  Parameter-list
# schemes (Digest, AWS4, OAuth 1.0) lose everything up to the closing quote (of the value, or
# of the string the header stands in) or the end of the line.
_AUTH_HEADER_BODY: Final = (
    r"(?i:uthorization)(?:\\{0,3}[\"'])?[ \t]{0,4}[:=][ \t]{0,4}"
    r"(?:\\{0,3}(?P<dq>\")|(?P<sq>'))?"
    r"(?:(?P<pscheme>(?i:digest|aws4-hmac-sha256|oauth|signature|hoba|mutual|scram-sha-\d{1,3}))"
    r"[ \t]{1,8}"
    r"(?P<params>(?(dq)(?:[^\"\\\r\n]|\\.)++|(?(sq)[^'\r\n]++"
    # unquoted, in a string ("Authorization: Digest ..." in JSON or code): to its end
    r"|(?(oq)(?:(?!(?P=oq))[^\\\r\n]|\\.)++|(?(oqx)(?:(?!(?P=oqx))[^\\\r\n]|\\.)++"
    r"|[^\r\n]++)))))"
    r"|(?:(?P<scheme>(?i:bearer|basic|token|negotiate|ntlm|apikey|api-key|key|sso-key|ssws|jwt"
    r"|dpop|googlelogin|bot))[ \t]{1,8})?"
    r"(?P<tok>[^\s\"'<>,;\\]++))"
)
# One pattern per case of the first letter: a literal first character is what makes the
# engine skip fast.  (Proxy-)Authorization: a dash may precede the name.
# The quote, if any, that opens a string the header stands in (oq, or oqx before "Proxy-").
_AUTH_HEADER_RES: Final = tuple(
    re.compile(
        _start(c, "A-Za-z0-9_")
        + rf"(?:(?<=(?P<oq>[\"'])[{c}])|(?<=(?P<oqx>[\"'])(?i:proxy)-[{c}]))?"
        + _AUTH_HEADER_BODY
    )
    for c in "Aa"
)
_AUTH_SCHEME_WORDS: Final = frozenset(
    re.split(
        r"\s+",
        "bearer basic token negotiate ntlm apikey api-key key sso-key ssws jwt dpop googlelogin"
        " bot digest aws4-hmac-sha256 oauth signature hoba mutual",
    )
)


def _replace_auth_header(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
    if m.group("pscheme"):
        if _is_placeholder(m.group("params")):
            return None
        kind = SecretKind.AUTHORIZATION_HEADER
        return _splice(m, "params", placeholder(kind)), (kind,)
    tok = m.group("tok")
    scheme = (m.group("scheme") or "").lower()
    if _is_placeholder(tok):
        return None
    if not scheme and (tok.lower() in _AUTH_SCHEME_WORDS or not _tokenish(tok)):
        return None  # "Authorization: Bearer" with no value, or prose
    if scheme == "bearer":
        kind = SecretKind.BEARER_TOKEN
    elif scheme == "basic":
        kind = SecretKind.BASIC_AUTH
    else:
        kind = SecretKind.AUTHORIZATION_HEADER
    return _splice(m, "tok", placeholder(kind)), (kind,)


_BEARER_RES: Final = tuple(
    re.compile(_start(c) + r"(?i:earer)[ \t]{1,8}(?P<v>[A-Za-z0-9\-._~+/]++=*+)") for c in "Bb"
)


def _replace_bearer(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
    token = m.group("v").rstrip(".")
    if not _tokenish(token):
        return None  # "bearer bonds", "the bearer instrument"
    kind = SecretKind.BEARER_TOKEN
    start = m.start("v") - m.start()
    return m.group(0)[:start] + placeholder(kind) + m.group("v")[len(token) :], (kind,)


_BASIC_RES: Final = tuple(
    re.compile(_start(c) + r"(?i:asic)[ \t]{1,8}(?P<v>[A-Za-z0-9+/]{4,}+={0,2})(?![A-Za-z0-9+/=])")
    for c in "Bb"
)


def _replace_basic(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
    value = m.group("v")
    try:
        decoded = base64.b64decode(value + "=" * (-len(value) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, colon, _password = decoded.partition(":")
    if not colon or not user or not decoded.isprintable():
        return None  # "basic training": not base64 of user:password
    return _value(SecretKind.BASIC_AUTH)(m)


# --- JWT and vendor token formats --------------------------------------------------------------

_B64URL: Final = r"[A-Za-z0-9_\-]"
_JWT_RE: Final = re.compile(
    rf"{_start('e')}yJ{_B64URL}{{5,8192}}+\.{_B64URL}{{2,8192}}+(?:\.{_B64URL}{{0,8192}}+){{1,3}}"
)


def _discord_bot_valid(token: str) -> bool:
    first = token.split(".", 1)[0]
    try:
        decoded = base64.b64decode(first + "=" * (-len(first) % 4), altchars=b"-_", validate=True)
    except binascii.Error:
        return False
    return decoded.isdigit()  # the first segment is the base64 of a numeric user id


@dataclass(frozen=True, slots=True)
class _TokenSpec:
    kind: SecretKind
    regex: str
    valid: Callable[[str], bool] | None = None
    # Pre-filters, each necessary for a match (see _Detector).
    chars: str = ""
    needles: tuple[str, ...] = ()
    gate: re.Pattern[str] | None = None


_HEX: Final = "[0-9a-fA-F]"
# The middle of a Discord bot token (".<6 token characters>."): rare in prose, unlike its
# first letter, so the three token patterns run only when the text has one.
_DISCORD_GATE_RE: Final = re.compile(r"\.[A-Za-z0-9_\-]{6}\.")
_TOKEN_SPECS: Final = (
    _TokenSpec(
        SecretKind.AWS_ACCESS_KEY,
        rf"{_start('A')}(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])[A-Z0-9]{{16}}(?![A-Za-z0-9])",
        chars="A",
        needles=("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),
    ),
    _TokenSpec(
        SecretKind.GITHUB_TOKEN,
        rf"{_start('g')}(?:h[pousr]_[A-Za-z0-9]{{36,255}}+|ithub_pat_[A-Za-z0-9_]{{22,255}}+)",
        chars="_",
        needles=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    _TokenSpec(
        SecretKind.GITLAB_TOKEN,
        rf"{_start('g')}l(?:pat|dt|rt|ptt|ft|imt|soat|cbt|oas|agent)-[A-Za-z0-9_\-]{{20,255}}+",
        chars="-",
        needles=tuple(
            f"gl{p}-"
            for p in ("pat", "dt", "rt", "ptt", "ft", "imt", "soat", "cbt", "oas", "agent")
        ),
    ),
    _TokenSpec(
        SecretKind.SLACK_TOKEN,
        rf"{_start('x')}(?:ox[abposre](?:\.xox[abposre])?|app)-[A-Za-z0-9\-]{{10,255}}+",
        _has_digit,
        chars="-",
        needles=("xox", "xapp-"),
    ),
    _TokenSpec(
        SecretKind.STRIPE_KEY,
        rf"{_start('s')}k_(?:live|test)_[A-Za-z0-9]{{16,255}}+",
        chars="_",
        needles=("sk_live_", "sk_test_"),
    ),
    _TokenSpec(
        SecretKind.STRIPE_KEY,
        rf"{_start('r')}k_(?:live|test)_[A-Za-z0-9]{{16,255}}+",
        chars="_",
        needles=("rk_live_", "rk_test_"),
    ),
    _TokenSpec(
        SecretKind.STRIPE_KEY,
        rf"{_start('w')}hsec_[A-Za-z0-9+/=]{{24,255}}+",
        chars="_",
        needles=("whsec_",),
    ),
    _TokenSpec(
        SecretKind.ANTHROPIC_KEY,
        rf"{_start('s')}k-ant-[A-Za-z0-9_\-]{{20,255}}+",
        chars="-",
        needles=("sk-ant-",),
    ),
    _TokenSpec(
        SecretKind.OPENAI_KEY,
        rf"{_start('s')}k-[A-Za-z0-9_\-]{{20,255}}+",
        _has_digit,
        chars="-",
        needles=("sk-",),
    ),
    _TokenSpec(
        SecretKind.GOOGLE_API_KEY,
        rf"{_start('A')}Iza[0-9A-Za-z_\-]{{35,64}}+",
        chars="z",
        needles=("AIza",),
    ),
    _TokenSpec(
        SecretKind.GOOGLE_OAUTH,
        rf"{_start('y')}a29\.[0-9A-Za-z_\-]{{20,2048}}+",
        chars="9",
        needles=("ya29.",),
    ),
    _TokenSpec(
        SecretKind.GOOGLE_OAUTH,
        rf"{_start('G')}OCSPX-[0-9A-Za-z_\-]{{20,64}}+",
        chars="X-",
        needles=("GOCSPX-",),
    ),
    _TokenSpec(
        SecretKind.NPM_TOKEN,
        rf"{_start('n')}pm_[A-Za-z0-9]{{36,64}}+",
        chars="_",
        needles=("npm_",),
    ),
    _TokenSpec(
        SecretKind.PYPI_TOKEN,
        rf"{_start('p')}ypi-AgE[A-Za-z0-9_\-]{{50,2048}}+",
        chars="E-",
        needles=("pypi-AgE",),
    ),
    _TokenSpec(
        SecretKind.HUGGINGFACE_TOKEN,
        rf"{_start('h')}f_[A-Za-z0-9]{{30,64}}+",
        chars="_",
        needles=("hf_",),
    ),
    _TokenSpec(
        SecretKind.TWILIO_API_KEY,
        rf"{_start('S')}K{_HEX}{{32}}(?![A-Za-z0-9])",
        _has_digit,
        chars="K",
        needles=("SK",),
    ),
    _TokenSpec(
        SecretKind.SENDGRID_KEY,
        rf"{_start('S')}G\.[A-Za-z0-9_\-]{{22}}\.[A-Za-z0-9_\-]{{43,64}}+",
        chars="G",
        needles=("SG.",),
    ),
    *(
        _TokenSpec(
            SecretKind.DISCORD_BOT_TOKEN,
            _start(c) + r"[A-Za-z0-9_\-]{22,27}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,64}+",
            _discord_bot_valid,
            needles=(c,),
            gate=_DISCORD_GATE_RE,
        )
        for c in "MNO"  # base64 of a numeric user id starts with M, N or O
    ),
    _TokenSpec(
        SecretKind.SHOPIFY_TOKEN,
        rf"{_start('s')}hp(?:at|ca|pa|ss)_{_HEX}{{32}}(?![A-Za-z0-9])",
        chars="_",
        needles=("shpat_", "shpca_", "shppa_", "shpss_"),
    ),
    _TokenSpec(
        SecretKind.DIGITALOCEAN_TOKEN,
        rf"{_start('d')}o[opr]_v1_[a-f0-9]{{64}}(?![A-Za-z0-9])",
        chars="_",
        needles=("_v1_",),
    ),
    _TokenSpec(
        SecretKind.DATABRICKS_TOKEN,
        rf"{_start('d')}api[a-f0-9]{{32}}(?:-[0-9])?(?![A-Za-z0-9])",
        _has_digit,
        needles=("dapi",),
    ),
    _TokenSpec(
        SecretKind.AGE_SECRET_KEY,
        rf"{_start('A')}GE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{{58}}(?![A-Za-z0-9])",
        chars="-",
        needles=("AGE-SECRET-KEY-1",),
    ),
)

# Telegram bot tokens: <bot id>:AA<33+ characters>.  Anchored on ":AA"; the numeric bot id
# before it (public) is kept, and must follow a non-token character or ".../bot".
_TELEGRAM_RE: Final = re.compile(r":(?<=[0-9]:)AA[A-Za-z0-9_\-]{33,64}+")
_TELEGRAM_ID_RE: Final = re.compile(r"(?:^|(?<=/bot)|(?<=[^A-Za-z0-9_\-:]))[0-9]{8,10}\Z")


def _replace_telegram(m: re.Match[str]) -> tuple[str, tuple[SecretKind, ...]] | None:
    start = m.start()
    if not _TELEGRAM_ID_RE.search(m.string, max(0, start - 16), start):
        return None
    return ":" + placeholder(SecretKind.TELEGRAM_BOT_TOKEN), (SecretKind.TELEGRAM_BOT_TOKEN,)


# --- generic name=value assignments (and AWS secret keys) -------------------------------------

# A name is sensitive when it ENDS with one of these words (so max_tokens, token_count and
# tokenizer are not): query strings, env files, JSON, YAML, HTTP headers, connection strings.
# "~" stands for an optional "_" or "-" (api_key, api-key, apikey).
_SECRET_WORDS: Final = (
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "secret~key",
    "token",
    "api~key",
    "access~key",
    "private~key",
    "auth~key",
    "credential",
    "credentials",
    "signature",
    "sig",
    "account~key",
    "session~key",
    "session~secret",
    "secure~session~id",
    "cookie",
)
_OPT_DASH: Final = r"[_\-]?"
# Last three letters of every keyword (lower case): a set lookup skips most separators (JSON
# keys, times of day) before the backwards regex runs.
_WORD_ENDINGS: Final = frozenset(w.replace("~", "")[-3:] for w in _SECRET_WORDS) | {"_id", "-id"}
_SECRET_NAME_RE: Final = re.compile(
    r"[A-Za-z0-9_.\-]{0,64}(?:" + "|".join(w.replace("~", _OPT_DASH) for w in _SECRET_WORDS) + ")",
    re.IGNORECASE,
)
# Separators are found first (cheap); the keyword that must end right before a separator is
# matched backwards: this pattern is the name part spelled in reverse, run on the reversed
# text.  (A forward keyword-first regex costs ~5x more: common letters start many attempts.)
_KEYWORD_BEFORE_SEP_REVERSED: Final = re.compile(
    r"[ \t]{0,4}(?P<q0>(?:[\"']\\{0,3})?)(?:"
    + "|".join(w[::-1].replace("~", _OPT_DASH) for w in _SECRET_WORDS)
    + ")",
    re.IGNORECASE,
)
# The value: quoted (JSON escapes honoured; the closing quote may be missing) or bare.  A bare
# value is the rest of its whitespace-delimited token: passwords contain {}()[]<>,&; too
# (P@ss{w0rd}2024!, Tr0ub4dor&3xtra), so stopping at any of them would store the tail in
# clear; a query string or connection string loses its following parameters instead (fail
# closed).  Inside a quoted string ("PASSWORD=x", 'token=y') the bare value also ends at the
# string's unescaped closing quote (see _assignment_value).  Possessive runs: the whole value
# is always replaced, so a second pass finds nothing.
_VALUE_RE: Final = re.compile(
    r"[ \t]{0,4}(?:\"(?P<dq>(?:[^\"\\\r\n]|\\.)++)\"?"
    r"|'(?P<sq>[^'\r\n]++)'?"
    # quoted with escaped quotes, as in JSON inside a JSON or code string: \"value\"
    r"|\\{1,3}\"(?P<edq>(?:[^\"\\\r\n]|\\(?!\\{0,2}\")[^\r\n])++)(?:\\{1,3}\")?"
    r"|(?P<tmpl>\{\{[^{}\r\n]{1,128}+\}\})(?=[\s,;)\]}\"'`]|\Z)"
    r"|(?P<bare>[^\s\"'=]\S*+))"
)
# The same, for a name inside a string opened by that quote ("PASSWORD=x", "a --token=y").
_VALUE_IN_QUOTES_RES: Final = {
    q: re.compile(rf"[ \t]{{0,4}}(?P<bare>(?:[^\s{q}\\=]|\\\S)(?:[^\s{q}\\]|\\\S)*+)")
    for q in "\"'"
}
# Values that are clearly not secrets.  Each alternative is a whole value with no stray
# literal text: "${A} hunter2 ${B}" or "<a>hunter2<b>" is not a placeholder.  ${VAR} takes a
# plain name only (${DB_PASSWORD:-hunter2} has a literal default); $VAR is upper-case, the
# environment-variable convention ($ecret99 is a password).
_NOT_A_VALUE_RE: Final = re.compile(
    r"(?i:true|false|null|none|nil|undefined)|\*+|[xX]{3,}"
    r"|\$\{[A-Za-z_][A-Za-z0-9_.]{0,127}\}|\$[A-Z_][A-Z0-9_]{0,127}"
    r"|<[^<>\r\n]{1,64}>|\{\{[^{}\r\n]{1,128}\}\}"
)
# A bare "value" that is really an empty value followed by structure: the next parameter
# (token=&key=..., password=;Database=x) or closing brackets (f(password=), {password=}).
_EMPTY_VALUE_RE: Final = re.compile(r"[&;,][A-Za-z_][A-Za-z0-9_.\-]{0,64}+[=:]|[&;,)\]}>]{1,8}\Z")
# Punctuation that may follow a placeholder value in a sentence or a structure
# (password=${DB_PASSWORD}, or "token: $TOKEN.") without making it a literal.
_PLACEHOLDER_TRAILER: Final = ".,;:!?)]}\"'`"


def _not_a_value(raw: str) -> bool:
    for cut in range(4):  # the value itself, then without 1..3 trailing punctuation marks
        if cut and (len(raw) <= cut or raw[-cut] not in _PLACEHOLDER_TRAILER):
            return False
        if _NOT_A_VALUE_RE.fullmatch(raw, 0, len(raw) - cut) is not None:
            return True
    return False


# AWS secret access keys are 40 base64 characters with no prefix: only in name=value form.
_AWS_SECRET_NAME_RE: Final = re.compile(
    r"(?:aws[_\-]?secret[_\-]?(?:access[_\-]?)?key|secret[_\-]?access[_\-]?key)\Z", re.IGNORECASE
)
_AWS_SECRET_VALUE_RE: Final = re.compile(r"[A-Za-z0-9/+=]{40}")
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _name_start(text: str, kw_start: int) -> int:
    start = kw_start
    limit = max(0, kw_start - 64)
    while start > limit and text[start - 1] in _NAME_CHARS:
        start -= 1
    return start


def _assignment_value(text: str, at: int, open_quote: str) -> re.Match[str] | None:
    """The value after the separator ending at ``at``.

    ``open_quote`` is the quote that opened a string the name stands in (``"PASSWORD=x"``,
    ``'mysql --password=y'``), or ``""``: there, an unquoted value also ends at that string's
    unescaped closing quote, which is structure, not password.
    """
    if open_quote:
        value = _VALUE_RE.match(text, at)
        if value is not None and value.group("edq") is not None:
            return value  # an escaped quote does not close the string
        if value is not None and value.group("bare") is None:
            quote = text[value.start("dq" if value.group("dq") is not None else "sq") - 1]
            # The string's own closing quote ("PASSWORD=" + pw) leaves no value; another
            # quote opens a value of its own ("cmd='x'").
            return None if quote == open_quote else value
        return _VALUE_IN_QUOTES_RES[open_quote].match(text, at)
    return _VALUE_RE.match(text, at)


def _assignment_kind(
    text: str, name_start: int, name_end: int, quoted: bool, sep: str, value: re.Match[str]
) -> tuple[str, SecretKind] | None:
    """Decide whether one ``name<sep>value`` is a secret: (value group, kind) or None."""
    groups = value.groupdict()
    if groups.get("tmpl") is not None:
        return None  # a template expression ({{ db_password }}), with its spaces
    group = next(g for g in ("dq", "sq", "edq", "bare") if groups.get(g) is not None)
    raw = value.group(group)
    if _is_placeholder(raw) or _not_a_value(raw):
        return None
    if group == "bare" and _EMPTY_VALUE_RE.match(raw):
        return None
    start = name_start
    name = text[start:name_end]
    quoted = quoted or (start > 0 and text[start - 1] in "\"'")
    if name.lower().endswith("pwd") and raw.startswith(("/", "~")):
        return None  # PWD=/home/user is the working directory
    # YAML / header / prose colon form: "password: hunter2" yes, "Token: the" no.
    if sep == ":" and group == "bare" and not quoted and not (_has_digit(raw) or len(raw) >= 16):
        return None
    if _AWS_SECRET_NAME_RE.search(name) and _AWS_SECRET_VALUE_RE.fullmatch(raw):
        return group, SecretKind.AWS_SECRET_KEY
    return group, SecretKind.SECRET_ASSIGNMENT


def _separators(text: str) -> list[int]:
    """Positions of ':' and '=' in order (str.find runs at memchr speed; a regex class does not).

    The "=" of ":=" is skipped: it is the second character of the separator before it.
    """
    found: list[int] = []
    for ch in ":=":
        at = text.find(ch)
        while at >= 0:
            if not (ch == "=" and at and text[at - 1] == ":"):
                found.append(at)
            at = text.find(ch, at + 1)
    found.sort()
    return found


def _apply_assignments(text: str, counts: dict[SecretKind, int]) -> str:
    """Redact the values of ``name=value`` / ``name: value`` pairs with a sensitive name."""
    pieces: list[str] = []
    last = 0
    size = len(text)
    reversed_text = ""
    for at in _separators(text):
        if at < last:
            continue  # inside a value already replaced
        end = at
        while end > 0 and text[end - 1] in " \t\"'\\" and at - end < 8:
            end -= 1
        if text[max(0, end - 3) : end].lower() not in _WORD_ENDINGS:
            continue
        if not reversed_text:
            reversed_text = text[::-1]
        kw = _KEYWORD_BEFORE_SEP_REVERSED.match(reversed_text, size - at)
        if kw is None:
            continue
        sep = text[at : at + 2] if text.startswith((":=", "=>"), at) else text[at]
        name_end = size - kw.end("q0")
        name_start = _name_start(text, size - kw.end())
        # A quote right before the name opens a string the assignment stands in, unless the
        # name closes it itself ("password": ...).
        open_quote = ""
        if not kw.group("q0") and name_start > 0 and text[name_start - 1] in "\"'":
            open_quote = text[name_start - 1]
        value = _assignment_value(text, at + len(sep), open_quote)
        if value is None:
            continue
        decided = _assignment_kind(
            text, name_start, name_end, bool(kw.group("q0")), sep, value
        )
        if decided is None:
            continue
        group, kind = decided
        begin, end = value.span(group)
        pieces.append(text[last:begin])
        pieces.append(placeholder(kind))
        last = end
        counts[kind] = counts.get(kind, 0) + 1
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)


# --- the detector list -------------------------------------------------------------------------


def _token_detector(spec: _TokenSpec) -> _Detector:
    return _Detector(
        re.compile(spec.regex),
        _whole(spec.kind, spec.valid),
        chars=spec.chars,
        needles=spec.needles,
        gate=spec.gate,
    )


# Order matters: whole structures (key blocks, URLs, headers) before the tokens inside
# them, specific vendor formats before the generic name=value rule.
_DETECTORS: Final = (
    _Detector(_PEM_RE, _whole(SecretKind.PRIVATE_KEY), chars="-", needles=("-----BEGIN ",)),
    _Detector(_URL_RE, _replace_url, chars=":", needles=("://",)),
    *(_Detector(r, _replace_auth_header, ("authorization",)) for r in _AUTH_HEADER_RES),
    *(_Detector(r, _replace_bearer, ("bearer",)) for r in _BEARER_RES),
    *(_Detector(r, _replace_basic, ("basic",)) for r in _BASIC_RES),
    _Detector(_JWT_RE, _whole(SecretKind.JWT), chars="J", needles=("eyJ",)),
    *(_token_detector(spec) for spec in _TOKEN_SPECS),
    _Detector(_TELEGRAM_RE, _replace_telegram, chars=":", needles=(":AA",)),
)


def _redact_once(text: str) -> tuple[str, dict[SecretKind, int]]:
    """One pass of every detector, in order; returns the text and counts per kind."""
    counts: dict[SecretKind, int] = {}
    lowered: str | None = None  # computed when a detector with hints first needs it
    for detector in _DETECTORS:
        # Pre-filters (plain loops: a generator per detector per call costs more than the
        # substring searches themselves).
        if detector.chars:
            missing = False
            for char in detector.chars:
                if char not in text:
                    missing = True
                    break
            if missing:
                continue
        if detector.needles:
            for needle in detector.needles:
                if needle in text:
                    break
            else:
                continue
        if detector.hints:
            if lowered is None:
                lowered = text.lower()
            for hint in detector.hints:
                if hint in lowered:
                    break
            else:
                continue
        if detector.gate is not None and detector.gate.search(text) is None:
            continue
        before = len(counts), sum(counts.values())

        def sub(m: re.Match[str], detector: _Detector = detector) -> str:
            result = detector.replace(m)
            if result is None:
                return m.group(0)
            new, kinds = result
            for kind in kinds:
                counts[kind] = counts.get(kind, 0) + 1
            return new

        text = detector.pattern.sub(sub, text)
        if (len(counts), sum(counts.values())) != before:
            lowered = None  # the text changed
    # Last: specific formats first (GITHUB_TOKEN=ghp_... reports github_token).
    text = _apply_assignments(text, counts)
    return text, counts


# --- public API: redaction ---------------------------------------------------------------------


class RedactionResult(NamedTuple):
    """Redacted text and the kinds found (unique, in :class:`SecretKind` order).

    A 2-tuple, so ``text, kinds = redact(raw)`` works.
    """

    text: str
    kinds: tuple[SecretKind, ...]

    @property
    def redacted(self) -> bool:
        return bool(self.kinds)


def _sorted_kinds(kinds: Sequence[SecretKind] | Mapping[SecretKind, int]) -> tuple[SecretKind, ...]:
    return tuple(sorted(set(kinds), key=_KIND_ORDER.__getitem__))


def redact(text: str) -> RedactionResult:
    """Replace every secret in ``text`` with ``[REDACTED:<kind>]``; remove control characters.

    Deterministic and idempotent.  Never raises for any ``str`` (lone surrogates pass
    through; :func:`bound_utf8` and :func:`sanitize` refuse them).  Linear in ``len(text)``.
    """
    text = normalize_controls(text)
    found: dict[SecretKind, int] = {}
    # One pass is already a fixpoint for everything the tests generate; the loop is a
    # bounded safety net (a replacement can never create a new match by design).
    for _ in range(3):
        text, counts = _redact_once(text)
        if not counts:
            break
        for kind, n in counts.items():
            found[kind] = found.get(kind, 0) + n
    return RedactionResult(text, _sorted_kinds(found))


def redact_text(text: str) -> str:
    """:func:`redact` returning only the text."""
    return redact(text).text


def contains_secret(text: str) -> bool:
    """True iff any pattern matches ``text`` (after control-character removal).

    Snapshot recovery uses it: a stored record for which this is True is rejected.
    """
    _, counts = _redact_once(normalize_controls(text))
    return bool(counts)


def redact_json(
    value: Any, *, max_depth: int = _MAX_JSON_DEPTH
) -> tuple[Any, tuple[SecretKind, ...]]:
    """Redact every string (keys included) of a JSON value (threads events and exports).

    A string value under a sensitive key name (``"password"``, ``"api_key"``,
    ``"sessionToken"``...) is replaced whole, because a bare value carries no pattern.
    Returns ``(redacted copy, kinds)``.  Raises :class:`ValidationError` for nesting
    deeper than ``max_depth`` or a value that is not JSON (dict with str keys, list,
    tuple, str, int, float, bool, None).
    """
    found: set[SecretKind] = set()

    def walk(node: Any, depth: int) -> Any:
        if depth > max_depth:
            raise ValidationError("JSON value nested too deeply", max_depth=max_depth)
        if isinstance(node, str):
            result = redact(node)
            found.update(result.kinds)
            return result.text
        if node is None or isinstance(node, bool | int | float):
            return node
        if isinstance(node, list | tuple):
            return [walk(item, depth + 1) for item in node]
        if isinstance(node, dict):
            out: dict[str, Any] = {}
            for key, item in node.items():
                if not isinstance(key, str):
                    raise ValidationError("JSON object keys must be strings")
                new_key = walk(key, depth + 1)
                if (
                    isinstance(item, str)
                    and item
                    and not _is_placeholder(item)
                    and _SECRET_NAME_RE.fullmatch(key)
                    and not _not_a_value(item)
                ):
                    found.add(SecretKind.SECRET_ASSIGNMENT)
                    out[new_key] = placeholder(SecretKind.SECRET_ASSIGNMENT)
                else:
                    out[new_key] = walk(item, depth + 1)
            return out
        raise ValidationError("not a JSON value", type=type(node).__name__)

    redacted = walk(value, 0)
    return redacted, _sorted_kinds(list(found))


def json_contains_secret(value: Any, *, max_depth: int = _MAX_JSON_DEPTH) -> bool:
    """True iff :func:`redact_json` would change ``value`` (recovery validation of records)."""
    return bool(redact_json(value, max_depth=max_depth)[1])


# --- public API: bounding ----------------------------------------------------------------------


def _encode(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(
            "text is not valid Unicode (lone surrogate)", position=exc.start
        ) from None


def _is_extender(ch: str) -> bool:
    """Characters that continue the grapheme cluster before them."""
    o = ord(ch)
    return (
        o == 0x200D  # zero width joiner
        or 0x1F3FB <= o <= 0x1F3FF  # emoji skin-tone modifiers
        or 0xE0020 <= o <= 0xE007F  # emoji tag sequences (subdivision flags)
        or unicodedata.category(ch) in ("Mn", "Me", "Mc")  # combining marks, variation selectors
    )


def _is_regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _splits_cluster(text: str, end: int) -> bool:
    """True if cutting ``text`` before index ``end`` would split a grapheme cluster."""
    if end <= 0 or end >= len(text):
        return False
    if _is_extender(text[end]) or text[end - 1] == "\u200d":
        return True
    if _is_regional(text[end]) and _is_regional(text[end - 1]):
        run = 0
        i = end - 1
        while i >= 0 and _is_regional(text[i]) and run <= _MAX_CLUSTER_BACKOFF:
            run += 1
            i -= 1
        return run % 2 == 1  # a flag is a pair; an odd run ends in half a flag
    return False


def bound_utf8(text: str, max_bytes: int) -> tuple[str, bool]:
    """Cut ``text`` to at most ``max_bytes`` UTF-8 bytes; returns ``(text, truncated)``.

    The cut never splits a code point, and (looking back at most 32 code points) does not
    split a grapheme cluster either: a combining mark, variation selector, skin-tone
    modifier, ZWJ sequence (👩‍💻) or flag pair is dropped whole with its base character.
    Raises :class:`ValidationError` (``invalid_input``) for text that is not valid Unicode
    (lone surrogates) or a negative ``max_bytes``.
    """
    if max_bytes < 0:
        raise ValidationError("max_bytes must be >= 0", max_bytes=max_bytes)
    if len(text) <= max_bytes and text.isascii():  # fast path: ASCII is one byte a character
        return text, False
    data = _encode(text)
    if len(data) <= max_bytes:
        return text, False
    cut = max_bytes
    while cut > 0 and (data[cut] & 0xC0) == 0x80:  # continuation byte: back to a char start
        cut -= 1
    end = len(data[:cut].decode("utf-8"))
    limit = max(0, end - _MAX_CLUSTER_BACKOFF)
    candidate = end
    while candidate > limit and _splits_cluster(text, candidate):
        candidate -= 1
    if candidate > limit or not _splits_cluster(text, candidate):
        end = candidate
    return text[:end], True


# --- public API: the one call the store uses ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class SanitizedText:
    """Text ready for the store: control characters removed, redacted, then bounded."""

    text: str
    byte_length: int
    kinds: tuple[SecretKind, ...]
    truncated: bool

    @property
    def redacted(self) -> bool:
        return bool(self.kinds)


def sanitize(text: str, max_bytes: int) -> SanitizedText:
    """Normalize, redact, then bound ``text`` to ``max_bytes`` UTF-8 bytes.

    If the cut exposes a new match (``AKIA`` + 17 characters cut to ``AKIA`` + 16), the
    bounded text is redacted and bounded again, up to :data:`MAX_SANITIZE_ROUNDS` rounds;
    should that not converge, the content is replaced by :data:`FALLBACK_TEXT` (cut to
    ``max_bytes``).  The result never satisfies :func:`contains_secret`.
    Raises :class:`ValidationError` (``invalid_input``) for lone surrogates or a negative
    ``max_bytes``.  Work is linear in ``len(text)``: callers should refuse absurdly large
    input before calling (the store bounds request sizes).
    """
    if max_bytes < 0:
        raise ValidationError("max_bytes must be >= 0", max_bytes=max_bytes)
    if not text.isascii():
        _encode(text)  # refuse lone surrogates before doing any work (ASCII has none)
    result = redact(text)
    kinds = set(result.kinds)
    out, truncated = bound_utf8(result.text, max_bytes)
    rounds = 1
    # Text with nothing redacted and nothing cut is final; otherwise check again (a cut can
    # expose a new match; and never rely on redact()'s bounded fixpoint loop alone).
    while (truncated or kinds) and contains_secret(out):
        if rounds >= MAX_SANITIZE_ROUNDS:
            out, _ = bound_utf8(FALLBACK_TEXT, max_bytes)
            truncated = True
            break
        again = redact(out)
        kinds.update(again.kinds)
        out, cut = bound_utf8(again.text, max_bytes)
        truncated = truncated or cut
        rounds += 1
    nbytes = len(out) if out.isascii() else len(out.encode("utf-8"))
    return SanitizedText(out, nbytes, _sorted_kinds(list(kinds)), truncated)
