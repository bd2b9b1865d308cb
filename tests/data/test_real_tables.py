"""Issue 28: prepare on the tables people really have. Each was a traceback (exit 1) or silent damage (exit 0)."""
from __future__ import annotations

import numpy as np
import pytest

import trainwise.data
from trainwise.data.prepare import PrepareOptions, prepare
from trainwise.data.table_files import first_non_utf8, read_table
from trainwise.errors import DataError


def write(path, text: str | bytes):
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def rows(n: int, seed: int = 0, classes: int = 2) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{rng.normal():.3f},{i % classes}" for i in range(n)]


def table(path, header: str, lines: list[str], sep: str = ","):
    return write(path, "\n".join([header.replace(",", sep), *(line.replace(",", sep) for line in lines)]) + "\n")


def test_latin1_header_and_values_are_refused_naming_the_byte_then_read_with_encoding(tmp_path):
    head = write(tmp_path / "head.csv", b"caf\xe9,label\n1,0\n2,1\n" + b"3,0\n4,1\n" * 10)
    values = write(tmp_path / "values.csv", b"town,label\n" + b"oslo,0\nrome,1\n" * 10 + b"m\xe1laga,0\n" * 10)
    for source, line in ((head, 1), (values, 22)):
        with pytest.raises(DataError, match=rf"is not UTF-8 \(line {line}: byte 0x(e9|e1)\).*--encoding latin-1"):
            prepare(source, tmp_path / f"out-{source.stem}", PrepareOptions(), workers=1)
    manifest = prepare(head, tmp_path / "h", PrepareOptions(encoding="latin-1"), workers=1).manifest
    assert manifest["features"] == ["café"]
    manifest = prepare(values, tmp_path / "v", PrepareOptions(encoding="latin-1"), workers=1).manifest
    assert "town=málaga" in manifest["features"]
    with pytest.raises(DataError, match="--encoding 'latin-9x': not an encoding"):
        prepare(head, tmp_path / "x", PrepareOptions(encoding="latin-9x"), workers=1)


def test_first_non_utf8_finds_a_byte_across_chunk_edges(tmp_path):
    body = b"a\n" * (1 << 19) + "é".encode()  # a two-byte character split by the 1 MiB chunk edge ...
    assert first_non_utf8(write(tmp_path / "ok.csv", b"x" + body)) is None
    assert first_non_utf8(write(tmp_path / "bad.csv", body + b"\n\xff")) == ((1 << 19) + 2, 0xFF)


def test_duplicate_and_nameless_columns(tmp_path):
    with pytest.raises(DataError, match=r"names a column twice: 'a' \(columns 1, 2\)"):
        prepare(write(tmp_path / "d.csv", "a,a,label\n1,2,0\n3,4,1\n"), tmp_path / "o", PrepareOptions())
    # Excel's trailing comma: an empty nameless column is left out, one with values gets a name
    read = read_table(write(tmp_path / "n.csv", "a,,label,\n1,7,0,\n2,,1,\n"))
    assert list(read.columns) == ["a", "column_2", "label"]
    assert any("column 4 has no name and no values; left out" in n for n in read.notes)


def test_an_infinite_label_is_refused_naming_the_row(tmp_path):
    source = table(tmp_path / "t.csv", "x,label", ["1,0", "2,inf", "3,1", "4,-inf"])
    with pytest.raises(DataError, match=r"label column 'label' holds 2 values that are not finite.*row 2: inf, "
                                        r"row 4: -inf"):
        prepare(source, tmp_path / "o", PrepareOptions())


def test_a_table_of_only_a_label_has_no_feature_columns(tmp_path):
    source = table(tmp_path / "t.csv", "label", ["0", "1"] * 10)
    with pytest.raises(DataError, match="no feature columns: the table has only the label column 'label'"):
        prepare(source, tmp_path / "o", PrepareOptions())


def test_infinite_feature_cells_are_missing_and_named(tmp_path):
    lines = rows(60)
    lines[4] = "inf,0"
    lines[9] = "1e400,1"  # overflows to inf when read
    lines[11] = "1e39,1"  # finite, but not in float32
    source = table(tmp_path / "t.csv", "x,label", lines)
    result = prepare(source, tmp_path / "o", PrepareOptions(), workers=1)
    warning = next(w for w in result.warnings if "column 'x'" in w)
    assert "3 cells are infinite or too large for float32 (row 5: inf, row 10: inf, row 12: 1e+39)" in warning
    assert all(np.isfinite(result.manifest["normalization"]["mean"] + result.manifest["normalization"]["std"]))
    for split in ("train", "val", "test"):
        data = trainwise.data.open(tmp_path / "o", split)
        inputs, _ = data.__getitems__(list(range(len(data))))
        assert bool(inputs.isfinite().all()), split


def test_a_mostly_numeric_column_warns_and_the_user_chooses(tmp_path):
    lines = [f"{'unknown' if i % 3 == 0 else f'{i * 1.5:.1f}'},{i % 2}" for i in range(90)]
    source = table(tmp_path / "t.csv", "x,label", lines)
    default = prepare(source, tmp_path / "a", PrepareOptions(), workers=1)
    warning = next(w for w in default.warnings if "column 'x'" in w)
    assert "60 of 90 values are numbers but 30 are text (e.g. 'unknown')" in warning
    assert "--numeric x" in warning and "--categorical x" in warning
    numeric = prepare(source, tmp_path / "b", PrepareOptions(numeric="x"), workers=1)
    assert numeric.manifest["features"] == ["x"] and not any("are numbers but" in w for w in numeric.warnings)
    assert any("30 text cells read as missing (--numeric), e.g. 'unknown'" in w for w in numeric.warnings)
    quiet = prepare(source, tmp_path / "c", PrepareOptions(categorical="x"), workers=1)
    assert not any("column 'x'" in w for w in quiet.warnings) and "x=<other>" in quiet.manifest["features"]
    with pytest.raises(DataError, match="--numeric nope: .* has no column 'nope'; columns: x, label"):
        prepare(source, tmp_path / "d", PrepareOptions(numeric="nope"))
    with pytest.raises(DataError, match="--categorical label: that is the label column"):
        prepare(source, tmp_path / "d", PrepareOptions(categorical="label"))


def test_a_one_class_table_is_refused(tmp_path):
    source = table(tmp_path / "t.csv", "x,label", [f"{i},yes" for i in range(20)])
    with pytest.raises(DataError, match=r"label column 'label' holds one class \('yes'\) in all 20 rows"):
        prepare(source, tmp_path / "o", PrepareOptions())


def test_the_task_is_said_with_how_to_choose_the_other(tmp_path):
    hundred = table(tmp_path / "h.csv", "x,target", [f"{i * 0.1:.1f},{i}" for i in range(100)])
    result = prepare(hundred, tmp_path / "a", PrepareOptions(), workers=1)
    assert result.manifest["task"] == "regression"  # 100 whole numbers, one row each: not 100 classes
    assert any(n.startswith("task: regression (the labels are whole numbers with 100 distinct values") and
               "--task classification" in n for n in result.notes)
    forced = prepare(hundred, tmp_path / "b", PrepareOptions(task="classification"), workers=1)
    assert "task: classification (--task classification), 100 classes." in forced.notes
    few = table(tmp_path / "f.csv", "x,target", rows(50, classes=5))
    result = prepare(few, tmp_path / "c", PrepareOptions(), workers=1)
    assert result.manifest["task"] == "classification"
    assert any("5 classes (the labels are whole numbers" in n and "--task regression" in n for n in result.notes)
    again = prepare(few, tmp_path / "c", PrepareOptions(), workers=1)  # up to date: still says what it is
    assert again.status == "up-to-date" and again.notes == result.notes


@pytest.mark.parametrize("sep, name", [("\t", "tab"), (";", "semicolon")])
def test_a_csv_separated_otherwise_is_read_as_such_and_said(tmp_path, sep, name):
    source = table(tmp_path / "t.csv", "a,b,label", [f"{i},{i * 2},{i % 2}" for i in range(30)], sep=sep)
    result = prepare(source, tmp_path / "o", PrepareOptions(), workers=1)
    assert result.manifest["features"] == ["a", "b"]
    assert f"t.csv: read as {name}-separated (its header line has {name}s and no commas between its names)." \
        in result.notes
    quoted = write(tmp_path / "q.csv", f'"a,b"{sep}label\n' + "".join(f"{i}{sep}{i % 2}\n" for i in range(30)))
    assert prepare(quoted, tmp_path / "q", PrepareOptions(), workers=1).manifest["features"] == ["a,b"]


def test_empty_held_out_splits_are_warned(tmp_path):
    source = table(tmp_path / "t.csv", "x,label", ["1,0", "2,1"])
    result = prepare(source, tmp_path / "o", PrepareOptions(), workers=1)
    assert any(w.startswith("the validation split is empty: 0.1 of 2 samples rounds to none") for w in result.warnings)
    assert any(w.startswith("the test split is empty") for w in result.warnings)
    asked = prepare(source, tmp_path / "p", PrepareOptions(val_fraction=0, test_fraction=0), workers=1)
    assert not any("split is empty" in w for w in asked.warnings)  # none asked for, none missed


def test_duplicate_events_are_dropped_and_counted_so_last_k_cannot_leak(tmp_path):
    lines = [f"{u},{i},{1000 + 10 * i + u}" for u in range(6) for i in range(8)]
    source = table(tmp_path / "log.csv", "user_id,item_id,timestamp", lines + lines)  # every row twice
    result = prepare(source, tmp_path / "o", PrepareOptions(split="last-k"), workers=1)
    assert any(w.startswith("dropped 48 of 96 events that repeat an earlier row exactly") for w in result.warnings)
    events = {}
    for split in ("val", "test"):
        data = trainwise.data.open(tmp_path / "o", split)
        events[split] = {(int(u), int(i), int(t)) for (u, i), t in zip(data.column("inputs"), data.column("timestamp"))}
    assert events["val"] and events["test"] and not events["val"] & events["test"]
    kept = prepare(source, tmp_path / "k", PrepareOptions(split="last-k", keep_duplicates=True), workers=1)
    assert sum(s["count"] for s in kept.manifest["splits"].values()) == 96


def test_last_k_zero_warns_and_negative_is_refused(tmp_path):
    lines = [f"{u},{i},{1000 + i}" for u in range(3) for i in range(5)]
    source = table(tmp_path / "log.csv", "user_id,item_id,timestamp", lines)
    result = prepare(source, tmp_path / "o", PrepareOptions(split="last-k", last_k=0), workers=1)
    assert any(w.startswith("the validation split is empty: --last-k 0 holds out no events") for w in result.warnings)
    with pytest.raises(DataError, match="--last-k -1"):
        prepare(source, tmp_path / "n", PrepareOptions(split="last-k", last_k=-1))


def test_a_latin1_interaction_log_is_refused_then_read_with_encoding(tmp_path):
    inter = write(tmp_path / "x.inter", b"user_id:token\titem_id:token\ttimestamp:float\n" +
                  b"".join(b"u%d\xe9\ti%d\t%d\n" % (u, i, i) for u in range(3) for i in range(4)))
    with pytest.raises(DataError, match=r"x.inter is not UTF-8 \(line 2: byte 0xe9\)"):
        prepare(inter, tmp_path / "o", PrepareOptions())
    log = write(tmp_path / "log.csv", b"user_id,item_id,timestamp\n" +
                b"".join(b"u%d\xe9,i%d,%d\n" % (u, i, i) for u in range(3) for i in range(4)))
    for source in (inter, log):
        manifest = prepare(source, tmp_path / source.stem, PrepareOptions(encoding="latin-1"), workers=1).manifest
        assert manifest["num_users"] == 3


def test_a_dataset_prepared_before_the_new_options_is_still_up_to_date(tmp_path):
    import json

    from trainwise.data.shards import write_manifest

    source = table(tmp_path / "t.csv", "x,label", rows(40))
    prepare(source, tmp_path / "o", PrepareOptions(), workers=1)
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    for added in ("keep_duplicates", "encoding", "numeric", "categorical", "max_image_pixels"):
        del manifest["options"][added]  # as an older trainwise recorded them
    write_manifest(tmp_path / "o", {k: v for k, v in manifest.items() if k not in ("format", "format_version")})
    assert prepare(source, tmp_path / "o", PrepareOptions(), workers=1).status == "up-to-date"
    assert prepare(source, tmp_path / "o", PrepareOptions(numeric="x"), workers=1).status == "prepared"
