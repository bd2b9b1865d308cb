"""An epoch-driven language-model run too short to teach anything is said before step 1 (issue 35: the README's
fine-tuning flow trained 3 steps and reported `completed`)."""
from __future__ import annotations

from trainwise.text.run_checks import short_run_warning


def test_the_readme_run_of_3_steps_is_said_with_its_numbers_and_levers():
    said = short_run_warning(sequences=16, batch_size=16, epochs=3, seq_len=2048)
    assert said is not None
    for phrase in ("only 3 optimizer steps", "3 epochs of 1 steps", "16 packed sequences of 2,048 tokens",
                   "train.batch_size=16", "data.seq_len", "train.epochs"):
        assert phrase in said, (phrase, said)


def test_short_epochs_are_said_even_when_the_run_is_long_enough():
    said = short_run_warning(sequences=36, batch_size=4, epochs=10, seq_len=64)
    assert said is not None and "90 optimizer steps" in said and "10 epochs of 9 steps" in said


def test_a_run_long_enough_says_nothing():
    assert short_run_warning(sequences=960, batch_size=16, epochs=3, seq_len=256) is None  # 3 epochs of 60
