"""RecBole's atomic `.inter` files (the MovieLens-100k check's input) prepare like any interaction log."""
import numpy as np
import pytest

from trainwise.data.prepare import PrepareOptions, prepare
from trainwise.errors import DataError
from trainwise.recsys.data import prepared_histories

HEADER = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"


def test_an_inter_file_prepares_with_last_k_and_reads_back_as_histories(tmp_path):
    rows = [(u, i, 3, 1000 * u + t) for u in range(1, 6) for t, i in enumerate([10, 20, 30, 40 + u])]
    source = tmp_path / "ml.inter"
    source.write_text(HEADER + "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows))
    result = prepare(source, tmp_path / "out", PrepareOptions(split="last-k"))
    assert result.manifest["kind"] == "interactions"
    assert result.manifest["columns"]["user"] == "user_id" and result.manifest["columns"]["time"] == "timestamp"
    assert {s: v["count"] for s, v in result.manifest["splits"].items()} == {"train": 10, "val": 5, "test": 5}
    histories = prepared_histories(tmp_path / "out")
    test_rows = np.flatnonzero(histories.split == 2)
    assert len(test_rows) == 5 and histories.num_items == 8
    # each user's test event is their last one, after their validation event
    assert np.all(histories.split[test_rows - 1] == 1)


@pytest.mark.parametrize("text, phrase", [
    ("user_id:token\tuser_id:token\ttimestamp:float\n1\t2\t3\n", "names a column twice"),
    (HEADER + "1\t2\t3\n", "line 2 has a different number of fields"),
])
def test_broken_inter_files_are_refused(tmp_path, text, phrase):
    source = tmp_path / "bad.inter"
    source.write_text(text)
    with pytest.raises(DataError, match=phrase):
        prepare(source, tmp_path / "out", PrepareOptions(split="last-k"))
