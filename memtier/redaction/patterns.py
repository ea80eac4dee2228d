"""The pattern table: every secret format memtier recognises, as data.

Owns the regular expressions and literal tables the detectors run, and nothing that runs
them: what a private key block, a capability URL, an ``Authorization`` value, a JWT, each
vendor token (:data:`TOKEN_SPECS`: kind, regex, validator, pre-filter literals) and a
sensitive ``name=value`` pair look like.  How a match is replaced lives in
:mod:`memtier.redaction.detectors` (and :mod:`memtier.redaction.assignments` for the
``name=value`` rule); the order they run in is
:data:`~memtier.redaction.detectors.DETECTORS`.

Rules every pattern here keeps (the linear-time guarantee, see :mod:`memtier.redaction`):
it starts with a literal character (:func:`_start`: a token-run boundary as a lookbehind
*after* that character, so the regex engine skips straight to candidates); every quantifier
is bounded or possessive; a value that gets replaced is a possessive run consumed whole, so
a second pass finds nothing left.

Adding a vendor token format: a :class:`~memtier.redaction.placeholders.SecretKind`, a
:class:`TokenSpec` below (with pre-filters that are NECESSARY conditions:
``tests/test_redaction_prefilter.py`` checks them), a row in README.md's pattern table
(checked by ``tests/test_redaction.py``) and a maker in ``tests/adversarial/secretgen.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from memtier.redaction.placeholders import SecretKind
from memtier.redaction.shapes import discord_bot_valid, has_digit

# --- building blocks ---------------------------------------------------------------------------

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
PEM_RE: Final = re.compile(
    rf"-----BEGIN[ ]{_PEM_LABEL}-----"
    r"(?:(?:[A-Za-z0-9+/=\s\\:,.>\#]|-(?!----))*+"
    rf"-----END[ ]{_PEM_LABEL}-----"
    rf"|{_PEM_HEADERS}"
    rf"(?:(?:[ \t]{{0,16}}+{_PEM_BREAK})?{_PEM_INDENT}{_PEM_RUN})?"
    rf"(?:(?:[ \t]{{0,16}}+{_PEM_BREAK}{_PEM_INDENT}|[ \t]{{1,16}}+){_PEM_MORE})*+)"
)

# --- URLs --------------------------------------------------------------------------------------

# Anchored on "://" (scheme characters before it); the scheme itself is kept as it is.
URL_RE: Final = re.compile(
    r":(?<=[A-Za-z0-9+.\-]:)//"
    r"(?P<authority>[^\s/?#<>\"'`\\]*+)"
    r"(?P<rest>[/?#][^\s<>\"'`\\]*+)?"
)
# Second Life / OpenSim capability URLs: http(s)://sim:port/cap/<uuid> and /CAPS/<uuid>0000/.
CAP_PATH_RE: Final = re.compile(
    r"/(?:caps?|capability|capabilities)/(?:[A-Za-z0-9_\-]{1,32}/){0,2}"
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    re.IGNORECASE,
)
# Query/fragment parameters that make a URL a bearer capability (pre-signed S3/GCS, Azure
# SAS `sig`, OAuth tokens in fragments, `?key=` API keys, `?token=`...).
CAP_PARAM_RE: Final = re.compile(
    r"x-amz-(?:signature|credential|security-token)|x-goog-(?:signature|credential)"
    r"|googleaccessid|awsaccesskeyid|sig|signature|key|auth|jwt|code_verifier"
    r"|[a-z0-9_.\-]{0,32}(?:token|secret|password|passwd|pwd|api[_\-]?key|apikey"
    r"|access[_\-]?key|secret[_\-]?key|session[_\-]?key)",
    re.IGNORECASE,
)
SLACK_HOOK_RE: Final = re.compile(r"/(?:services|workflows|triggers)/[^/?#]{4,}")
DISCORD_HOOK_RE: Final = re.compile(r"/api(?:/v\d{1,2})?/webhooks/\d{5,}/[^/?#]{8,}")
TEAMS_HOOK_RE: Final = re.compile(r"/webhook(?:b2)?/[^/?#]{8,}", re.IGNORECASE)
TRAILING_PUNCT: Final = ".,;:!?'"

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
AUTH_HEADER_RES: Final = tuple(
    re.compile(
        _start(c, "A-Za-z0-9_")
        + rf"(?:(?<=(?P<oq>[\"'])[{c}])|(?<=(?P<oqx>[\"'])(?i:proxy)-[{c}]))?"
        + _AUTH_HEADER_BODY
    )
    for c in "Aa"
)
AUTH_SCHEME_WORDS: Final = frozenset(
    re.split(
        r"\s+",
        "bearer basic token negotiate ntlm apikey api-key key sso-key ssws jwt dpop googlelogin"
        " bot digest aws4-hmac-sha256 oauth signature hoba mutual",
    )
)


BEARER_RES: Final = tuple(
    re.compile(_start(c) + r"(?i:earer)[ \t]{1,8}(?P<v>[A-Za-z0-9\-._~+/]++=*+)") for c in "Bb"
)


BASIC_RES: Final = tuple(
    re.compile(_start(c) + r"(?i:asic)[ \t]{1,8}(?P<v>[A-Za-z0-9+/]{4,}+={0,2})(?![A-Za-z0-9+/=])")
    for c in "Bb"
)


# --- JWT and vendor token formats --------------------------------------------------------------

_B64URL: Final = r"[A-Za-z0-9_\-]"
JWT_RE: Final = re.compile(
    rf"{_start('e')}yJ{_B64URL}{{5,8192}}+\.{_B64URL}{{2,8192}}+(?:\.{_B64URL}{{0,8192}}+){{1,3}}"
)


@dataclass(frozen=True, slots=True)
class TokenSpec:
    kind: SecretKind
    regex: str
    valid: Callable[[str], bool] | None = None
    # Pre-filters, each necessary for a match (see memtier.redaction.prefilter).
    chars: str = ""
    needles: tuple[str, ...] = ()
    gate: re.Pattern[str] | None = None


_HEX: Final = "[0-9a-fA-F]"
# The middle of a Discord bot token (".<6 token characters>."): rare in prose, unlike its
# first letter, so the three token patterns run only when the text has one.
DISCORD_GATE_RE: Final = re.compile(r"\.[A-Za-z0-9_\-]{6}\.")
TOKEN_SPECS: Final = (
    TokenSpec(
        SecretKind.AWS_ACCESS_KEY,
        rf"{_start('A')}(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])[A-Z0-9]{{16}}(?![A-Za-z0-9])",
        chars="A",
        needles=("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),
    ),
    TokenSpec(
        SecretKind.GITHUB_TOKEN,
        rf"{_start('g')}(?:h[pousr]_[A-Za-z0-9]{{36,255}}+|ithub_pat_[A-Za-z0-9_]{{22,255}}+)",
        chars="_",
        needles=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    TokenSpec(
        SecretKind.GITLAB_TOKEN,
        rf"{_start('g')}l(?:pat|dt|rt|ptt|ft|imt|soat|cbt|oas|agent)-[A-Za-z0-9_\-]{{20,255}}+",
        chars="-",
        needles=tuple(
            f"gl{p}-"
            for p in ("pat", "dt", "rt", "ptt", "ft", "imt", "soat", "cbt", "oas", "agent")
        ),
    ),
    TokenSpec(
        SecretKind.SLACK_TOKEN,
        rf"{_start('x')}(?:ox[abposre](?:\.xox[abposre])?|app)-[A-Za-z0-9\-]{{10,255}}+",
        has_digit,
        chars="-",
        needles=("xox", "xapp-"),
    ),
    TokenSpec(
        SecretKind.STRIPE_KEY,
        rf"{_start('s')}k_(?:live|test)_[A-Za-z0-9]{{16,255}}+",
        chars="_",
        needles=("sk_live_", "sk_test_"),
    ),
    TokenSpec(
        SecretKind.STRIPE_KEY,
        rf"{_start('r')}k_(?:live|test)_[A-Za-z0-9]{{16,255}}+",
        chars="_",
        needles=("rk_live_", "rk_test_"),
    ),
    TokenSpec(
        SecretKind.STRIPE_KEY,
        rf"{_start('w')}hsec_[A-Za-z0-9+/=]{{24,255}}+",
        chars="_",
        needles=("whsec_",),
    ),
    TokenSpec(
        SecretKind.ANTHROPIC_KEY,
        rf"{_start('s')}k-ant-[A-Za-z0-9_\-]{{20,255}}+",
        chars="-",
        needles=("sk-ant-",),
    ),
    TokenSpec(
        SecretKind.OPENAI_KEY,
        rf"{_start('s')}k-[A-Za-z0-9_\-]{{20,255}}+",
        has_digit,
        chars="-",
        needles=("sk-",),
    ),
    TokenSpec(
        SecretKind.GOOGLE_API_KEY,
        rf"{_start('A')}Iza[0-9A-Za-z_\-]{{35,64}}+",
        chars="z",
        needles=("AIza",),
    ),
    TokenSpec(
        SecretKind.GOOGLE_OAUTH,
        rf"{_start('y')}a29\.[0-9A-Za-z_\-]{{20,2048}}+",
        chars="9",
        needles=("ya29.",),
    ),
    TokenSpec(
        SecretKind.GOOGLE_OAUTH,
        rf"{_start('G')}OCSPX-[0-9A-Za-z_\-]{{20,64}}+",
        chars="X-",
        needles=("GOCSPX-",),
    ),
    TokenSpec(
        SecretKind.NPM_TOKEN,
        rf"{_start('n')}pm_[A-Za-z0-9]{{36,64}}+",
        chars="_",
        needles=("npm_",),
    ),
    TokenSpec(
        SecretKind.PYPI_TOKEN,
        rf"{_start('p')}ypi-AgE[A-Za-z0-9_\-]{{50,2048}}+",
        chars="E-",
        needles=("pypi-AgE",),
    ),
    TokenSpec(
        SecretKind.HUGGINGFACE_TOKEN,
        rf"{_start('h')}f_[A-Za-z0-9]{{30,64}}+",
        chars="_",
        needles=("hf_",),
    ),
    TokenSpec(
        SecretKind.TWILIO_API_KEY,
        rf"{_start('S')}K{_HEX}{{32}}(?![A-Za-z0-9])",
        has_digit,
        chars="K",
        needles=("SK",),
    ),
    TokenSpec(
        SecretKind.SENDGRID_KEY,
        rf"{_start('S')}G\.[A-Za-z0-9_\-]{{22}}\.[A-Za-z0-9_\-]{{43,64}}+",
        chars="G",
        needles=("SG.",),
    ),
    *(
        TokenSpec(
            SecretKind.DISCORD_BOT_TOKEN,
            _start(c) + r"[A-Za-z0-9_\-]{22,27}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,64}+",
            discord_bot_valid,
            needles=(c,),
            gate=DISCORD_GATE_RE,
        )
        for c in "MNO"  # base64 of a numeric user id starts with M, N or O
    ),
    TokenSpec(
        SecretKind.SHOPIFY_TOKEN,
        rf"{_start('s')}hp(?:at|ca|pa|ss)_{_HEX}{{32}}(?![A-Za-z0-9])",
        chars="_",
        needles=("shpat_", "shpca_", "shppa_", "shpss_"),
    ),
    TokenSpec(
        SecretKind.DIGITALOCEAN_TOKEN,
        rf"{_start('d')}o[opr]_v1_[a-f0-9]{{64}}(?![A-Za-z0-9])",
        chars="_",
        needles=("_v1_",),
    ),
    TokenSpec(
        SecretKind.DATABRICKS_TOKEN,
        rf"{_start('d')}api[a-f0-9]{{32}}(?:-[0-9])?(?![A-Za-z0-9])",
        has_digit,
        needles=("dapi",),
    ),
    TokenSpec(
        SecretKind.AGE_SECRET_KEY,
        rf"{_start('A')}GE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{{58}}(?![A-Za-z0-9])",
        chars="-",
        needles=("AGE-SECRET-KEY-1",),
    ),
)

# Telegram bot tokens: <bot id>:AA<33+ characters>.  Anchored on ":AA"; the numeric bot id
# before it (public) is kept, and must follow a non-token character or ".../bot".
TELEGRAM_RE: Final = re.compile(r":(?<=[0-9]:)AA[A-Za-z0-9_\-]{33,64}+")
TELEGRAM_ID_RE: Final = re.compile(r"(?:^|(?<=/bot)|(?<=[^A-Za-z0-9_\-:]))[0-9]{8,10}\Z")


# --- generic name=value assignments (and AWS secret keys) -------------------------------------

# A name is sensitive when it ENDS with one of these words (so max_tokens, token_count and
# tokenizer are not): query strings, env files, JSON, YAML, HTTP headers, connection strings.
# "~" stands for an optional "_" or "-" (api_key, api-key, apikey).
SECRET_WORDS: Final = (
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
WORD_ENDINGS: Final = frozenset(w.replace("~", "")[-3:] for w in SECRET_WORDS) | {"_id", "-id"}
SECRET_NAME_RE: Final = re.compile(
    r"[A-Za-z0-9_.\-]{0,64}(?:" + "|".join(w.replace("~", _OPT_DASH) for w in SECRET_WORDS) + ")",
    re.IGNORECASE,
)
# Separators are found first (cheap); the keyword that must end right before a separator is
# matched backwards: this pattern is the name part spelled in reverse, run on the reversed
# text.  (A forward keyword-first regex costs ~5x more: common letters start many attempts.)
KEYWORD_BEFORE_SEP_REVERSED: Final = re.compile(
    r"[ \t]{0,4}(?P<q0>(?:[\"']\\{0,3})?)(?:"
    + "|".join(w[::-1].replace("~", _OPT_DASH) for w in SECRET_WORDS)
    + ")",
    re.IGNORECASE,
)
# The value: quoted (JSON escapes honoured; the closing quote may be missing) or bare.  A bare
# value is the rest of its whitespace-delimited token: passwords contain {}()[]<>,&; too
# (P@ss{w0rd}2024!, Tr0ub4dor&3xtra), so stopping at any of them would store the tail in
# clear; a query string or connection string loses its following parameters instead (fail
# closed).  Inside a quoted string ("PASSWORD=x", 'token=y') the bare value also ends at the
# string's unescaped closing quote (see assignments._assignment_value).  Possessive runs: the
# whole value is always replaced, so a second pass finds nothing.
VALUE_RE: Final = re.compile(
    r"[ \t]{0,4}(?:\"(?P<dq>(?:[^\"\\\r\n]|\\.)++)\"?"
    r"|'(?P<sq>[^'\r\n]++)'?"
    # quoted with escaped quotes, as in JSON inside a JSON or code string: \"value\"
    r"|\\{1,3}\"(?P<edq>(?:[^\"\\\r\n]|\\(?!\\{0,2}\")[^\r\n])++)(?:\\{1,3}\")?"
    r"|(?P<tmpl>\{\{[^{}\r\n]{1,128}+\}\})(?=[\s,;)\]}\"'`]|\Z)"
    r"|(?P<bare>[^\s\"'=]\S*+))"
)
# The same, for a name inside a string opened by that quote ("PASSWORD=x", "a --token=y").
VALUE_IN_QUOTES_RES: Final = {
    q: re.compile(rf"[ \t]{{0,4}}(?P<bare>(?:[^\s{q}\\=]|\\\S)(?:[^\s{q}\\]|\\\S)*+)")
    for q in "\"'"
}
# Values that are clearly not secrets.  Each alternative is a whole value with no stray
# literal text: "${A} hunter2 ${B}" or "<a>hunter2<b>" is not a placeholder.  ${VAR} takes a
# plain name only (${DB_PASSWORD:-hunter2} has a literal default); $VAR is upper-case, the
# environment-variable convention ($ecret99 is a password).
NOT_A_VALUE_RE: Final = re.compile(
    r"(?i:true|false|null|none|nil|undefined)|\*+|[xX]{3,}"
    r"|\$\{[A-Za-z_][A-Za-z0-9_.]{0,127}\}|\$[A-Z_][A-Z0-9_]{0,127}"
    r"|<[^<>\r\n]{1,64}>|\{\{[^{}\r\n]{1,128}\}\}"
)
# A bare "value" that is really an empty value followed by structure: the next parameter
# (token=&key=..., password=;Database=x) or closing brackets (f(password=), {password=}).
EMPTY_VALUE_RE: Final = re.compile(r"[&;,][A-Za-z_][A-Za-z0-9_.\-]{0,64}+[=:]|[&;,)\]}>]{1,8}\Z")
# Punctuation that may follow a placeholder value in a sentence or a structure
# (password=${DB_PASSWORD}, or "token: $TOKEN.") without making it a literal.
PLACEHOLDER_TRAILER: Final = ".,;:!?)]}\"'`"


# AWS secret access keys are 40 base64 characters with no prefix: only in name=value form.
AWS_SECRET_NAME_RE: Final = re.compile(
    r"(?:aws[_\-]?secret[_\-]?(?:access[_\-]?)?key|secret[_\-]?access[_\-]?key)\Z", re.IGNORECASE
)
AWS_SECRET_VALUE_RE: Final = re.compile(r"[A-Za-z0-9/+=]{40}")
NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
