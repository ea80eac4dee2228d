"""The detector pre-filters (chars, needles, hints, gates) never skip a detector that could match.

Each filter must be a necessary condition for its pattern: every match contains all of the
detector's chars, one of its needles (as is), one of its hints (lower-cased) and something
its gate finds.  Checked on every example of ``test_redaction`` and on generated text; and
``redact`` with the chars, needles and gates stripped gives the same result as with them.
"""

from __future__ import annotations

import base64
import dataclasses
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_redaction import FILLER, NEGATIVE, SECRETS, fake

from memtier import redaction
from memtier.redaction import core, detectors, patterns, prefilter

DETECTORS = detectors.DETECTORS


def _discord(user_id: bytes) -> str:
    first = base64.b64encode(user_id).decode().rstrip("=")
    return f"bot {first}.GaBc12.{fake(38)}"


# Detectors the shared examples do not reach: restricted Stripe keys, and Discord ids whose
# base64 starts with N or O.
EXTRA = [
    "rk_" + "live_" + fake(24),
    _discord(b"423456789012345678"),
    _discord(b"823456789012345678"),
]
EXAMPLES = SECRETS + EXTRA


def _filters_pass(detector: detectors.Detector, text: str) -> bool:
    if not all(c in text for c in detector.chars):
        return False
    if detector.needles and not any(n in text for n in detector.needles):
        return False
    if detector.hints and not any(h in text.lower() for h in detector.hints):
        return False
    return detector.gate is None or detector.gate.search(text) is not None


def _assert_matches_pass_filters(text: str) -> None:
    for index, detector in enumerate(DETECTORS):
        for m in detector.pattern.finditer(text):
            assert _filters_pass(detector, m.group(0)), (index, detector.pattern.pattern, m)


def test_most_detectors_have_a_pre_filter() -> None:
    unfiltered = [
        d.pattern.pattern for d in DETECTORS if not (d.needles or d.hints or d.gate is not None)
    ]
    assert unfiltered == []


@pytest.mark.parametrize("text", EXAMPLES + [t for _, t in NEGATIVE])
def test_every_match_in_the_examples_passes_its_filters(text: str) -> None:
    _assert_matches_pass_filters(text)


def test_every_positive_example_matches_a_filtered_detector() -> None:
    """The check above is not vacuous: the examples do match detectors with filters."""
    matched = {
        index
        for text in EXAMPLES
        for index, d in enumerate(DETECTORS)
        if (d.needles or d.gate is not None) and d.pattern.search(text)
    }
    filtered = {i for i, d in enumerate(DETECTORS) if d.needles or d.gate is not None}
    assert matched == filtered


def _mutate(text: str, flips: list[int]) -> str:
    chars = list(text)
    for i in flips:
        if chars:
            j = i % len(chars)
            chars[j] = chars[j].swapcase()
    return "".join(chars)


TEXTS = st.builds(
    lambda a, secret, flips, b: a + _mutate(secret, flips) + b,
    FILLER,
    st.sampled_from(EXAMPLES),
    st.lists(st.integers(0, 400), max_size=3),
    FILLER,
) | st.text(st.sampled_from(list("AKISGMNOeyJghpxo_-.:/ 0123456789abcdefkl")), max_size=120)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS)
def test_generated_matches_pass_their_filters(text: str) -> None:
    _assert_matches_pass_filters(text)


UNFILTERED = tuple(dataclasses.replace(d, chars="", needles=(), gate=None) for d in DETECTORS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(TEXTS, min_size=1, max_size=4))
def test_redact_is_the_same_without_chars_needles_and_gates(parts: list[str]) -> None:
    text = " ".join(parts)
    filtered = redaction.redact(text)
    saved = core.DETECTORS  # the list redact_once runs
    try:
        core.DETECTORS = UNFILTERED  # type: ignore[misc]
        unfiltered = redaction.redact(text)
    finally:
        core.DETECTORS = saved  # type: ignore[misc]
    assert filtered == unfiltered


def test_redact_runs_the_detector_list_the_comparison_replaces() -> None:
    """The comparison above is not vacuous: redact really runs ``core.DETECTORS``."""
    token = "ghp_" + fake(36)
    assert redaction.redact(token).text != token
    saved = core.DETECTORS
    try:
        core.DETECTORS = ()  # type: ignore[misc]
        assert redaction.redact(token).text == token
    finally:
        core.DETECTORS = saved  # type: ignore[misc]


def test_discord_gate_is_the_token_middle() -> None:
    gate = patterns.DISCORD_GATE_RE
    assert isinstance(gate, re.Pattern)
    assert gate.search("MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.xyz")
    assert gate.search("nothing. here.") is None


# --- run_filtered against the plain loop it replaces (a model) ---------------------------------
# Synthetic detector lists over a small alphabet, so filters pass and fail often, and
# replacements that can put a later detector's needle into the text (the path after a
# replacement).  The model is the loop run_filtered once was: every detector, in order,
# its filters checked on the text as it is then.

ALPHABET = "abAB-_:xyXY "
LITERALS = st.text(st.sampled_from(ALPHABET), min_size=1, max_size=3)


def _model(dets: tuple[detectors.Detector, ...], text: str, run: prefilter.Run) -> str:
    counts: dict[redaction.SecretKind, int] = {}
    for detector in dets:
        if prefilter._passes(detector, text):
            changed = run(detector, text, counts)
            if changed is not None:
                text = changed
    return text


@st.composite
def synthetic_detectors(draw: st.DrawFn) -> tuple[detectors.Detector, ...]:
    out = []
    for _ in range(draw(st.integers(0, 8))):
        literal = draw(LITERALS)
        out.append(
            detectors.Detector(
                pattern=re.compile(re.escape(literal)),
                replace=lambda m: None,  # unused: the run callback below replaces
                chars=draw(st.text(st.sampled_from(ALPHABET), max_size=2)),
                needles=tuple(draw(st.lists(LITERALS, max_size=3))),
                hints=tuple(h.lower() for h in draw(st.lists(LITERALS, max_size=2))),
                gate=draw(st.none() | st.just(re.compile("[xy]"))),
            )
        )
    return tuple(out)


def _replacing(replacements: dict[int, str]) -> prefilter.Run:
    """A run callback: detector i replaces its pattern's matches by replacements[i]
    (which may hold another detector's needle), and records the order it ran in."""

    def run(
        d: detectors.Detector, text: str, counts: dict[redaction.SecretKind, int]
    ) -> str | None:
        new = d.pattern.sub(replacements.get(id(d), "#"), text)
        counts[redaction.SecretKind.JWT] = counts.get(redaction.SecretKind.JWT, 0) + 1
        return new if new != text else None

    return run


@settings(max_examples=400, deadline=None)
@given(synthetic_detectors(), st.text(st.sampled_from(ALPHABET), max_size=30), st.data())
@example(
    dets=(
        detectors.Detector(re.compile("a"), lambda m: None, needles=("a",)),
        detectors.Detector(re.compile("b"), lambda m: None, chars="-", needles=("X",)),
    ),
    text="a",
    data=None,
)
def test_run_filtered_runs_what_the_plain_loop_runs(
    dets: tuple[detectors.Detector, ...], text: str, data: st.DataObject | None
) -> None:
    """Same text out, and the same detectors run in the same order, including after a
    replacement puts a needle the first look did not see (the pinned example: detector
    0 writes "X-", which detector 1's filters need)."""
    if data is None:
        replacements = {id(dets[0]): "X-"}
    else:
        replacements = {
            id(d): data.draw(st.text(st.sampled_from(ALPHABET), max_size=3)) for d in dets
        }
    ran_model: list[int] = []
    ran_new: list[int] = []
    run = _replacing(replacements)

    def logged(into: list[int]) -> prefilter.Run:
        def call(d: detectors.Detector, t: str, c: dict[redaction.SecretKind, int]) -> str | None:
            into.append(dets.index(d))
            return run(d, t, c)

        return call

    expected = _model(dets, text, logged(ran_model))
    got = prefilter.run_filtered(dets, text, logged(ran_new), {})
    assert got == expected
    assert ran_new == ran_model
    if data is None:  # the pinned case reaches the path after a replacement
        assert ran_model == [0, 1]


def test_the_memos_stay_within_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stages past _MAX_STAGES are worked out and not kept; more detector lists than
    _MAX_PLANS start the memo again.  Either way the result is the plain loop's."""
    monkeypatch.setattr(prefilter, "_MAX_STAGES", 2)
    monkeypatch.setattr(prefilter, "_PLANS", {})
    dets = tuple(
        detectors.Detector(re.compile(c), lambda m: None, chars=c, needles=(c,)) for c in "abcd"
    )
    run = _replacing({})
    for text in ("a", "b", "ab", "cd", "abcd", "x"):
        assert prefilter.run_filtered(dets, text, run, {}) == _model(dets, text, run)
    assert len(prefilter._plan(dets).stages) == 2
    lists = [tuple(dets[:k]) for k in range(1, 5)] * 3  # 4 lists, more than the bound below
    monkeypatch.setattr(prefilter, "_MAX_PLANS", 3)
    for lst in lists:
        for text in ("a", "abcd"):
            assert prefilter.run_filtered(lst, text, run, {}) == _model(lst, text, run)
        assert len(prefilter._PLANS) <= 3
