"""Voices with owners, without vLLM: who may use, replace, remove and share an enrolled voice
(``VoiceBook``), reserved names, the cap, a voices file that never fails a start, one writer at a
time on the file (lock, merge on write), reloads off the event loop that never change a voice a
call has pinned. The real server's side is in test_voice_owners_real.py."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from pipecat_veena.engine.voices import OPERATOR, PRINTS_FORMAT, Voice, VoiceBook, VoicePrint
from pipecat_veena.engine.voices_file import (
    VoicesFile,
    read_voices_file,
    remove_from_file,
    share_in_file,
    update_voices_file,
    voices_file_lock,
)
from pipecat_veena.errors import EnrolmentError, UnknownVoiceError

A, B = "sha256:aaaa", "sha256:bbbb"
CODES = [1] * 32


def _book() -> VoiceBook:
    voices = {g: Voice(name=g, gender=i) for i, g in enumerate(("female", "male"))}
    return VoiceBook(voices, "female", controllable=True)


def test_an_enrolled_voice_is_its_owners_alone() -> None:
    book = _book()
    book.enrol("asha", CODES, owner=A)
    assert book.resolve_for("asha", A).name == "asha"
    with pytest.raises(UnknownVoiceError) as unknown:
        book.resolve_for("asha", B)  # exactly as a name that is no voice
    assert "asha" not in str(unknown.value).split("offers:")[1]  # nor listed to B
    assert book.resolve_for("female", B).name == "female"  # built-in voices are everyone's
    with pytest.raises(UnknownVoiceError):
        book.forget("asha", B)
    with pytest.raises(EnrolmentError, match="'asha' is taken: pick another") as taken:
        book.enrol("asha", [2] * 32, owner=B, replace=True)
    assert taken.value.code == EnrolmentError.NAME_TAKEN
    assert book.resolve("asha").globals == tuple(CODES)  # unchanged
    assert book.owned_by(A) == ["asha"] and book.owned_by(B) == []
    assert book.forget("asha", A) == "asha" and not book.enrolled


def test_re_enrolling_ones_own_name_needs_replace() -> None:
    book = _book()
    book.enrol("asha", CODES, owner=A)
    for name in ("asha", " Asha  "):  # a name with spaces is the trimmed name: no silent swap
        with pytest.raises(EnrolmentError, match="send replace=true to replace it") as again:
            book.enrol(name, [2] * 32, owner=A, replace=False)
        assert again.value.code == EnrolmentError.NAME_TAKEN
    assert book.resolve("asha").globals == tuple(CODES)
    book.enrol("asha ", [2] * 32, owner=A, replace=True)
    assert book.resolve("asha").globals == (2,) * 32 and book.owners["asha"] == A


def test_reserved_and_built_in_names_cannot_be_enrolled() -> None:
    book = _book()
    book.reserved = frozenset({"alloy", "echo"})
    with pytest.raises(EnrolmentError, match="'alloy' is reserved on this server"):
        book.enrol("Alloy", CODES, owner=A)
    with pytest.raises(EnrolmentError, match="built-in voice"):
        book.enrol("female", CODES, owner=A)
    assert not book.enrolled


def test_shared_and_operator_voices_are_everyones_but_removed_by_their_owner() -> None:
    book = _book()
    book.enrol("asha", CODES, owner=A)
    book.enrol("house", CODES)  # the operator's (CLI, in-process): every key may use it
    book.share("asha")
    assert book.usable_by("asha", B) and book.usable_by("house", B)
    assert book.shared_with_all() == ["asha", "house"]
    with pytest.raises(EnrolmentError, match="shared with you but not yours") as refused:
        book.forget("asha", B)
    assert refused.value.code == EnrolmentError.NOT_OWNER
    with pytest.raises(EnrolmentError, match="not yours"):
        book.forget("house", B)
    assert book.forget("house") == "house"  # the operator removes anything
    book.share("asha", False)
    assert not book.usable_by("asha", B)


def test_an_open_server_has_one_owner() -> None:
    book = _book()
    book.enrol("asha", CODES, owner=OPERATOR)
    assert book.owned_by(OPERATOR) == ["asha"]
    assert book.forget("asha", OPERATOR) == "asha"


def test_the_cap_on_enrolled_voices() -> None:
    book = _book()
    book.enrol("one", CODES, owner=A, limit=2)
    book.enrol("two", CODES, owner=B, limit=2)
    with pytest.raises(EnrolmentError, match="cap of 2 enrolled voices") as full:
        book.enrol("three", CODES, owner=A, limit=2)
    assert full.value.code == EnrolmentError.TOO_MANY_VOICES
    book.enrol("one", [3] * 32, owner=A, limit=2)  # a replacement does not count


def test_owners_and_shares_survive_the_file() -> None:
    book = _book()
    book.enrol("asha", CODES, owner=A)
    book.enrol("ravi", CODES, owner=B)
    book.share("ravi")
    book.enrol("house", CODES)
    data = book.export_prints("demo")
    assert data["enrolled"]["asha"] == {"globals": CODES, "owner": A}
    assert data["enrolled"]["ravi"] == {"globals": CODES, "owner": B, "shared": True}
    assert data["enrolled"]["house"] == {"globals": CODES}  # no owner: the operator's
    again = _book()
    again.load_prints(data, lambda prefix: (), replace_enrolled=True)
    assert again.owners == book.owners and again.shared == {"ravi"}


def test_a_reload_skips_bad_entries_and_keeps_pins() -> None:
    book = _book()
    pin = VoicePrint((1, 2, 3), (7,) * 32)
    book.pinned["female"] = pin
    data = {
        "format": PRINTS_FORMAT,
        "voices": {"female": {"prefix": [4, 5], "globals": [8] * 32}, "ghost": {"prefix": []}},
        "enrolled": {
            "asha": {"globals": CODES, "owner": A},
            "male": {"globals": CODES},  # a built-in name
            "bad": {"globals": [1, 2]},  # too few codes
            "worse": "not an entry",
            "no way": {"globals": CODES},  # an unusable name
        },
    }
    book.load_prints(data, lambda prefix: (8,) * 32, replace_enrolled=True)
    assert book.enrolled == {"asha"}  # the usable entry; each bad one skipped (warned)
    assert book.pinned["female"] is pin  # a call may be speaking with it: the pin stays
    fresh = _book()
    fresh.load_prints(data, lambda prefix: (8,) * 32, replace_enrolled=True)
    assert fresh.pinned["female"].prefix == (4, 5)  # not pinned yet: the file's print


def _file(path: Path, **enrolled: dict) -> None:
    path.write_text(json.dumps({"format": PRINTS_FORMAT, "voices": {}, "enrolled": enrolled}))


def test_writers_that_overlap_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "voices.json"
    names = [f"v{i}" for i in range(40)]

    def add(name: str) -> None:
        update_voices_file(path, lambda data: data.setdefault("enrolled", {}).update(
            {name: {"globals": CODES}}))  # fmt: skip

    threads = [threading.Thread(target=add, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(read_voices_file(path)["enrolled"]) == sorted(names)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_writer_waits_for_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "voices.json"
    _file(path, asha={"globals": CODES})
    done = threading.Event()

    def share() -> None:
        share_in_file(path, "asha")
        done.set()

    with voices_file_lock(path):
        writer = threading.Thread(target=share)
        writer.start()
        assert not done.wait(0.3)  # held: the writer waits
        _file(path, asha={"globals": CODES}, ravi={"globals": CODES})  # another writer's change
    writer.join()
    data = read_voices_file(path)
    assert data["enrolled"]["asha"]["shared"] is True and "ravi" in data["enrolled"]
    assert remove_from_file(path, "ravi") == "ravi"
    assert list(read_voices_file(path)["enrolled"]) == ["asha"]


def test_an_engine_change_merges_with_the_file_as_it_is_now(tmp_path: Path) -> None:
    path = tmp_path / "voices.json"
    store = VoicesFile(path, "demo", lambda prefix: ())
    book = _book()
    store.start(book)  # no file yet: a note, no failure
    store.change(book, lambda b: b.enrol("asha", CODES, owner=A))
    _file(path, **read_voices_file(path)["enrolled"], cli={"globals": CODES})  # the CLI's
    store.change(book, lambda b: b.enrol("ravi", CODES, owner=B))  # without a reload first
    assert sorted(read_voices_file(path)["enrolled"]) == ["asha", "cli", "ravi"]
    assert book.enrolled == {"asha", "cli", "ravi"}
    with pytest.raises(EnrolmentError, match="taken"):  # checked against the file, under lock
        store.change(book, lambda b: b.enrol("cli", CODES, owner=A))
    assert read_voices_file(path)["enrolled"]["cli"] == {"globals": CODES}


def test_a_corrupt_file_never_fails_a_start_and_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "voices.json"
    path.write_text("{not json")
    store = VoicesFile(path, "demo", lambda prefix: ())
    book = _book()
    store.start(book)  # warned, not raised
    assert not book.enrolled
    with pytest.raises(EnrolmentError, match="cannot read the voices file .* fix or move"):
        store.change(book, lambda b: b.enrol("asha", CODES))
    assert path.read_text() == "{not json"


async def test_a_reload_runs_off_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "voices.json"
    _file(path, **{f"v{i}": {"globals": CODES} for i in range(2000)})
    store = VoicesFile(path, "demo", lambda prefix: ())
    book = _book()
    loop_thread = threading.get_ident()
    seen: list[int] = []
    load = book.load_prints

    def recording(*args, **kwargs):
        seen.append(threading.get_ident())
        return load(*args, **kwargs)

    book.load_prints = recording  # type: ignore[method-assign]
    assert store.refresh(book, now=True) is False  # handed to a worker thread
    await asyncio.wait_for(store._reloading, 30)
    assert len(book.enrolled) == 2000 and seen and loop_thread not in seen


def test_a_reload_sees_every_changed_entry() -> None:
    """Unchanged entries are not checked again on a reload (20,000 voices): changed ones are."""
    book = _book()
    data = {"format": PRINTS_FORMAT, "voices": {}, "enrolled": {
        "asha": {"globals": CODES, "owner": A}, "ravi": {"globals": CODES}}}  # fmt: skip
    book.load_prints(data, lambda prefix: (), replace_enrolled=True)
    kept = book.voices["ravi"]
    data = json.loads(json.dumps(data))
    data["enrolled"]["asha"] = {"globals": [2] * 32, "owner": B, "shared": True}
    book.load_prints(data, lambda prefix: (), replace_enrolled=True)
    assert book.voices["asha"].globals == (2,) * 32 and book.owners["asha"] == B
    assert book.shared == {"asha"} and book.voices["ravi"] is kept
    book.reserved = frozenset({"ravi"})  # a name reserved since: skipped now
    book.load_prints(data, lambda prefix: (), replace_enrolled=True)
    assert book.enrolled == {"asha"}


def test_cli_voices_share_and_list(tmp_path: Path, capsys) -> None:
    from pipecat_veena.cli import main

    path = tmp_path / "voices.json"
    _file(path, asha={"globals": CODES, "owner": A}, house={"globals": CODES})
    args = ["--voices-file", str(path)]
    assert main(["voices", "share", "Asha", *args]) == 0
    assert read_voices_file(path)["enrolled"]["asha"] == {"globals": CODES, "owner": A,
                                                          "shared": True}  # fmt: skip
    assert main(["voices", "list", *args]) == 0
    listed = capsys.readouterr().out
    assert "asha (shared: every key)" in listed and "house (operator's: every key)" in listed
    assert main(["voices", "unshare", "asha", *args]) == 0
    assert "shared" not in read_voices_file(path)["enrolled"]["asha"]
    assert main(["voices", "share", "nobody", *args]) == 2  # one line naming the voices
    assert "enrols no voice 'nobody'" in capsys.readouterr().err
