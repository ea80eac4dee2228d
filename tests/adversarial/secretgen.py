"""Realistic fake secrets, harmless look-alikes and the texts that carry them.

The generator behind the secret-corpus oracle (``test_secret_oracle.py``).  Every detector of
``memtier.redaction`` (and every kind the README lists) has a maker here that writes a secret
the way it shows up in real chat, logs and tool output, and names its *cores*: the parts that
are secret, which must never be stored, in any form.  The oracle never asks memtier whether
something is a secret; it looks for the cores byte for byte.

Randomness: the structure (which kind, which spelling, which context, what comes before and
after) is drawn by Hypothesis, so it shrinks to a readable example; the secret characters come
from a ``random.Random`` seeded by a drawn integer, so they have the entropy of a real token and
a core cannot collide with prose, another core or a look-alike by accident.

Nothing here is a real credential: each value is random and the fixed prefixes are assembled
from pieces, so no file in the repository holds a string a secret scanner would flag.
"""

from __future__ import annotations

import base64
import json
import random
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import strategies as st

from memtier.redaction import SecretKind

UPPER = string.ascii_uppercase
LOWER = string.ascii_lowercase
DIGITS = string.digits
ALNUM = UPPER + LOWER + DIGITS
UPPER_ALNUM = UPPER + DIGITS
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
BECH32 = "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"
# Password characters: every ASCII symbol but quotes, backslash and backtick (a password
# with those is written escaped, and the escaping is a different text), and a few non-ASCII.
PASSWORD_SYMBOLS = "!#$%&()*+,-./:;<=>?@[]^_{|}~"
PASSWORD_CHARS = ALNUM + PASSWORD_SYMBOLS + "éüß€"


@dataclass(frozen=True)
class Planted:
    """One secret as written into a turn, and what of it must never be stored."""

    kind: SecretKind
    text: str
    cores: tuple[str, ...]
    # The detector consumes the rest of its line (Authorization parameter lists) or, for a
    # key without an END line, runs until a blank line: what follows starts a new paragraph.
    ends_paragraph: bool = False
    ends_line: bool = False
    multiline: bool = False
    # Fits in a URL query value (no spaces, no URL delimiters).
    url_safe: bool = False


@dataclass(frozen=True)
class LookAlike:
    """Text that looks like a secret but is not one (README: left alone): stored verbatim."""

    name: str
    text: str


@dataclass(frozen=True)
class Segment:
    """A piece of a turn: a secret, a look-alike or plain prose."""

    text: str
    planted: Planted | None = None
    lookalike: LookAlike | None = None
    ends_paragraph: bool = False
    ends_line: bool = False


@dataclass(frozen=True)
class TurnText:
    """The text of one turn, with every secret and look-alike placed in it."""

    text: str
    planted: tuple[Planted, ...] = ()
    lookalikes: tuple[LookAlike, ...] = field(default=())


def secret_random(stream: str, seed: int) -> random.Random:
    """A generator of its own per kind of thing: a secret and a look-alike drawn with the same
    seed must not share characters (a public key equal to a private key's body)."""
    return random.Random(f"{stream}:{seed}")


def chars(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def with_digit(rng: random.Random, value: str, start: int = 0) -> str:
    """``value`` with one random position (at or after ``start``) made a digit, if it has none."""
    if any(c.isdigit() for c in value[start:]):
        return value
    at = rng.randrange(start, len(value))
    return value[:at] + rng.choice(DIGITS) + value[at + 1 :]


def window_for(core: str) -> int:
    """The length of the substrings of a core the oracle looks for.

    Long enough that chance cannot produce it anywhere else in the store (at least about
    10^12 values), short enough to catch a leaked tail: 10 for hex or digits, 7 for
    alphanumeric/base64, 6 for passwords with symbols.
    """
    if set(core) <= set(HEX + HEX.upper() + "-"):
        return 10
    if set(core) <= set(B64URL + "+/="):
        return 7
    return 6


def windows(core: str) -> list[str]:
    """Every substring of ``core`` of its window length (the core itself if shorter)."""
    n = window_for(core)
    if len(core) <= n:
        return [core]
    return [core[i : i + n] for i in range(len(core) - n + 1)]


# --- makers, one per detector ------------------------------------------------------------------

Maker = Callable[[random.Random, int], Planted]
K = SecretKind


def _pem_lines(rng: random.Random, n_lines: int, width: int) -> list[str]:
    lines = [chars(rng, B64, width) for _ in range(n_lines - 1)]
    last = with_digit(rng, chars(rng, B64, rng.randrange(8, width)))  # see _pem_body_cores
    lines.append(last + rng.choice(["", "=", "=="]))
    return lines


def _pem_body_cores(lines: list[str]) -> tuple[str, ...]:
    # A last fragment under 16 characters with no digit, "+", "/" or "=" is taken for prose
    # by design (README); every other piece of the body is key material.
    out = []
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if last and len(line) < 16 and not any(c in DIGITS + "+/=" for c in line):
            continue
        if len(line) < 8:  # too short to be told from chance (and to be worth anything)
            continue
        out.append(line)
    return tuple(out)


def private_key(rng: random.Random, v: int) -> Planted:
    label, width = [
        ("RSA PRIVATE KEY", 64),
        ("PRIVATE KEY", 64),
        ("EC PRIVATE KEY", 64),
        ("OPENSSH PRIVATE KEY", 70),
        ("ENCRYPTED PRIVATE KEY", 64),
        ("DSA PRIVATE KEY", 64),
        ("PGP PRIVATE KEY BLOCK", 64),
    ][v % 7]
    lines = _pem_lines(rng, 2 + (v // 7) % 6, width)
    headers: list[str] = []
    if label == "RSA PRIVATE KEY" and v % 2:
        headers = ["Proc-Type: 4,ENCRYPTED", f"DEK-Info: AES-128-CBC,{chars(rng, HEX, 32)}", ""]
    if label.startswith("PGP"):
        headers = ["Version: GnuPG v2", ""] if v % 2 else [""]
        lines.append("=" + chars(rng, B64, 4))
    style = (v // 3) % 4  # 0, 1: whole; 2: truncated (no END line); 3: truncated mid-line
    begin, end = f"-----BEGIN {label}-----", f"-----END {label}-----"
    sep = "\r\n" if v % 11 == 5 else "\n"
    if style >= 2:
        if style == 3:
            cut = rng.randrange(1, len(lines[-1]))
            lines = [*lines[:-1], lines[-1][:cut]]
        body = sep.join([begin, *headers, *lines])
        return Planted(K.PRIVATE_KEY, body, _pem_body_cores(lines), True, multiline=True)
    if v % 13 == 7:  # pasted on one line (a chat box or an env var ate the newlines)
        body = " ".join([begin, *[h for h in headers if h], *lines, end])
        return Planted(K.PRIVATE_KEY, body, tuple(lines), multiline=False)
    body = sep.join([begin, *headers, *lines, end])
    return Planted(K.PRIVATE_KEY, body, tuple(lines), multiline=True)


def _password(rng: random.Random, lo: int = 10, hi: int = 24) -> str:
    """A password with symbols; never one of the documented non-values (README)."""
    while True:
        value = with_digit(rng, chars(rng, PASSWORD_CHARS, rng.randrange(lo, hi)))
        if value[0] not in "$<{*&;,)]}>=/~" and not value.lower().startswith(("x" * 3, "true")):
            return value


def url_credentials(rng: random.Random, v: int) -> Planted:
    scheme, host = [
        ("postgres", "db.internal.example.com:5432/app"),
        ("mysql", "10.0.3.7:3306/shop"),
        ("redis", "cache.example.net:6379/0"),
        ("amqp", "mq.example.org/vhost"),
        ("https", "git.example.com/org/repo.git"),
        ("mongodb+srv", "cluster0.example.mongodb.net/test?retryWrites=true"),
    ][v % 6]
    user = chars(rng, LOWER, rng.randrange(3, 9))
    if v % 4 == 3:  # a token used as the user name
        token = "gh" + "p_" + chars(rng, ALNUM, 36)
        return Planted(K.URL_CREDENTIALS, f"https://{token}@{host}", (token[4:],), url_safe=False)
    password = with_digit(rng, chars(rng, ALNUM + "-._~!*+,;=", rng.randrange(10, 28)))
    if v % 5 == 2:
        password += "%40" + chars(rng, ALNUM, 4)  # an escaped "@" in the password
    return Planted(K.URL_CREDENTIALS, f"{scheme}://{user}:{password}@{host}", (password,))


def capability_url(rng: random.Random, v: int) -> Planted:
    cap = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    style = v % 7
    if style == 0:
        host = f"sim{rng.randrange(1, 9999)}.agni.example.com:12043"
        return Planted(K.CAPABILITY_URL, f"https://{host}/cap/{cap}", (cap,))
    if style == 1:
        return Planted(
            K.CAPABILITY_URL, f"http://grid.example.org:9000/CAPS/{cap}0000/", (cap + "0000",)
        )
    if style == 2:
        sig = chars(rng, HEX, 64)
        cred = "AKIA" + chars(rng, UPPER_ALNUM, 16)
        url = (
            "https://bucket.s3.amazonaws.com/reports/q3.pdf?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            f"&X-Amz-Credential={cred}%2F20240101%2Fus-east-1%2Fs3%2Faws4_request"
            f"&X-Amz-Expires=3600&X-Amz-Signature={sig}"
        )
        return Planted(K.CAPABILITY_URL, url, (sig, cred))
    if style == 3:
        sig = chars(rng, B64, 43) + "%3D"
        url = (
            "https://acct.blob.core.windows.net/backups/db.bak?sv=2022-11-02&ss=b&srt=o"
            f"&sp=r&se=2030-01-01T00:00:00Z&sig={sig}"
        )
        return Planted(K.CAPABILITY_URL, url, (sig[:-3],))
    if style == 4:
        sig = chars(rng, ALNUM, 40)
        url = (
            "https://storage.googleapis.com/bkt/o.txt?X-Goog-Algorithm=GOOG4-RSA-SHA256"
            f"&X-Goog-Signature={sig}"
        )
        return Planted(K.CAPABILITY_URL, url, (sig,))
    token = with_digit(rng, chars(rng, B64URL, rng.randrange(24, 48)))
    sep = "#" if style == 5 else "?"
    name = ["access_token", "api_key", "token", "session_token", "client_secret"][v % 5]
    url = f"https://app.example.com/oauth/callback{sep}state=xyz&{name}={token}&expires_in=3600"
    return Planted(K.CAPABILITY_URL, url, (token,))


def slack_webhook(rng: random.Random, v: int) -> Planted:
    team = "T" + chars(rng, UPPER_ALNUM, 10)
    bot = "B" + chars(rng, UPPER_ALNUM, 10)
    secret = chars(rng, ALNUM, 24)
    path = ["services", "workflows", "triggers"][v % 3]
    url = f"https://hooks.slack.com/{path}/{team}/{bot}/{secret}"
    return Planted(K.SLACK_WEBHOOK, url, (secret, team[1:], bot[1:]))


def discord_webhook(rng: random.Random, v: int) -> Planted:
    hook_id = str(rng.randrange(10**17, 10**19))
    token = chars(rng, B64URL, 68)
    host = ["discord.com", "discordapp.com", "canary.discord.com"][v % 3]
    api = ["api", "api/v10"][v % 2]
    return Planted(K.DISCORD_WEBHOOK, f"https://{host}/{api}/webhooks/{hook_id}/{token}", (token,))


def teams_webhook(rng: random.Random, v: int) -> Planted:
    group, tenant, owner = (str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in "abc")
    secret = chars(rng, HEX, 32)
    if v % 2:
        url = (
            f"https://contoso.webhook.office.com/webhookb2/{group}@{tenant}"
            f"/IncomingWebhook/{secret}/{owner}"
        )
    else:
        url = (
            f"https://outlook.office.com/webhook/{group}@{tenant}/IncomingWebhook/{secret}/{owner}"
        )
    return Planted(K.TEAMS_WEBHOOK, url, (secret, group, owner))


def authorization_header(rng: random.Random, v: int) -> Planted:
    style = v % 6
    if style == 0:
        token = chars(rng, HEX, 40)
        return Planted(K.AUTHORIZATION_HEADER, f"Authorization: token {token}", (token,))
    if style == 1:
        response = chars(rng, HEX, 32)
        nonce = chars(rng, ALNUM, 24)
        text = (
            'Authorization: Digest username="bob", realm="api", '
            f'nonce="{nonce}", uri="/v1/x", response="{response}"'
        )
        return Planted(K.AUTHORIZATION_HEADER, text, (response, nonce), ends_line=True)
    if style == 2:
        sig = chars(rng, HEX, 64)
        key_id = "AKIA" + chars(rng, UPPER_ALNUM, 16)
        text = (
            f"Authorization: AWS4-HMAC-SHA256 Credential={key_id}/20240101/us-east-1/s3"
            f"/aws4_request, SignedHeaders=host;x-amz-date, Signature={sig}"
        )
        return Planted(K.AUTHORIZATION_HEADER, text, (sig, key_id), ends_line=True)
    if style == 3:
        token = with_digit(rng, chars(rng, B64URL, 42))
        return Planted(K.AUTHORIZATION_HEADER, f"Authorization: SSWS {token}", (token,))
    if style == 4:
        token = with_digit(rng, chars(rng, B64, 60)) + "=="
        return Planted(K.AUTHORIZATION_HEADER, f"Proxy-Authorization: Negotiate {token}", (token,))
    token = with_digit(rng, chars(rng, ALNUM, 32))
    return Planted(K.AUTHORIZATION_HEADER, f'"Authorization": "ApiKey {token}"', (token,))


def bearer_token(rng: random.Random, v: int) -> Planted:
    token = with_digit(rng, chars(rng, B64URL + ".~", rng.randrange(24, 64)))
    token = token.strip(".~")  # a token does not end in sentence punctuation
    if v % 3 == 0:
        return Planted(K.BEARER_TOKEN, f"Authorization: Bearer {token}", (token,))
    if v % 3 == 1:
        return Planted(K.BEARER_TOKEN, f"curl -H 'authorization: bearer {token}' {_HOST}", (token,))
    return Planted(K.BEARER_TOKEN, f"use Bearer {token} for the API", (token,))


_HOST = "https://api.example.com/v1/me"


def basic_auth(rng: random.Random, v: int) -> Planted:
    user = chars(rng, LOWER, rng.randrange(3, 10))
    password = with_digit(rng, chars(rng, ALNUM + "!#%", rng.randrange(10, 20)))
    value = base64.b64encode(f"{user}:{password}".encode()).decode()
    if v % 2:
        return Planted(K.BASIC_AUTH, f"Authorization: Basic {value}", (value.rstrip("="),))
    return Planted(K.BASIC_AUTH, f"the header was Basic {value} today", (value.rstrip("="),))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def jwt(rng: random.Random, v: int) -> Planted:
    header = _b64url(b'{"alg":"HS256","typ":"JWT"}')
    claims = {"sub": str(rng.randrange(10**9)), "name": chars(rng, LOWER, 8), "iat": 1700000000}
    payload = _b64url(json.dumps(claims).encode())
    sig = chars(rng, B64URL, 43)
    if v % 3 == 2:  # JWE: five segments
        extra = chars(rng, B64URL, 22)
        return Planted(K.JWT, f"{header}.{payload}.{extra}.{sig}.{extra[::-1]}", (payload, sig))
    return Planted(K.JWT, f"{header}.{payload}.{sig}", (payload, sig), url_safe=True)


def aws_access_key(rng: random.Random, v: int) -> Planted:
    prefix = ["AKIA", "ASIA", "ABIA", "ACCA"][v % 4]
    key_id = prefix + chars(rng, UPPER_ALNUM, 16)
    return Planted(K.AWS_ACCESS_KEY, key_id, (key_id[4:],), url_safe=True)


def aws_secret_key(rng: random.Random, v: int) -> Planted:
    secret = chars(rng, ALNUM + "/+", 40)
    text = [
        f"aws_secret_access_key = {secret}",
        f"AWS_SECRET_ACCESS_KEY={secret}",
        f'"SecretAccessKey": "{secret}"',
        f"secret_access_key: {secret}",
    ][v % 4]
    return Planted(K.AWS_SECRET_KEY, text, (secret,))


def github_token(rng: random.Random, v: int) -> Planted:
    if v % 6 == 5:
        token = "github" + "_pat_" + chars(rng, ALNUM, 22) + "_" + chars(rng, ALNUM, 59)
        return Planted(K.GITHUB_TOKEN, token, (token[11:],), url_safe=True)
    token = "gh" + "pousr"[v % 5] + "_" + chars(rng, ALNUM, 36)
    return Planted(K.GITHUB_TOKEN, token, (token[4:],), url_safe=True)


def gitlab_token(rng: random.Random, v: int) -> Planted:
    prefix = ["pat", "dt", "rt", "ptt", "ft", "imt", "soat", "cbt", "oas", "agent"][v % 10]
    token = f"gl{prefix}-" + chars(rng, B64URL, 20 + v % 12)
    return Planted(K.GITLAB_TOKEN, token, (token[len(prefix) + 3 :],), url_safe=True)


def slack_token(rng: random.Random, v: int) -> Planted:
    if v % 4 == 3:
        tail = f"1-A{chars(rng, UPPER_ALNUM, 10)}-{rng.randrange(10**12)}-{chars(rng, HEX, 64)}"
        return Planted(K.SLACK_TOKEN, "xa" + "pp-" + tail, (tail[2:],), url_safe=True)
    letter = "bpaosre"[v % 7]
    tail = (
        f"{rng.randrange(10**10, 10**12)}-{rng.randrange(10**12, 10**13)}-{chars(rng, ALNUM, 24)}"
    )
    return Planted(K.SLACK_TOKEN, f"xo{'x'}{letter}-{tail}", (tail,), url_safe=True)


def stripe_key(rng: random.Random, v: int) -> Planted:
    if v % 5 == 4:
        secret = chars(rng, ALNUM + "+/", 32)
        return Planted(K.STRIPE_KEY, "whsec" + "_" + secret, (secret,))
    prefix = ["sk_live_", "sk_test_", "rk_live_", "rk_test_"][v % 4]
    secret = chars(rng, ALNUM, rng.randrange(24, 100))
    return Planted(K.STRIPE_KEY, prefix + secret, (secret,), url_safe=True)


def anthropic_key(rng: random.Random, v: int) -> Planted:
    body = chars(rng, B64URL, 93)
    kind = ["api03", "admin01"][v % 2]
    return Planted(K.ANTHROPIC_KEY, f"sk-ant-{kind}-{body}AA", (body,), url_safe=True)


def openai_key(rng: random.Random, v: int) -> Planted:
    if v % 3 == 0:
        body = with_digit(rng, chars(rng, ALNUM, 48))
        return Planted(K.OPENAI_KEY, "sk" + "-" + body, (body,), url_safe=True)
    project = ["proj", "svcacct", "admin"][v % 3]
    body = with_digit(rng, chars(rng, B64URL, rng.randrange(40, 160)))
    return Planted(K.OPENAI_KEY, f"sk-{project}-{body}", (body,), url_safe=True)


def google_api_key(rng: random.Random, v: int) -> Planted:
    body = chars(rng, B64URL, 35)
    return Planted(K.GOOGLE_API_KEY, "AI" + "za" + body, (body,), url_safe=True)


def google_oauth(rng: random.Random, v: int) -> Planted:
    if v % 2:
        body = chars(rng, B64URL, 28)
        return Planted(K.GOOGLE_OAUTH, "GOCSPX" + "-" + body, (body,), url_safe=True)
    body = chars(rng, B64URL, rng.randrange(60, 200))
    return Planted(K.GOOGLE_OAUTH, "ya29" + "." + body, (body,), url_safe=True)


def npm_token(rng: random.Random, v: int) -> Planted:
    body = chars(rng, ALNUM, 36)
    return Planted(K.NPM_TOKEN, "npm" + "_" + body, (body,), url_safe=True)


def pypi_token(rng: random.Random, v: int) -> Planted:
    body = chars(rng, B64URL, rng.randrange(60, 180))
    return Planted(K.PYPI_TOKEN, "pypi-AgE" + "IcHlwaS5vcmc" + body, (body,), url_safe=True)


def huggingface_token(rng: random.Random, v: int) -> Planted:
    body = chars(rng, ALNUM, 34)
    return Planted(K.HUGGINGFACE_TOKEN, "hf" + "_" + body, (body,), url_safe=True)


def twilio_api_key(rng: random.Random, v: int) -> Planted:
    body = with_digit(rng, chars(rng, HEX, 32))
    return Planted(K.TWILIO_API_KEY, "S" + "K" + body, (body,), url_safe=True)


def sendgrid_key(rng: random.Random, v: int) -> Planted:
    a, b = chars(rng, B64URL, 22), chars(rng, B64URL, 43)
    return Planted(K.SENDGRID_KEY, f"SG.{a}.{b}", (a, b), url_safe=True)


def telegram_bot_token(rng: random.Random, v: int) -> Planted:
    bot = str(rng.randrange(10**7, 10**10))
    secret = "AA" + chars(rng, B64URL, 33)
    if v % 2:
        return Planted(
            K.TELEGRAM_BOT_TOKEN, f"https://api.telegram.org/bot{bot}:{secret}/getMe", (secret[2:],)
        )
    return Planted(K.TELEGRAM_BOT_TOKEN, f"{bot}:{secret}", (secret[2:],), url_safe=True)


def discord_bot_token(rng: random.Random, v: int) -> Planted:
    digits = 17 + v % 3  # snowflake ids: 17 digits (2015-2016 accounts) to 19
    user_id = str(rng.randrange(10 ** (digits - 1), 10**digits))
    first = base64.b64encode(user_id.encode()).decode().rstrip("=")
    middle, last = chars(rng, B64URL, 6), chars(rng, B64URL, 27 + v % 12)
    return Planted(K.DISCORD_BOT_TOKEN, f"{first}.{middle}.{last}", (last,), url_safe=True)


def shopify_token(rng: random.Random, v: int) -> Planted:
    prefix = ["shpat_", "shpca_", "shppa_", "shpss_"][v % 4]
    body = chars(rng, HEX, 32)
    return Planted(K.SHOPIFY_TOKEN, prefix + body, (body,), url_safe=True)


def digitalocean_token(rng: random.Random, v: int) -> Planted:
    prefix = ["dop", "doo", "dor"][v % 3]
    body = chars(rng, HEX, 64)
    return Planted(K.DIGITALOCEAN_TOKEN, f"{prefix}_v1_{body}", (body,), url_safe=True)


def databricks_token(rng: random.Random, v: int) -> Planted:
    body = with_digit(rng, chars(rng, HEX, 32))
    suffix = f"-{v % 10}" if v % 2 else ""
    return Planted(K.DATABRICKS_TOKEN, "da" + "pi" + body + suffix, (body,), url_safe=True)


def age_secret_key(rng: random.Random, v: int) -> Planted:
    body = chars(rng, BECH32, 58)
    return Planted(K.AGE_SECRET_KEY, "AGE-SECRET-" + "KEY-1" + body, (body,), url_safe=True)


_SECRET_NAMES = (
    "password", "DB_PASSWORD", "passwd", "mysql_pwd", "passphrase", "client_secret",
    "SECRET_KEY", "api_key", "X-Api-Key", "apiKey", "access-key", "private_key",
    "auth_key", "credentials", "signature", "account_key", "session_key", "session_secret",
    "SecureSessionId", "cookie", "token", "refresh_token", "spark.ssl.keyStorePassword",
)  # fmt: skip


def secret_assignment(rng: random.Random, v: int) -> Planted:
    name = _SECRET_NAMES[v % len(_SECRET_NAMES)]
    style = (v // len(_SECRET_NAMES)) % 9
    value = _password(rng)
    if style == 0:
        text = f"{name}={value}"
    elif style == 1:
        text = f"{name}: {value}"
    elif style == 2:
        value = value.replace(" ", "")
        text = f'"{name}": "{value}"'
    elif style == 3:
        text = f"{name} => '{value}'"
    elif style == 4:
        text = f"{name} := {value}"
    elif style == 5:
        words = value[: len(value) // 2] + " " + value[len(value) // 2 :]
        text = f'export {name}="{words}"'
        return Planted(K.SECRET_ASSIGNMENT, text, tuple(p for p in words.split(" ") if p))
    elif style == 6:
        text = f"login?user=bob&{name}={value}"
    elif style == 7:
        text = f"Server=db.example.com;User Id=sa;{name}={value};Encrypt=true"
    else:
        text = f"--{name}={value}"
    return Planted(K.SECRET_ASSIGNMENT, text, (value,))


MAKERS: dict[SecretKind, Maker] = {
    K.PRIVATE_KEY: private_key,
    K.URL_CREDENTIALS: url_credentials,
    K.CAPABILITY_URL: capability_url,
    K.SLACK_WEBHOOK: slack_webhook,
    K.DISCORD_WEBHOOK: discord_webhook,
    K.TEAMS_WEBHOOK: teams_webhook,
    K.AUTHORIZATION_HEADER: authorization_header,
    K.BEARER_TOKEN: bearer_token,
    K.BASIC_AUTH: basic_auth,
    K.JWT: jwt,
    K.AWS_ACCESS_KEY: aws_access_key,
    K.AWS_SECRET_KEY: aws_secret_key,
    K.GITHUB_TOKEN: github_token,
    K.GITLAB_TOKEN: gitlab_token,
    K.SLACK_TOKEN: slack_token,
    K.STRIPE_KEY: stripe_key,
    K.ANTHROPIC_KEY: anthropic_key,
    K.OPENAI_KEY: openai_key,
    K.GOOGLE_API_KEY: google_api_key,
    K.GOOGLE_OAUTH: google_oauth,
    K.NPM_TOKEN: npm_token,
    K.PYPI_TOKEN: pypi_token,
    K.HUGGINGFACE_TOKEN: huggingface_token,
    K.TWILIO_API_KEY: twilio_api_key,
    K.SENDGRID_KEY: sendgrid_key,
    K.TELEGRAM_BOT_TOKEN: telegram_bot_token,
    K.DISCORD_BOT_TOKEN: discord_bot_token,
    K.SHOPIFY_TOKEN: shopify_token,
    K.DIGITALOCEAN_TOKEN: digitalocean_token,
    K.DATABRICKS_TOKEN: databricks_token,
    K.AGE_SECRET_KEY: age_secret_key,
    K.SECRET_ASSIGNMENT: secret_assignment,
}

# --- look-alikes: documented non-secrets that must be stored as they are ----------------------

_PLACEHOLDER_FORMS = (
    "password=${DB_PASSWORD}",
    "export API_TOKEN=$API_TOKEN",
    '"token": "${GITHUB_TOKEN}"',
    "secret: {{ vault_secret }}",
    "api_key=<your-api-key>",
    "DB_PASSWORD=${DB_PASSWORD},",
    "password: ********",
    "client_secret: null",
)
_WORDS_FORMS = (
    "please send me a password reset link",
    "the token limit is 8k per request",
    "we watched The Secret Garden",
    "bearer bonds and basic training",
    "Authorization: required for this endpoint",
    "api key rotation is monthly",
    "scikit-learn 1.4 and sk-learn tutorials",
    "the session cookie banner",
)


def lookalike(rng: random.Random, v: int) -> LookAlike:
    style = v % 8
    if style == 0:
        return LookAlike("placeholder", _PLACEHOLDER_FORMS[(v // 8) % len(_PLACEHOLDER_FORMS)])
    if style == 1:
        return LookAlike("git_sha", f"fixed in commit {chars(rng, HEX, 40)} yesterday")
    if style == 2:
        return LookAlike("short_sha", f"see {chars(rng, HEX, 7)} and {chars(rng, HEX, 12)}")
    if style == 3:
        return LookAlike("sha256", f"digest sha256:{chars(rng, HEX, 64)}")
    if style == 4:
        return LookAlike("uuid", f"request id {uuid.UUID(int=rng.getrandbits(128), version=4)}")
    if style == 5:
        return LookAlike("words", _WORDS_FORMS[(v // 8) % len(_WORDS_FORMS)])
    if style == 6:  # publishable keys are not secrets (README)
        return LookAlike("stripe_publishable", "pk_" + "test_" + chars(rng, ALNUM, 24))
    key = "AAAAC3NzaC1lZDI1NTE5AAAAI" + chars(rng, B64, 43)
    return LookAlike("ssh_public_key", f"ssh-ed25519 {key} bob@laptop")


# --- pinned examples ---------------------------------------------------------------------------


def pinned(*parts: tuple[SecretKind, int, int, str] | LookAlike | str, sep: str = " ") -> TurnText:
    """A turn text from explicit parts, for ``@example``: (kind, seed, variant, context) for a
    secret, a LookAlike, or plain text."""
    texts: list[str] = []
    planted: list[Planted] = []
    found: list[LookAlike] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, LookAlike):
            texts.append(part.text)
            found.append(part)
        else:
            kind, seed, variant, context = part
            secret = MAKERS[kind](secret_random(kind.value, seed), variant)
            texts.append(embed(secret_random("context", seed), secret, context))
            planted.append(secret)
    return TurnText(sep.join(texts), tuple(planted), tuple(found))


# --- contexts ----------------------------------------------------------------------------------

PROSE = (
    "so", "I", "tried", "again", "with", "the", "new", "config", "and", "it", "worked",
    "here", "is", "what", "you", "asked", "for", "region", "Ahern", "teleport", "ok",
    "thanks", "later", "meeting", "at", "noon", "ünïcode", "café", "日本語", "🙂",
)  # fmt: skip
CONTEXTS = ("prose", "python", "shell", "json", "url", "md_fence", "md_inline", "md_quote")


def prose(rng: random.Random, lo: int = 2, hi: int = 9) -> str:
    return " ".join(rng.choice(PROSE) for _ in range(rng.randrange(lo, hi)))


def embed(rng: random.Random, planted: Planted, context: str) -> str:
    """``planted.text`` inside one realistic context (the secret itself is unchanged)."""
    text = planted.text
    if context == "python":
        if planted.multiline:
            return f'KEY = """{text}"""'
        return f"value = {json.dumps(text, ensure_ascii=False)}  # from the vault"
    if context == "shell":
        if planted.multiline:
            return f"cat > key.pem <<'EOF'\n{text}\nEOF"
        return f"$ {text}"
    if context == "json":
        doc = {"event": "deploy", "detail": text, "n": rng.randrange(100)}
        return json.dumps(doc, ensure_ascii=bool(rng.randrange(2)))
    if context == "url" and planted.url_safe:
        return f"https://api.example.com/v1/items?page=2&q={text}"
    if context == "md_fence":
        return f"```\n{text}\n```"
    if context == "md_inline" and not planted.multiline:
        return f"`{text}`"
    if context == "md_quote":
        return "\n".join("> " + line for line in text.split("\n"))
    return f"{prose(rng)}: {text}"


SEPARATORS = (" ", "\n", "\n\n", ". ", ", ", " | ", "; ", " (see) ")


@st.composite
def planted_secrets(draw: st.DrawFn, kinds: tuple[SecretKind, ...] = tuple(MAKERS)) -> Planted:
    kind = draw(st.sampled_from(kinds))
    rng = secret_random(kind.value, draw(st.integers(0, 2**32 - 1)))
    return MAKERS[kind](rng, draw(st.integers(0, 1000)))


@st.composite
def lookalikes(draw: st.DrawFn) -> LookAlike:
    rng = secret_random("lookalike", draw(st.integers(0, 2**32 - 1)))
    return lookalike(rng, draw(st.integers(0, 1000)))


@st.composite
def segments(draw: st.DrawFn, kinds: tuple[SecretKind, ...] = tuple(MAKERS)) -> Segment:
    what = draw(st.sampled_from(("secret", "secret", "lookalike", "prose")))
    rng = secret_random("context", draw(st.integers(0, 2**32 - 1)))
    if what == "secret":
        planted = draw(planted_secrets(kinds))
        context = draw(st.sampled_from(CONTEXTS))
        text = embed(rng, planted, context)
        # A context that closes the text ends the key's paragraph itself (```, ", EOF).
        open_end = context in ("prose", "url", "md_inline", "md_quote")
        return Segment(
            text,
            planted=planted,
            ends_paragraph=planted.ends_paragraph and open_end,
            ends_line=planted.ends_line and context not in ("json", "python"),
        )
    if what == "lookalike":
        found = draw(lookalikes())
        return Segment(found.text, lookalike=found)
    return Segment(prose(rng))


@st.composite
def turn_texts(
    draw: st.DrawFn, max_segments: int = 4, kinds: tuple[SecretKind, ...] = tuple(MAKERS)
) -> TurnText:
    """A turn's text: secrets (before and after each other), look-alikes and prose."""
    parts = draw(st.lists(segments(kinds), min_size=1, max_size=max_segments))
    out: list[str] = []
    for i, part in enumerate(parts):
        out.append(part.text)
        if i + 1 < len(parts):
            if part.ends_paragraph:
                out.append("\n\n")
            elif part.ends_line:
                out.append("\n")
            else:
                out.append(draw(st.sampled_from(SEPARATORS)))
    return TurnText(
        "".join(out),
        tuple(p.planted for p in parts if p.planted is not None),
        tuple(p.lookalike for p in parts if p.lookalike is not None),
    )
