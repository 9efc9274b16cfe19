"""MediaSum builder: fake release files -> array_record -> ``tfds.data_source``; the errors; mock data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from gqa_jax.data import mediasum

SPLIT_IDS = {"train": ["NPR-3", "CNN-1", "NPR-1"], "val": ["CNN-2"], "test": ["NPR-2", "CNN-3"]}


def interview(name: str, utt: list[str] | None = None, speaker: list[str] | None = None) -> dict:
    utt = [f"Welcome to {name}.", "Thanks \u2014 glad to be here.\u00e9"] if utt is None else utt
    speaker = ["JOHN KING, CNN HOST", "Unidentified Male"] if speaker is None else speaker
    return {
        "id": name,
        "program": "Morning Edition",
        "date": "2008-06-10",
        "url": f"https://example.org/{name}",
        "title": f"Title of {name}",
        "summary": f"Summary of {name}.",
        "utt": utt,
        "speaker": speaker,
    }


def write_release(manual_dir: Path, interviews: list[dict] | str, splits: dict | str = SPLIT_IDS) -> Path:
    """Writes the two release files (text is written as is) and returns ``manual_dir``."""
    manual_dir.mkdir(parents=True, exist_ok=True)
    dialogues = interviews if isinstance(interviews, str) else json.dumps(interviews, indent=2)
    (manual_dir / mediasum.DIALOGUES_FILE).write_text(dialogues, encoding="utf-8")
    split_text = splits if isinstance(splits, str) else json.dumps(splits)
    (manual_dir / mediasum.SPLITS_FILE).write_text(split_text, encoding="utf-8")
    return manual_dir


def all_interviews() -> list[dict]:
    names = {name for ids in SPLIT_IDS.values() for name in ids} | {"NPR-9"}  # NPR-9: in no split
    return [interview(name) for name in sorted(names)]


def read_split(data_dir: Path, split: str) -> list[dict[str, str]]:
    source = tfds.data_source("mediasum", split=split, data_dir=data_dir, download=False)
    return [{k: v.decode("utf-8") for k, v in source[i].items()} for i in range(len(source))]


def test_build_and_read_back(tmp_path):
    manual_dir = write_release(tmp_path / "manual", all_interviews())
    counts = mediasum.prepare_mediasum(tmp_path / "data", manual_dir)
    assert counts == {"train": 3, "validation": 1, "test": 2}
    for key, split in mediasum.SPLITS.items():
        rows = read_split(tmp_path / "data", split)
        assert [row["id"] for row in rows] == SPLIT_IDS[key]  # the split file's order
        for row in rows:
            name = row["id"]
            assert row == {
                "id": name,
                "document": f"JOHN KING, CNN HOST: Welcome to {name}.\n"
                "Unidentified Male: Thanks \u2014 glad to be here.\u00e9",
                "summary": f"Summary of {name}.",
            }
    # Built once: a second call only reads, and needs no manual files.
    assert mediasum.prepare_mediasum(tmp_path / "data", tmp_path / "gone") == counts


def test_builder_is_registered():
    assert "mediasum" in tfds.list_builders(with_community_datasets=False)  # no GCS lookup
    builder = tfds.builder("mediasum", data_dir="/nonexistent")
    assert isinstance(builder, mediasum.Mediasum)
    assert set(builder.info.features) == {"id", "document", "summary"}
    assert "news_dialogue.json" in builder.MANUAL_DOWNLOAD_INSTRUCTIONS


def test_mock_data_gives_two_examples_per_split():
    with tfds.testing.mock_data(num_examples=2):
        for split in mediasum.SPLITS.values():
            source = tfds.data_source("mediasum", split=split)
            assert len(source) == 2
            assert set(source[0]) == set(mediasum.FEATURES)


# ------------------------------------------------------------------------------- iter_json_list
@pytest.mark.parametrize("chunk_chars", [1, 3, 64, 1 << 20])
def test_iter_json_list_matches_json_load(tmp_path, chunk_chars):
    objects = [
        interview(f"NPR-{i}", utt=['a "quoted" {brace} [x]', "\u00e9\u4e2d"], speaker=["A", "B"])
        for i in range(4)
    ]
    path = tmp_path / "list.json"
    path.write_text("\ufeff \n[ " + ",\n  ".join(json.dumps(o) for o in objects) + " ]\n\t", encoding="utf-8")
    assert list(mediasum.iter_json_list(path, chunk_chars=chunk_chars)) == objects
    path.write_text(" [ ] ", encoding="utf-8")
    assert list(mediasum.iter_json_list(path, chunk_chars=chunk_chars)) == []


@pytest.mark.parametrize(
    "text, what",
    [
        ('[{"id": "a"}, {"id": "b"', "Expecting"),  # truncated inside an element
        ('[{"id": "a"},', "expected an object, found 'the end of the file'"),  # truncated between elements
        ('{"id": "a"}', "expected '\\['"),  # an object, not a list
        ('[{"id": "a"} {"id": "b"}]', "expected ',' or '\\]'"),
        ('[{"id": "a"}, 3]', "expected an object, found '3'"),
        ('[{"id": "a"}] x', "unexpected text after the list"),
        ("", "expected '\\['"),
    ],
)
def test_iter_json_list_rejects_malformed(tmp_path, text, what):
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=f"bad.json is not a JSON list of objects: {what}"):
        list(mediasum.iter_json_list(path, chunk_chars=4))


def test_iter_json_list_bounds_element_size(tmp_path):
    path = tmp_path / "big.json"
    path.write_text('[{"id": "' + "x" * 1000 + '"}]', encoding="utf-8")
    assert len(list(mediasum.iter_json_list(path, chunk_chars=16))) == 1
    with pytest.raises(ValueError, match="Unterminated string"):
        list(mediasum.iter_json_list(path, chunk_chars=16, max_element_chars=100))


# ------------------------------------------------------------------------------------ errors
def prepare(tmp_path: Path, manual_dir: Path) -> dict[str, int]:
    return mediasum.prepare_mediasum(tmp_path / "data", manual_dir)


def test_missing_manual_dir_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="manual directory .*nowhere does not exist"):
        prepare(tmp_path, tmp_path / "nowhere")
    manual_dir = write_release(tmp_path / "manual", all_interviews())
    (manual_dir / mediasum.SPLITS_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=f"{mediasum.SPLITS_FILE} not found"):
        prepare(tmp_path, manual_dir)
    write_release(manual_dir, all_interviews())
    (manual_dir / mediasum.DIALOGUES_FILE).unlink()
    (manual_dir / "news_dialogue.json.zip").write_bytes(b"PK")
    with pytest.raises(
        FileNotFoundError, match=r"news_dialogue.json not found \(unzip news_dialogue.json.zip"
    ):
        prepare(tmp_path, manual_dir)


def test_builder_without_manual_dir(tmp_path):
    config = tfds.download.DownloadConfig(manual_dir=str(tmp_path / "nowhere"), try_download_gcs=False)
    with pytest.raises(FileNotFoundError, match="nowhere does not exist"):
        mediasum.Mediasum(data_dir=str(tmp_path / "data")).download_and_prepare(
            file_format="array_record", download_config=config
        )


def test_malformed_json(tmp_path):
    text = json.dumps(all_interviews())
    manual_dir = write_release(tmp_path / "manual", text[: len(text) // 2])
    with pytest.raises(ValueError, match=f"{mediasum.DIALOGUES_FILE} is not a JSON list of objects"):
        prepare(tmp_path, manual_dir)
    (manual_dir / mediasum.DIALOGUES_FILE).write_bytes(b'[{"id": "\xff"}]')
    with pytest.raises(ValueError, match=f"{mediasum.DIALOGUES_FILE} is not UTF-8 text"):
        prepare(tmp_path, manual_dir)
    write_release(manual_dir, all_interviews(), splits='{"train": [')
    with pytest.raises(ValueError, match=f"{mediasum.SPLITS_FILE} is not valid JSON"):
        prepare(tmp_path, manual_dir)
    write_release(manual_dir, all_interviews(), splits={"train": ["NPR-1"], "validation": [], "test": []})
    with pytest.raises(
        ValueError, match=r"keys \['train', 'val', 'test'\], found \['test', 'train', 'validation'\]"
    ):
        prepare(tmp_path, manual_dir)
    write_release(manual_dir, all_interviews(), splits={**SPLIT_IDS, "test": ["NPR-2", "NPR-2"]})
    with pytest.raises(ValueError, match=r"1 ids repeat within 'test', e.g. \['NPR-2'\]"):
        prepare(tmp_path, manual_dir)


def test_malformed_interviews(tmp_path):
    bad = all_interviews()
    bad[0]["speaker"] = bad[0]["speaker"][:1]
    manual_dir = write_release(tmp_path / "manual", bad)
    with pytest.raises(ValueError, match=r"interview 'CNN-1' has len\(utt\)=2 != len\(speaker\)=1"):
        prepare(tmp_path, manual_dir)
    bad = all_interviews()
    del bad[1]["summary"]
    write_release(manual_dir, bad)
    with pytest.raises(ValueError, match="interview 'CNN-2' has no string 'summary'"):
        prepare(tmp_path, manual_dir)
    write_release(manual_dir, all_interviews() + [interview("CNN-3")])
    with pytest.raises(ValueError, match="interview 'CNN-3' appears more than once"):
        prepare(tmp_path, manual_dir)
    write_release(manual_dir, all_interviews() + [{"summary": "no id"}])
    with pytest.raises(ValueError, match=r"interview #7 \(0-based\) has no string 'id'"):
        prepare(tmp_path, manual_dir)


def test_few_missing_ids_are_skipped_with_a_warning(tmp_path, monkeypatch):
    manual_dir = write_release(tmp_path / "manual", [i for i in all_interviews() if i["id"] != "NPR-1"])
    with pytest.raises(ValueError, match="1 of the 3 train ids .* are not in .*news_dialogue.json"):
        prepare(tmp_path, manual_dir)  # 33% > MAX_MISSING_FRACTION
    monkeypatch.setattr(mediasum, "MAX_MISSING_FRACTION", 0.5)
    with pytest.warns(UserWarning, match=r"1 of the 3 train ids .* e.g. \['NPR-1'\]; skipping them"):
        counts = prepare(tmp_path, manual_dir)
    assert counts == {"train": 2, "validation": 1, "test": 2}
    assert [row["id"] for row in read_split(tmp_path / "data", "train")] == ["NPR-3", "CNN-1"]


def test_split_left_empty_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(mediasum, "MAX_MISSING_FRACTION", 1.0)
    manual_dir = write_release(tmp_path / "manual", [i for i in all_interviews() if i["id"] != "CNN-2"])
    with pytest.raises(ValueError, match="1 of the 1 validation ids .* the split would be empty"):
        prepare(tmp_path, manual_dir)
