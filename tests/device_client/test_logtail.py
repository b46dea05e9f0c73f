"""The end of a program's output as a rejection carries it: bounded, valid, visible, and held to the
same bound by the wire schema the hub checks."""

from __future__ import annotations

import io

import pytest

from device_client import logtail
from device_client.shared import verbs


def test_short_output_is_kept_whole_with_crlf_as_newlines_and_no_trailing_newline():
    assert logtail.visible(b"one\r\ntwo\n\n") == "one\ntwo"
    assert logtail.visible(b"") == ""


def test_control_characters_are_made_visible_and_tabs_and_newlines_kept():
    assert logtail.visible(b"\x1b[2J\x00a\tb\x07\r\n\x7f") == "\\x1b[2J\\x00a\tb\\x07\n\\x7f"


def test_a_cut_never_splits_a_character_or_starts_mid_line():
    line = "é" * 30 + "\n"  # 61 bytes a line: the 2 KiB cut falls inside a line and a character
    text = logtail.visible((line * 100).encode())
    assert "\ufffd" not in text and text.split("\n")[0] == "é" * 30
    assert len(text.split("\n")) == logtail.MAX_LINES


def test_one_long_line_is_cut_to_the_bound_from_its_end():
    text = logtail.visible(b"a" * 10_000 + b"END")
    assert len(text) == logtail.MAX_BYTES and text.endswith("END")
    text = logtail.visible("é".encode() * 5000 + b"x")  # the cut falls inside a character
    assert text.startswith("é") and "\ufffd" not in text and text.endswith("x")


def test_escapes_never_take_it_past_the_wire_bound():
    text = logtail.visible(b"\x01" * 10_000)
    assert len(text) == logtail.MAX_CHARS == verbs.OUTPUT_TAIL_CHARS


def test_read_tail_reads_only_the_end():
    assert logtail.read_tail(io.BytesIO(b"x" * 5000 + b"end")) == (b"x" * 5000 + b"end")[-logtail.MAX_BYTES:]


def test_last_line_is_the_last_non_blank_one_cut_short():
    assert logtail.last_line("a\nb\n  \n") == "b"
    assert logtail.last_line("x" * 300, limit=10) == "x" * 9 + "…"
    assert logtail.last_line("\n \n") is None


@pytest.mark.parametrize("field", ["checkOutput", "workloadLog"])
def test_the_hub_refuses_more_than_the_bound(field):
    result = {"status": "rejected", "configId": "c", "versionId": "v", "error": "e", field: "x" * 2048}
    assert getattr(verbs.check_event("config.result", result), field) == "x" * 2048
    with pytest.raises(verbs.Malformed):
        verbs.check_event("config.result", {**result, field: "x" * 2049})
