"""Regression tests for the redaction findings of issue 8 (each failed before the fix).

* a bare ``name=value`` stopped at the first ``{}()[]<>,&;`` and stored the tail in clear;
* a PEM key without an END line swallowed the following prose and URLs up to the next
  character outside its body set (``@``), hiding a webhook from its own detector and from
  ``contains_secret``;
* ``password=${DB_PASSWORD}`` became ``[REDACTED…]{DB_PASSWORD}``.

The fake secrets are assembled from pieces (see tests/test_redaction.py).
"""

from __future__ import annotations

import base64

import pytest

from memtier.redaction import (
    SecretKind,
    contains_secret,
    placeholder,
    redact,
    redact_json,
    sanitize,
)

K = SecretKind
UUID = "1d2c3b4a-5e6f-4a0b-9c8d-7e6f5a4b3c2d"
ASSIGNED = placeholder(K.SECRET_ASSIGNMENT)

# --- bare values run to the end of their token ------------------------------------------------

TAILS = [
    ("password=P@ss{w0rd}2024!", "password="),
    ("DB_PASSWORD=Xy7(secret-tail)", "DB_PASSWORD="),
    ("password=abc,Secret99", "password="),
    ("password=Tr0ub4dor&3xtra", "password="),
    ("token=abc]TAILSECRET123", "token="),
    ("api_key=<k3y>rest-of-key", "api_key="),
    ("secret=a;b;c;d0", "secret="),
    ("password: x{y}z0", "password: "),
    ("password=&Secret99", "password="),
    ("password=<a>hunter2<b>", "password="),  # not a <placeholder>: literal text between
    ("password=${X:-hunter2}", "password="),  # a shell default is a literal value
    ("password=$ecret99", "password="),  # $VAR placeholders are upper-case names
]


@pytest.mark.parametrize(("text", "prefix"), TAILS, ids=[t for t, _ in TAILS])
def test_bare_value_is_redacted_to_the_end_of_its_token(text: str, prefix: str) -> None:
    for before, after in (("", ""), ("set ", " now"), ("a\n", "\nb"), ("(", " )")):
        result = redact(before + text + after)
        assert result.text == before + prefix + ASSIGNED + after
        assert result.kinds == (K.SECRET_ASSIGNMENT,)
        assert not contains_secret(result.text)


def test_sanitize_stores_no_tail() -> None:
    for text, _ in TAILS:
        stored = sanitize(f"note: {text} ok", 4096).text
        secret = text.split("=", 1)[-1].split(": ", 1)[-1]
        assert secret not in stored
        for piece in ("{w0rd}2024!", "(secret-tail)", ",Secret99", "&3xtra", "]TAILSECRET123"):
            assert piece not in stored


def test_a_quoted_string_around_the_assignment_keeps_its_closing_quote() -> None:
    assert redact('["PASSWORD=hunter2", "USER=bob"]').text == (
        f'["PASSWORD={ASSIGNED}", "USER=bob"]'
    )
    assert redact("run('token=abc]TAIL123')").text == f"run('token={ASSIGNED}')"
    # the string's own closing quote right after "=" is no value
    assert redact('"PASSWORD=" + pw').text == '"PASSWORD=" + pw'
    # an escaped quote is part of the value
    assert redact('"password=ab\\"c\\"d", 1').text == f'"password={ASSIGNED}", 1'


def test_quoted_values_run_to_the_closing_quote() -> None:
    assert redact("password='p@ss w0rd{x}' tail").text == f"password='{ASSIGNED}' tail"
    assert redact('password="a, b; c & d" tail').text == f'password="{ASSIGNED}" tail'


def test_empty_values_followed_by_structure_are_left_alone() -> None:
    for text in ("token=&key=", "f(password=)", "{password=}", "password=;Database=x"):
        assert redact(text).text == text


# --- placeholders -----------------------------------------------------------------------------

PLACEHOLDERS = [
    "password=${DB_PASSWORD}",
    "password=${DB_PASSWORD},",
    "DB_PASSWORD=${DB_PASSWORD}.",
    "token=$GITHUB_TOKEN",
    "token=$GITHUB_TOKEN;",
    'password="${DB_PASSWORD}"',
    "api_key: ${API_KEY}",
    "password={{ db_password }}",
    'password="{{ db_password }}"',
    "password=<your-password>",
    "password=***",
    "secret=xxxx",
    "password=null",
]


@pytest.mark.parametrize("text", PLACEHOLDERS)
def test_placeholders_are_left_alone(text: str) -> None:
    for wrapped in (text, f"use {text} here", f"{text}\nnext"):
        assert redact(wrapped).text == wrapped
        assert not contains_secret(wrapped)


def test_redact_json_placeholder_must_be_the_whole_value() -> None:
    assert redact_json({"password": "${DB_PASSWORD}"})[0] == {"password": "${DB_PASSWORD}"}
    out, kinds = redact_json({"password": "${A} hunter2 ${B}"})
    assert out == {"password": ASSIGNED} and kinds == (K.SECRET_ASSIGNMENT,)
    out, _ = redact_json({"password": "<a> hunter2 <b>"})
    assert out == {"password": ASSIGNED}


# --- PEM keys without an END line -------------------------------------------------------------

BODY = (
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7" + "\n" + "aB3dE5gH7jK9mN1pQ2rS4tU6vW8x"
)
SLACK = "https://hooks.slack.com/services/" + "T0000FAKE/B0000FAKE/" + "FAKEfake0000FAKEfake"
TEAMS = (
    "https://contoso.webhook.office.com/webhookb2/" + "FAKE0000-fake@FAKE/IncomingWebhook/00/FAKE"
)
DISCORD = "https://discord.com/api/webhooks/" + "123456789012345678/" + "FAKE-token-FAKE0000"
HOOKS = [(SLACK, K.SLACK_WEBHOOK), (TEAMS, K.TEAMS_WEBHOOK), (DISCORD, K.DISCORD_WEBHOOK)]
KEY = placeholder(K.PRIVATE_KEY)


@pytest.mark.parametrize(("url", "kind"), HOOKS, ids=[k.value for _, k in HOOKS])
@pytest.mark.parametrize(
    "glue",
    ["\n", "\nThe webhook is ", "\n\n", " then ", "\nsee: ", "\n> "],
    ids=["newline", "prose", "blank", "space", "colon", "quote"],
)
def test_unterminated_key_leaves_the_rest_to_the_other_detectors(
    url: str, kind: SecretKind, glue: str
) -> None:
    text = f"-----BEGIN RSA PRIVATE KEY-----\n{BODY}{glue}{url} mail me@example.com"
    assert contains_secret(f"x{glue}{url}")
    result = redact(text)
    assert result.kinds == (K.PRIVATE_KEY, kind)
    assert result.text.startswith(KEY)
    assert "MIIEvQIBADAN" not in result.text and "aB3dE5gH7jK9" not in result.text
    assert url not in result.text and url.split("/")[-1] not in result.text
    assert result.text.endswith(" mail me@example.com")
    # contains_secret sees the webhook behind the key (it reported nothing before)
    assert contains_secret(f"-----BEGIN RSA PRIVATE KEY-----\n{KEY[:3]}{glue}{url}")


def test_unterminated_key_ends_at_a_blank_line() -> None:
    text = f"-----BEGIN EC PRIVATE KEY-----\n{BODY}\n\nthanks, see you"
    assert redact(text).text == f"{KEY}\n\nthanks, see you"


def test_unterminated_key_ends_before_a_non_base64_character() -> None:
    for tail, kept in (
        ("\nplease rotate it", "\nplease rotate it"),
        ("```\nok", "```\nok"),
        ("\n```", "\n```"),
        ('", "n": 1}', '", "n": 1}'),
        (". Oops", ". Oops"),
        (" @bob", " @bob"),
    ):
        assert redact(f"-----BEGIN PRIVATE KEY-----\n{BODY}{tail}").text == KEY + kept


def test_unterminated_pgp_key_keeps_its_body_after_the_armor_blank_line() -> None:
    text = f"-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: GnuPG v2\n\n{BODY}\n=aBcD\nbye"
    assert redact(text).text == f"{KEY}\nbye"
    headers = "Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,0A"
    text = f"-----BEGIN RSA PRIVATE KEY-----\n{headers}\n\n{BODY}"
    assert redact(text).text == KEY


def test_unterminated_key_on_one_line_and_json_escaped() -> None:
    one_line = "-----BEGIN OPENSSH PRIVATE KEY----- " + BODY.replace("\n", " ") + " is all I have"
    assert redact(one_line).text == f"{KEY} is all I have"
    escaped = (
        '{"k": "-----BEGIN PRIVATE KEY-----\\n' + BODY.replace("\n", "\\n") + f'", "u": "{SLACK}"}}'
    )
    result = redact(escaped)
    hook = "https://hooks.slack.com/" + placeholder(K.SLACK_WEBHOOK)
    assert result.text == '{"k": "' + KEY + '", "u": "' + hook + '"}'
    assert result.kinds == (K.PRIVATE_KEY, K.SLACK_WEBHOOK)


def test_terminated_key_is_still_redacted_whole() -> None:
    text = f"a\n-----BEGIN PRIVATE KEY-----\n{BODY}\n\n{BODY}\n-----END PRIVATE KEY-----\nb"
    assert redact(text).text == f"a\n{KEY}\nb"


# --- leaks the secret corpus oracle found (tests/adversarial/test_secret_oracle.py) ----------


def test_escaped_json_assignments_are_redacted() -> None:
    """JSON inside a JSON or code string: the quotes around name and value are escaped."""
    text = 'value = "{\\"password\\": \\"1F::d@&T/)E\\"}"  # from the vault'
    assert (
        redact(text).text == 'value = "{\\"password\\": \\"' + ASSIGNED + '\\"}"  # from the vault'
    )
    text = '{"cmd": "export DB_PASSWORD=\\"ZO)Oq+l {@k|r9H\\""}'
    assert redact(text).text == '{"cmd": "export DB_PASSWORD=\\"' + ASSIGNED + '\\""}'


def test_quoted_and_commented_key_lines_are_redacted() -> None:
    """A key quoted in Markdown or e-mail (> ) or commented out (# ), with or without END."""
    lines = BODY.split("\n")
    for marker in ("> ", "> > ", "# ", "// "):
        block = ["-----BEGIN RSA PRIVATE KEY-----", *lines, "-----END RSA PRIVATE KEY-----"]
        quoted = "\n".join(marker + line for line in block)
        assert redact(quoted).text == marker + KEY, marker
        truncated = "\n".join(marker + line for line in block[:-1]) + "\n\nbye"
        assert redact(truncated).text == marker + KEY + "\n\nbye", marker
    pgp = "> -----BEGIN PGP PRIVATE KEY BLOCK-----\n> Version: GnuPG v2\n> \n> " + lines[0]
    assert redact(pgp).text == "> " + KEY


def test_a_parameter_list_header_in_a_string_ends_with_the_string() -> None:
    digest = (
        'Authorization: Digest username=\\"bob\\", response=\\"0a1b2c3d4e5f60718293a4b5c6d7e8f9\\"'
    )
    negotiate = "Proxy-Authorization: Negotiate YUKGRlFU+6Aub8xT6wXdA5SjWpy6IBjF3eUb/N1HqFCPN=="
    text = f'{{"a": "{digest}", "b": "{negotiate}"}} request id {UUID}'
    result = redact(text)
    assert result.text == (
        f'{{"a": "Authorization: Digest {placeholder(K.AUTHORIZATION_HEADER)}",'
        f' "b": "Proxy-Authorization: Negotiate {placeholder(K.AUTHORIZATION_HEADER)}"}}'
        f" request id {UUID}"
    )
    code = 'h = \'Authorization: Digest username="bob", nonce="abc"\'  # ok, see ghp_'
    assert redact(code).text == (
        f"h = 'Authorization: Digest {placeholder(K.AUTHORIZATION_HEADER)}'  # ok, see ghp_"
    )


def test_escaped_json_authorization_header_is_redacted() -> None:
    text = '{"detail": "{\\"Authorization\\": \\"ApiKey 9OFY9FEPPZoK0l7eLtSaUMgXhzIZAjMU\\"}"}'
    expected = placeholder(K.AUTHORIZATION_HEADER)
    assert redact(text).text == '{"detail": "{\\"Authorization\\": \\"ApiKey ' + expected + '\\"}"}'


def test_discord_bot_token_of_a_17_digit_user_id_is_redacted() -> None:
    first = base64.b64encode(b"80109646758645814").decode().rstrip("=")  # 23 characters
    token = f"{first}.N8Av7S.93MU_pLgAjGsOdmvLNzqvHfm1wk05Avq_o1sfk"
    assert redact(f"> {token}, thanks").text == f"> {placeholder(K.DISCORD_BOT_TOKEN)}, thanks"
