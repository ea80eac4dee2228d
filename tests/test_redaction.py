"""Redaction and UTF-8 bounding (memtier.redaction): pure unit tests, no Redis.

Every fake secret below is assembled from pieces so no file in the repository holds a
string that secret scanners would flag; none of them is a real credential.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memtier.errors import ErrorCode, ValidationError
from memtier.redaction import (
    FALLBACK_TEXT,
    SanitizedText,
    SecretKind,
    bound_utf8,
    bounding,
    contains_secret,
    core,
    json_contains_secret,
    normalize_controls,
    placeholder,
    redact,
    redact_json,
    redact_text,
    sanitize,
    served_text,
)
from memtier.redaction.core import redact_text_remembered

ALNUM = "aB3dE5gH7jK9mN1pQ2rS4tU6vW8xY0zC"  # 32 characters, mixed case with digits
HEX = "0a1b2c3d4e5f6789"
UUID = "1d2c3b4a-5e6f-4a0b-9c8d-7e6f5a4b3c2d"


def fake(n: int, alphabet: str = ALNUM) -> str:
    return (alphabet * (n // len(alphabet) + 1))[:n]


def P(kind: SecretKind) -> str:
    return placeholder(kind)


K = SecretKind

# --- fake secrets ------------------------------------------------------------------------------
GH = "gh" + "p_" + fake(36)
GH_PAT = "github" + "_pat_" + fake(22) + "_" + fake(59)
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkZha2UifQ"
    ".c2lnbmF0dXJlLW5vdC1yZWFsLTAxMjM0NTY3ODk"
)
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"  # the example key id from the AWS documentation
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"  # idem
DISCORD_ID = base64.b64encode(b"123456789012345678").decode().rstrip("=")
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7" + "\n" + fake(64)


class Case(NamedTuple):
    kind: SecretKind
    text: str
    expected: str  # the exact redacted text
    secret: str  # a part of the secret that must not survive


POSITIVE: list[Case] = [
    # private keys
    Case(
        K.PRIVATE_KEY,
        f"key:\n-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\n-----END PRIVATE KEY-----\nbye",
        f"key:\n{P(K.PRIVATE_KEY)}\nbye",
        "MIIEvQIBADAN",
    ),
    Case(
        K.PRIVATE_KEY,
        "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,0A1B2C\n\n"
        f"{PEM_BODY}\n-----END RSA PRIVATE KEY-----",
        P(K.PRIVATE_KEY),
        "MIIEvQIBADAN",
    ),
    Case(
        K.PRIVATE_KEY,
        f"-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: GnuPG v2.0\n\n{PEM_BODY}\n=aBcD\n"
        "-----END PGP PRIVATE KEY BLOCK-----",
        P(K.PRIVATE_KEY),
        "MIIEvQIBADAN",
    ),
    Case(  # JSON-escaped, as in a cloud service-account file
        K.PRIVATE_KEY,
        '{"k": "-----BEGIN OPENSSH PRIVATE KEY-----\\n' + fake(70) + "\\n"
        '-----END OPENSSH PRIVATE KEY-----", "n": 1}',
        '{"k": "' + P(K.PRIVATE_KEY) + '", "n": 1}',
        fake(70),
    ),
    Case(  # truncated paste without an END line: fail closed
        K.PRIVATE_KEY,
        f"-----BEGIN EC PRIVATE KEY-----\n{PEM_BODY}",
        P(K.PRIVATE_KEY),
        "MIIEvQIBADAN",
    ),
    # URLs
    Case(
        K.URL_CREDENTIALS,
        "db at postgres://admin:s3cr3t@db.example.com:5432/app now",
        f"db at postgres://{P(K.URL_CREDENTIALS)}@db.example.com:5432/app now",
        "s3cr3t",
    ),
    Case(
        K.URL_CREDENTIALS,
        f"git clone https://{GH}@github.com/org/repo.git",
        f"git clone https://{P(K.URL_CREDENTIALS)}@github.com/org/repo.git",
        GH,
    ),
    Case(
        K.URL_CREDENTIALS,
        "redis://:p4ssw0rd@127.0.0.1:6379/0",
        f"redis://{P(K.URL_CREDENTIALS)}@127.0.0.1:6379/0",
        "p4ssw0rd",
    ),
    Case(  # Second Life seed capability
        K.CAPABILITY_URL,
        f"seed: https://sim10.agni.example.org:12043/cap/{UUID} ok",
        f"seed: https://sim10.agni.example.org:12043/{P(K.CAPABILITY_URL)} ok",
        UUID,
    ),
    Case(  # OpenSim caps, with a sentence full stop kept
        K.CAPABILITY_URL,
        f"see http://grid.example.org:9000/CAPS/{UUID}0000/.",
        f"see http://grid.example.org:9000/{P(K.CAPABILITY_URL)}.",
        UUID,
    ),
    Case(
        K.CAPABILITY_URL,
        f"http://sim.example.org:9000/CAPS/EQG/{UUID}/",
        f"http://sim.example.org:9000/{P(K.CAPABILITY_URL)}",
        UUID,
    ),
    Case(  # pre-signed S3
        K.CAPABILITY_URL,
        "https://bucket.s3.amazonaws.com/a.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        f"&X-Amz-Credential=AKIAEXAMPLE%2F20240101&X-Amz-Signature={fake(64, HEX)}",
        f"https://bucket.s3.amazonaws.com/{P(K.CAPABILITY_URL)}",
        fake(64, HEX),
    ),
    Case(  # signed GCS
        K.CAPABILITY_URL,
        f"(https://storage.googleapis.com/b/o?X-Goog-Signature={fake(40, HEX)})",
        f"(https://storage.googleapis.com/{P(K.CAPABILITY_URL)})",
        fake(40, HEX),
    ),
    Case(  # Azure SAS
        K.CAPABILITY_URL,
        "https://acct.blob.core.windows.net/c/b.bin?sv=2022-11-02&se=2030-01-01&sig=AbCd%2B12%3D",
        f"https://acct.blob.core.windows.net/{P(K.CAPABILITY_URL)}",
        "AbCd%2B12",
    ),
    Case(  # OAuth implicit flow fragment
        K.CAPABILITY_URL,
        f"https://app.example.com/cb#access_token={fake(30)}&token_type=bearer",
        f"https://app.example.com/{P(K.CAPABILITY_URL)}",
        fake(30),
    ),
    Case(
        K.CAPABILITY_URL,
        f"https://api.example.com/v1/data?format=json&api_key={fake(24)}",
        f"https://api.example.com/{P(K.CAPABILITY_URL)}",
        fake(24),
    ),
    Case(
        K.SLACK_WEBHOOK,
        "post to https://hooks.slack.com/services/T0000EXMPL/B0000EXMPL/" + fake(24),
        f"post to https://hooks.slack.com/{P(K.SLACK_WEBHOOK)}",
        fake(24),
    ),
    Case(
        K.DISCORD_WEBHOOK,
        "https://discord.com/api/webhooks/123456789012345678/" + fake(68),
        f"https://discord.com/{P(K.DISCORD_WEBHOOK)}",
        fake(68),
    ),
    Case(
        K.TEAMS_WEBHOOK,
        f"https://contoso.webhook.office.com/webhookb2/{UUID}@{UUID}/IncomingWebhook/"
        f"{fake(32, HEX)}/{UUID}",
        f"https://contoso.webhook.office.com/{P(K.TEAMS_WEBHOOK)}",
        fake(32, HEX),
    ),
    # authorization values
    Case(
        K.AUTHORIZATION_HEADER,
        f"Authorization: token {GH}",
        f"Authorization: token {P(K.AUTHORIZATION_HEADER)}",
        GH,
    ),
    Case(
        K.AUTHORIZATION_HEADER,
        'Authorization: Digest username="bob", realm="x", response="' + fake(32, HEX) + '"',
        f"Authorization: Digest {P(K.AUTHORIZATION_HEADER)}",
        fake(32, HEX),
    ),
    Case(
        K.AUTHORIZATION_HEADER,
        f"Proxy-Authorization: {fake(24)}",
        f"Proxy-Authorization: {P(K.AUTHORIZATION_HEADER)}",
        fake(24),
    ),
    Case(
        K.BEARER_TOKEN,
        "curl -H 'Authorization: Bearer abc123.def456-ghi' https://api.example.com",
        f"curl -H 'Authorization: Bearer {P(K.BEARER_TOKEN)}' https://api.example.com",
        "abc123.def456",
    ),
    Case(
        K.BEARER_TOKEN,
        "use bearer 9f8e7d6c5b4a3f2e1d0c now.",
        f"use bearer {P(K.BEARER_TOKEN)} now.",
        "9f8e7d6c5b4a",
    ),
    Case(
        K.BEARER_TOKEN,
        "the header was Bearer 9f8e7d6c5b4a3f.",
        f"the header was Bearer {P(K.BEARER_TOKEN)}.",
        "9f8e7d6c5b4a",
    ),
    Case(
        K.BASIC_AUTH,
        '{"Authorization": "Basic dXNlcjpwYXNzd29yZA=="}',
        '{"Authorization": "Basic ' + P(K.BASIC_AUTH) + '"}',
        "dXNlcjpwYXNzd29yZA",
    ),
    Case(
        K.BASIC_AUTH,
        "send Basic dXNlcjpwYXNz along",
        f"send Basic {P(K.BASIC_AUTH)} along",
        "dXNlcjpwYXNz",
    ),
    # token formats
    Case(K.JWT, f"id token {JWT} end", f"id token {P(K.JWT)} end", JWT[40:70]),
    Case(K.AWS_ACCESS_KEY, f"key id {AWS_ID}.", f"key id {P(K.AWS_ACCESS_KEY)}.", AWS_ID),
    Case(
        K.AWS_SECRET_KEY,
        f"aws_secret_access_key = {AWS_SECRET}",
        f"aws_secret_access_key = {P(K.AWS_SECRET_KEY)}",
        AWS_SECRET,
    ),
    Case(
        K.AWS_SECRET_KEY,
        f'{{"SecretAccessKey": "{AWS_SECRET}"}}',
        f'{{"SecretAccessKey": "{P(K.AWS_SECRET_KEY)}"}}',
        AWS_SECRET,
    ),
    Case(K.GITHUB_TOKEN, f"GITHUB_TOKEN={GH}", f"GITHUB_TOKEN={P(K.GITHUB_TOKEN)}", GH),
    Case(K.GITHUB_TOKEN, f"pat {GH_PAT} x", f"pat {P(K.GITHUB_TOKEN)} x", GH_PAT),
    Case(
        K.GITLAB_TOKEN,
        "glpat-" + fake(20) + " is mine",
        f"{P(K.GITLAB_TOKEN)} is mine",
        "glpat-" + fake(20),
    ),
    Case(
        K.SLACK_TOKEN,
        "xox" + "b-123456789012-1234567890123-" + fake(24),
        P(K.SLACK_TOKEN),
        fake(24),
    ),
    Case(K.STRIPE_KEY, "sk_" + "live_" + fake(24), P(K.STRIPE_KEY), fake(24)),
    Case(K.STRIPE_KEY, "whsec_" + fake(32), P(K.STRIPE_KEY), fake(32)),
    Case(K.ANTHROPIC_KEY, "sk-" + "ant-api03-" + fake(40), P(K.ANTHROPIC_KEY), fake(40)),
    Case(K.OPENAI_KEY, "key sk-" + "proj-" + fake(40), f"key {P(K.OPENAI_KEY)}", fake(40)),
    Case(K.GOOGLE_API_KEY, "AI" + "za" + fake(35), P(K.GOOGLE_API_KEY), fake(35)),
    Case(K.GOOGLE_OAUTH, "ya29." + fake(60), P(K.GOOGLE_OAUTH), fake(60)),
    Case(K.GOOGLE_OAUTH, "GOCSPX-" + fake(28), P(K.GOOGLE_OAUTH), fake(28)),
    Case(K.NPM_TOKEN, "//registry/:_authToken npm_" + fake(36), "", fake(36)),
    Case(
        K.PYPI_TOKEN,
        "pypi-" + "AgEIcHlwaS5vcmc" + fake(60),
        P(K.PYPI_TOKEN),
        fake(60),
    ),
    Case(K.HUGGINGFACE_TOKEN, "hf_" + fake(34), P(K.HUGGINGFACE_TOKEN), fake(34)),
    Case(K.TWILIO_API_KEY, "SK" + fake(32, HEX), P(K.TWILIO_API_KEY), fake(32, HEX)),
    Case(
        K.SENDGRID_KEY,
        "SG." + fake(22) + "." + fake(43),
        P(K.SENDGRID_KEY),
        fake(43),
    ),
    Case(
        K.TELEGRAM_BOT_TOKEN,
        "https://api.telegram.org/bot123456789:AA" + fake(33) + "/getMe",
        f"https://api.telegram.org/bot123456789:{P(K.TELEGRAM_BOT_TOKEN)}/getMe",
        fake(33),
    ),
    Case(
        K.TELEGRAM_BOT_TOKEN,
        "TOKEN 1234567890:AA" + fake(33),
        f"TOKEN 1234567890:{P(K.TELEGRAM_BOT_TOKEN)}",
        fake(33),
    ),
    Case(
        K.DISCORD_BOT_TOKEN,
        f"bot {DISCORD_ID}.GaBc12.{fake(38)}",
        f"bot {P(K.DISCORD_BOT_TOKEN)}",
        fake(38),
    ),
    Case(K.SHOPIFY_TOKEN, "shpat_" + fake(32, HEX), P(K.SHOPIFY_TOKEN), fake(32, HEX)),
    Case(K.DIGITALOCEAN_TOKEN, "dop_v1_" + fake(64, HEX), P(K.DIGITALOCEAN_TOKEN), fake(64, HEX)),
    Case(K.DATABRICKS_TOKEN, "dapi" + fake(32, HEX), P(K.DATABRICKS_TOKEN), fake(32, HEX)),
    Case(
        K.AGE_SECRET_KEY,
        "AGE-SECRET-KEY-1" + fake(58, "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"),
        P(K.AGE_SECRET_KEY),
        fake(58, "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"),
    ),
    # generic name=value assignments
    Case(  # a bare value runs to the end of its token: the later parameters go too
        K.SECRET_ASSIGNMENT,
        "login?user=bob&password=hunter2&lang=en",
        f"login?user=bob&password={P(K.SECRET_ASSIGNMENT)}",
        "hunter2",
    ),
    Case(
        K.SECRET_ASSIGNMENT,
        '{"api_key": "abc", "max_tokens": 100, "token_count": 5}',
        '{"api_key": "' + P(K.SECRET_ASSIGNMENT) + '", "max_tokens": 100, "token_count": 5}',
        '"abc"',
    ),
    Case(
        K.SECRET_ASSIGNMENT,
        "export DB_PASSWORD='p@ss w0rd'",
        f"export DB_PASSWORD='{P(K.SECRET_ASSIGNMENT)}'",
        "p@ss w0rd",
    ),
    Case(
        K.SECRET_ASSIGNMENT,
        "password: hunter2",
        f"password: {P(K.SECRET_ASSIGNMENT)}",
        "hunter2",
    ),
    Case(
        K.SECRET_ASSIGNMENT,
        "X-Api-Key: 0123456789abcdef",
        f"X-Api-Key: {P(K.SECRET_ASSIGNMENT)}",
        "0123456789abcdef",
    ),
    Case(
        K.SECRET_ASSIGNMENT,
        "Server=db;User Id=sa;Password=Pa55w0rd; Timeout=5",
        f"Server=db;User Id=sa;Password={P(K.SECRET_ASSIGNMENT)} Timeout=5",
        "Pa55w0rd",
    ),
    Case(
        K.SECRET_ASSIGNMENT,
        f"SecureSessionID={UUID}",
        f"SecureSessionID={P(K.SECRET_ASSIGNMENT)}",
        UUID,
    ),
    Case(
        K.SECRET_ASSIGNMENT,
        "client_secret => 'shh-its-a-secret'",
        f"client_secret => '{P(K.SECRET_ASSIGNMENT)}'",
        "shh-its",
    ),
    Case(  # SAS token without its URL
        K.SECRET_ASSIGNMENT,
        "?sv=2022-11-02&ss=b&sig=AbCd%2B12%3D",
        f"?sv=2022-11-02&ss=b&sig={P(K.SECRET_ASSIGNMENT)}",
        "AbCd%2B12",
    ),
]
# The npm case shows that an npm token after a name is still redacted by its format.
POSITIVE = [
    c._replace(expected=f"//registry/:_authToken {P(K.NPM_TOKEN)}") if c.kind is K.NPM_TOKEN else c
    for c in POSITIVE
]

NEGATIVE: list[tuple[SecretKind, str]] = [
    (K.PRIVATE_KEY, "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0B\n-----END PUBLIC KEY-----"),
    (K.PRIVATE_KEY, "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIE\n-----END CERTIFICATE-----"),
    (K.PRIVATE_KEY, "keep your private key in a safe place"),
    (K.URL_CREDENTIALS, "ssh://git@github.com/org/repo.git"),
    (K.URL_CREDENTIALS, "mail john@example.com or see https://example.com/a@b"),
    (K.CAPABILITY_URL, f"https://example.com/users/{UUID}?page=2."),
    (K.CAPABILITY_URL, "https://example.com/search?q=token+limits&sort=asc"),
    (K.CAPABILITY_URL, "https://example.com/docs/cap/intro and /CAPS/ without an id"),
    (K.CAPABILITY_URL, "https://example.com/?token=&key="),
    (K.CAPABILITY_URL, f"the region uuid is {UUID}"),
    (K.SLACK_WEBHOOK, "https://slack.com/services/overview and https://hooks.slack.com/"),
    (K.DISCORD_WEBHOOK, "https://discord.com/api/v10/channels/123456789012345678/messages"),
    (K.TEAMS_WEBHOOK, "https://outlook.office.com/mail/inbox"),
    (K.AUTHORIZATION_HEADER, "Authorization: required for all users"),
    (K.AUTHORIZATION_HEADER, "Authorization: Bearer\nnext line"),
    (K.BEARER_TOKEN, "the bearer of bad news; Bearer bonds are tradable"),
    (K.BASIC_AUTH, "basic training, Basic QUJDREVGR0g= (no colon inside)"),
    (K.JWT, "header eyJhbGciOiJIUzI1NiJ9 alone, version 1.2.3"),
    (K.AWS_ACCESS_KEY, AWS_ID + "X and ASIA-PACIFIC"),
    (K.AWS_SECRET_KEY, f"a bare 40-char string {AWS_SECRET} without a name"),
    (K.GITHUB_TOKEN, "ghp_short123 and commit 2ee9968e1d5ec6f83b2ac244e454d0a9965c4450"),
    (K.GITLAB_TOKEN, "glpat-short and gitlab.com"),
    (K.SLACK_TOKEN, "xoxb-abcdefghijklmn and xoxo hugs"),
    (K.STRIPE_KEY, "pk_live_" + fake(24) + " is publishable"),
    (K.ANTHROPIC_KEY, "sk-ant-short"),
    (K.OPENAI_KEY, "sk-learn and sk-this-is-not-a-real-key-at-all"),
    (K.GOOGLE_API_KEY, "AIza" + fake(20)),
    (K.GOOGLE_OAUTH, "ya29.short and GOCSPX-short"),
    (K.NPM_TOKEN, "npm_config_cache=/tmp/npm"),
    (K.PYPI_TOKEN, "pypi-simple index"),
    (K.HUGGINGFACE_TOKEN, "hf_hub_download()"),
    (K.TWILIO_API_KEY, "SK" + fake(30, HEX)),
    (K.SENDGRID_KEY, "SG.example.com"),
    (K.TELEGRAM_BOT_TOKEN, "at 10:AAM" + fake(33) + " and x123456789:AA" + fake(33)),
    (K.DISCORD_BOT_TOKEN, "Mississippiriverboatsxyz.abcdef." + fake(30)),
    (K.SHOPIFY_TOKEN, "shpat_" + fake(16, HEX)),
    (K.DIGITALOCEAN_TOKEN, "dop_v1_" + fake(10, HEX)),
    (K.DATABRICKS_TOKEN, "dapi" + "a" * 32),
    (K.AGE_SECRET_KEY, "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p (public)"),
    (K.SECRET_ASSIGNMENT, "max_tokens=100 token_count: 5 tokenizer=gpt2"),
    (K.SECRET_ASSIGNMENT, "Token: the unit of text. Secret: everything is fine"),
    (K.SECRET_ASSIGNMENT, "PWD=/home/user and if token == other: pass"),
    (K.SECRET_ASSIGNMENT, '{"password": null, "token": "${TOKEN}", "secret": "***"}'),
    (K.SECRET_ASSIGNMENT, "the password is long and the token limit is 8k"),
]


def _case_id(case: Case) -> str:
    return case.kind.value


def test_every_kind_has_a_positive_and_a_negative_case() -> None:
    assert {c.kind for c in POSITIVE} == set(SecretKind)
    assert {kind for kind, _ in NEGATIVE} == set(SecretKind)


@pytest.mark.parametrize("case", POSITIVE, ids=_case_id)
def test_pattern_redacts_its_example(case: Case) -> None:
    result = redact(case.text)
    assert result.text == case.expected
    assert case.kind in result.kinds
    assert case.secret not in result.text
    assert contains_secret(case.text)
    assert not contains_secret(result.text)
    assert redact(result.text) == (result.text, ())


@pytest.mark.parametrize(("kind", "text"), NEGATIVE, ids=[k.value for k, _ in NEGATIVE])
def test_near_miss_is_left_alone(kind: SecretKind, text: str) -> None:
    result = redact(text)
    assert result.text == text
    assert result.kinds == ()
    assert not contains_secret(text)


def test_ordinary_chat_is_unchanged() -> None:
    text = (
        "Hi Mira! The sim restarts at 10:30 SLT; meet me at the sandbox (128, 64, 22).\n"
        "Token economy: 1 L$ = 1 token. The key to the vault is on my desk. Basic rules apply.\n"
        f"My avatar UUID is {UUID}. See https://wiki.example.org/Linden_Lab?action=view#top."
    )
    assert redact(text) == (text, ())


def test_result_unpacks_as_text_and_kinds() -> None:
    text, kinds = redact(f"a {GH} b {JWT}")
    assert text == f"a {P(K.GITHUB_TOKEN)} b {P(K.JWT)}"
    assert kinds == (K.JWT, K.GITHUB_TOKEN)  # SecretKind declaration order, unique
    assert redact_text(f"a {GH}") == f"a {P(K.GITHUB_TOKEN)}"


def test_url_with_credentials_and_capability_reports_both() -> None:
    result = redact(f"https://u:pw@sim.example.org:12043/cap/{UUID}")
    assert result.text == (
        f"https://{P(K.URL_CREDENTIALS)}@sim.example.org:12043/{P(K.CAPABILITY_URL)}"
    )
    assert result.kinds == (K.URL_CREDENTIALS, K.CAPABILITY_URL)


@pytest.mark.parametrize("kind", list(SecretKind), ids=[k.value for k in SecretKind])
def test_placeholders_never_match(kind: SecretKind) -> None:
    ph = placeholder(kind)
    for text in (
        ph,
        f"password={ph}",
        f'"token": "{ph}"',
        f"Authorization: Bearer {ph}",
        f"Authorization: {ph}",
        f"https://{ph}@host.example/{ph}",
        f"x-api-key: {ph}",
    ):
        assert not contains_secret(text), text
        assert redact(text) == (text, ())


# --- control characters ------------------------------------------------------------------------


def test_control_characters_are_removed_except_tab_newline_cr() -> None:
    assert normalize_controls("a\x00b\x1bc\x7fd\x85e\tf\ng\rh\u200bi") == "abcde\tf\ng\rh\u200bi"
    assert redact("a\x00b\x07c") == ("abc", ())


def test_a_control_character_cannot_hide_a_token() -> None:
    hidden = GH[:3] + "\x00" + GH[3:]
    assert contains_secret(hidden)
    assert redact(hidden) == (P(K.GITHUB_TOKEN), (K.GITHUB_TOKEN,))


# --- properties --------------------------------------------------------------------------------

SECRETS = [c.text for c in POSITIVE]
FILLER_ALPHABET = st.characters(
    codec="utf-8",
    categories=("L", "N", "P", "S", "Zs"),
    include_characters="\n\t=:/?&@#\"'-_.[]",
)
FILLER = st.text(FILLER_ALPHABET, max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(FILLER, st.sampled_from(range(len(POSITIVE)))), min_size=1, max_size=6))
def test_redaction_of_embedded_secrets_is_idempotent(parts: list[tuple[str, int]]) -> None:
    text = " ".join(f"{filler} {POSITIVE[i].text} " for filler, i in parts)
    once = redact(text)
    assert redact(once.text) == (once.text, ())
    assert not contains_secret(once.text)
    _, counts = core.redact_once(once.text)  # a single pass is already a fixpoint
    assert counts == {}
    for _, i in parts:
        assert POSITIVE[i].secret not in once.text


SECRETISH = st.text(
    st.sampled_from(list("aAeyJ0123456789:/.@?&=#_-+ \n\"'[]{}")) | FILLER_ALPHABET, max_size=200
) | st.builds(
    lambda a, b, c: a + b + c,
    FILLER,
    st.sampled_from(SECRETS + [placeholder(k) for k in K]),
    FILLER,
)


@settings(max_examples=400, deadline=None)
@given(SECRETISH)
def test_redaction_of_arbitrary_text_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once.text) == (once.text, ())
    assert not contains_secret(once.text)
    assert redact(text) == once  # deterministic


# --- bound_utf8 --------------------------------------------------------------------------------

BOUND_SAMPLES = {
    "ascii": "hello world",
    "latin": "é" * 5 + "x",
    "cjk": "日本語のテキスト",
    "emoji_zwj": "👩‍💻" * 3,  # woman + ZWJ + laptop
    "combining": "e\u0301" * 4,  # e + combining acute
    "flags": "🇯🇵🇺🇸🇫🇷",
    "skin_tone": "👍🏽👍🏿",
    "keycap": "1️⃣2️⃣",
    "mixed": "aé日👩‍💻e\u0301🇯🇵z",
}


@pytest.mark.parametrize("text", BOUND_SAMPLES.values(), ids=BOUND_SAMPLES.keys())
def test_bound_utf8_at_every_cut_offset(text: str) -> None:
    size = len(text.encode("utf-8"))
    previous = ""
    for max_bytes in range(size + 2):
        out, truncated = bound_utf8(text, max_bytes)
        encoded = out.encode("utf-8")
        assert len(encoded) <= max_bytes
        assert encoded.decode("utf-8") == out
        assert text.startswith(out)
        assert truncated == (size > max_bytes)
        assert out.startswith(previous)  # monotonic in max_bytes
        previous = out
        # never a dangling part of a grapheme cluster
        assert not bounding.splits_cluster(text, len(out))
    assert bound_utf8(text, size) == (text, False)


def test_bound_utf8_keeps_clusters_whole() -> None:
    assert bound_utf8("e\u0301" * 4, 5) == ("e\u0301", True)  # 3 bytes per pair
    assert bound_utf8("👩‍💻👩‍💻", 12) == ("👩‍💻", True)  # 11 bytes per sequence
    assert bound_utf8("👩‍💻", 10) == ("", True)
    assert bound_utf8("🇯🇵🇺🇸", 12) == ("🇯🇵", True)  # 4 bytes per regional indicator
    assert bound_utf8("日本", 5) == ("日", True)


def test_bound_utf8_falls_back_to_code_points_for_very_long_clusters() -> None:
    zalgo = "e" + "\u0301" * 200
    out, truncated = bound_utf8(zalgo, 101)
    assert truncated
    assert out == "e" + "\u0301" * 50


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=60), st.integers(0, 260))
def test_bound_utf8_property(text: str, max_bytes: int) -> None:
    out, truncated = bound_utf8(text, max_bytes)
    size = len(text.encode("utf-8"))
    assert truncated == (size > max_bytes)
    assert len(out.encode("utf-8")) <= max_bytes
    assert text.startswith(out)
    if not truncated:
        assert out == text
    else:  # at most one cluster (bounded look-back of 32 code points) is given up
        assert len(out.encode("utf-8")) >= max_bytes - 4 * 33


def test_lone_surrogates_are_rejected() -> None:
    for call in (lambda: bound_utf8("a\ud800b", 10), lambda: sanitize("a\udfffb", 10)):
        with pytest.raises(ValidationError) as info:
            call()
        assert info.value.code == ErrorCode.INVALID_INPUT


def test_negative_max_bytes_is_rejected() -> None:
    with pytest.raises(ValidationError):
        bound_utf8("abc", -1)
    with pytest.raises(ValidationError):
        sanitize("abc", -1)


# --- sanitize: redact, then bound --------------------------------------------------------------


def test_sanitize_redacts_before_bounding() -> None:
    # Cutting first would keep "ghp_" + 5 characters: too short to match, half a secret stored.
    text = "x" * 90 + " " + GH
    result = sanitize(text, 100)
    assert isinstance(result, SanitizedText)
    assert result.text == "x" * 90 + " " + P(K.GITHUB_TOKEN)[:9]
    assert GH[:6] not in result.text
    assert result.kinds == (K.GITHUB_TOKEN,)
    assert result.truncated
    assert result.byte_length == len(result.text.encode("utf-8")) == 100
    assert result.redacted


def test_sanitize_re_redacts_when_the_cut_creates_a_match() -> None:
    text = "AKIA" + "B" * 17  # 21 characters: not an access key id (exactly 20 are)
    assert not contains_secret(text)
    result = sanitize(text, 20)  # the plain cut would be "AKIA" + 16: an access key id
    assert not contains_secret(result.text)
    assert result.text == P(K.AWS_ACCESS_KEY)[:20]
    assert result.kinds == (K.AWS_ACCESS_KEY,)
    assert result.truncated


def test_sanitize_untouched_text() -> None:
    result = sanitize("hello\x00 world", 100)
    assert result == SanitizedText("hello world", 11, (), False)
    assert not result.redacted


def test_sanitize_fails_closed_when_rounds_do_not_converge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(core, "contains_secret", lambda text: True)
    result = sanitize("y" * 50, 20)
    assert result.text == FALLBACK_TEXT
    assert result.truncated


@settings(max_examples=200, deadline=None)
@given(SECRETISH, st.integers(0, 300))
def test_sanitize_property(text: str, max_bytes: int) -> None:
    result = sanitize(text, max_bytes)
    assert len(result.text.encode("utf-8")) == result.byte_length <= max_bytes
    assert not contains_secret(result.text)


# --- redact_json (threads events and exports) --------------------------------------------------


def test_redact_json_redacts_strings_and_sensitive_keys() -> None:
    value = {
        "type": "tool_call",
        "args": {"url": "https://u:pw@example.com/x", "password": "hunter2", "limit": 5},
        "headers": [{"Authorization": f"Bearer {GH}"}, {"sessionToken": "opaque"}],
        "note": f"token {JWT}",
        "max_tokens": 100,
        "ok": True,
        "none": None,
        GH: "a key that is a secret",
    }
    out, kinds = redact_json(value)
    assert out == {
        "type": "tool_call",
        "args": {
            "url": f"https://{P(K.URL_CREDENTIALS)}@example.com/x",
            "password": P(K.SECRET_ASSIGNMENT),
            "limit": 5,
        },
        "headers": [
            {"Authorization": f"Bearer {P(K.BEARER_TOKEN)}"},
            {"sessionToken": P(K.SECRET_ASSIGNMENT)},
        ],
        "note": f"token {P(K.JWT)}",
        "max_tokens": 100,
        "ok": True,
        "none": None,
        P(K.GITHUB_TOKEN): "a key that is a secret",
    }
    assert set(kinds) == {
        K.URL_CREDENTIALS,
        K.SECRET_ASSIGNMENT,
        K.BEARER_TOKEN,
        K.JWT,
        K.GITHUB_TOKEN,
    }
    assert json_contains_secret(value)
    assert not json_contains_secret(out)
    assert redact_json(out) == (out, ())


def test_redact_json_rejects_non_json_and_deep_nesting() -> None:
    with pytest.raises(ValidationError):
        redact_json({"a": object()})
    with pytest.raises(ValidationError):
        redact_json({1: "x"})
    deep: object = "leaf"
    for _ in range(70):
        deep = [deep]
    with pytest.raises(ValidationError):
        redact_json(deep)
    assert redact_json(deep, max_depth=80)[0] == deep


# The clean-key memo (core._CLEAN_KEYS): object keys redact() left unchanged are not
# redacted again.  It must change nothing: the same output and kinds with it cold and warm,
# no key a detector changes ever in it, its bound, and the depth limit as before.
JSON_KEYS = st.sampled_from(["content", "entryId", "text", "password", "api_key"]) | SECRETISH
JSON_VALUES = st.recursive(
    st.none() | st.integers() | SECRETISH,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(JSON_KEYS, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(JSON_KEYS, JSON_VALUES, max_size=5))
def test_redact_json_is_the_same_with_the_clean_key_memo_cold_and_warm(value: object) -> None:
    core._CLEAN_KEYS.clear()
    cold = redact_json(value)
    warm = redact_json(value)  # every clean key of value is in the memo now
    assert warm == cold
    for key in core._CLEAN_KEYS:
        assert redact(key) == (key, ())  # nothing a detector changes is remembered
    assert redact_json(cold[0]) == (cold[0], ())


def test_the_clean_key_memo_keeps_its_bounds_and_the_depth_limit() -> None:
    core._CLEAN_KEYS.clear()
    redact_json({GH: 1, "content": "x", "k" * 65: 2})
    remembered = sorted(core._CLEAN_KEYS)
    assert remembered == ["content"]  # not the token, not a key past 64 characters
    redact_json({f"key{i}": i for i in range(core._MAX_CLEAN_KEYS + 100)})
    assert len(core._CLEAN_KEYS) == core._MAX_CLEAN_KEYS
    # An object at depth max_depth is refused as before, even when its key is remembered
    # and its value, under a sensitive key name, is replaced without being walked.
    core._CLEAN_KEYS.clear()
    redact_json({"password": "x"})
    assert "password" in core._CLEAN_KEYS
    nested: object = {"password": "hunter2x"}
    for _ in range(3):
        nested = [nested]
    with pytest.raises(ValidationError):
        redact_json(nested, max_depth=3)
    out, kinds = redact_json(nested, max_depth=4)
    assert kinds == (K.SECRET_ASSIGNMENT,) and "hunter2x" not in str(out)
    core._CLEAN_KEYS.clear()


# The clean-text memo (core._CLEAN_TEXTS, served thread titles): the same as redact_text
# cold and warm, nothing a detector changes remembered, and its bounds.
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SECRETISH | st.text(max_size=300), min_size=1, max_size=4))
def test_served_text_is_redact_text_with_the_clean_text_memo_cold_and_warm(
    texts: list[str],
) -> None:
    core._CLEAN_TEXTS.clear()
    cold = [served_text(t, scrub=False) for t in texts]
    warm = [served_text(t, scrub=False) for t in texts]  # the clean ones remembered now
    assert cold == warm == [redact_text(t) for t in texts]
    for text in core._CLEAN_TEXTS:
        assert redact(text) == (text, ()) and len(text) <= core._MAX_CLEAN_TEXT_CHARS
    core._CLEAN_TEXTS.clear()


def test_the_clean_text_memo_keeps_its_bounds() -> None:
    core._CLEAN_TEXTS.clear()
    for text in (GH, "a title", "t" * (core._MAX_CLEAN_TEXT_CHARS + 1)):
        redact_text_remembered(text)
    assert sorted(core._CLEAN_TEXTS) == ["a title"]  # not the token, not the long one
    for i in range(core._MAX_CLEAN_TEXTS + 100):
        redact_text_remembered(f"title {i}")
    assert len(core._CLEAN_TEXTS) == core._MAX_CLEAN_TEXTS
    assert redact_text_remembered(GH) == redact_text(GH) != GH  # full: still redacted
    core._CLEAN_TEXTS.clear()


# --- linear time on adversarial input ----------------------------------------------------------

N = 256 * 1024
ADVERSARIAL = {
    "a": ("a" * N, False),
    "scheme_sep": ("://" * (N // 3), False),
    "a_scheme": ("a://" * (N // 4), False),
    "eyJ": ("eyJ" * (N // 3), False),
    "eyJ_dash": ("eyJ-" * (N // 4), False),
    "eyJ_dot": ("eyJ." * (N // 4), False),
    "at_signs": ("https://" + "@" * N, True),
    "long_url": ("https://example.com/" + "a/" * (N // 2), False),
    "query_amps": ("https://x.example/?" + "&" * N, False),
    "pem_headers": ("-----BEGIN PRIVATE KEY-----" * (N // 27), True),
    "pem_no_end": ("-----BEGIN PRIVATE KEY-----\n" + "A" * N, True),
    "password_eq": ("password=" * (N // 9), True),
    "token_colon": ("token: " * (N // 7), False),
    "bearer": ("Bearer " * (N // 7), False),
    "basic": ("Basic aaaa " * (N // 11), False),
    "authorization": ("Authorization: " * (N // 15), False),
    "quote_escapes": ('"password":"' + '\\"' * (N // 2), True),
    "dashes": ("-" * N, False),
    "digits_colon_aa": ("123456789:AA" * (N // 12), False),
    "discord_like": (("M" + "a" * 24 + ".") * (N // 26), False),
    "cap_segments": ("/cap/" * (N // 5), False),
    "sk_dash": ("sk-" * (N // 3), False),
    "whitespace": (" " * N, False),
}


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("text", "has_secret"), ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_adversarial_input_finishes(text: str, has_secret: bool) -> None:
    result = redact(text)
    assert result.redacted == has_secret
    if not has_secret:
        assert result.text == text
    assert contains_secret(text) == has_secret
    assert not contains_secret(result.text)
    bounded = sanitize(text, 16 * 1024)
    assert bounded.byte_length <= 16 * 1024


# --- the README table --------------------------------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "README.md"
_ROW = re.compile(r"^\| `(?P<kind>[a-z_]+)` \|.*\| `(?P<example>[^`]+)` \| `(?P<output>[^`]*)` \|$")


def test_documented_examples_redact_as_documented() -> None:
    rows = [m for line in DOC.read_text("utf-8").splitlines() if (m := _ROW.match(line))]
    assert {m["kind"] for m in rows} == {k.value for k in SecretKind}
    for m in rows:
        example = m["example"].replace("\\n", "\n")
        result = redact(example)
        assert result.text == m["output"].replace("\\n", "\n"), m["kind"]
        assert SecretKind(m["kind"]) in result.kinds


# --- the package layout ------------------------------------------------------------------------

PACKAGE = Path(__file__).resolve().parent.parent / "memtier" / "redaction"


def test_each_redaction_module_is_small_and_says_what_it_owns() -> None:
    import ast

    modules = sorted(PACKAGE.glob("*.py"))
    assert {m.name for m in modules} >= {"__init__.py", "patterns.py", "core.py", "paths.py"}
    for module in modules:
        source = module.read_text("utf-8")
        assert source.count("\n") < 600, module.name
        assert ast.get_docstring(ast.parse(source)), module.name


def test_the_package_exports_the_public_api() -> None:
    import memtier.redaction as package

    exported = set(package.__all__)
    assert exported == {
        "FALLBACK_TEXT", "MAX_SANITIZE_ROUNDS", "RedactionResult", "SanitizedText",
        "SecretKind", "bound_utf8", "contains_secret", "json_contains_secret",
        "normalize_controls", "placeholder", "redact", "redact_json", "redact_text",
        "sanitize",
        # the version stamped on each stored turn record (format 2)
        "REDACTOR_VERSION",
        # the local-path scrubber (moved here from memtier/threads/core.py)
        "PATH_PLACEHOLDER", "scrub_json_paths", "scrub_paths", "served_json", "served_text",
    }  # fmt: skip
    assert all(hasattr(package, name) for name in exported)
