"""How text is cut into words: the stop-word lists."""

import subprocess
import sys

from kb.core.english_stop_words import ENGLISH_STOP_WORDS
from kb.core.text import STOP_WORDS, content_words, vague_words


def test_the_english_list_is_still_scikit_learns():
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS as sklearns

    assert ENGLISH_STOP_WORDS == sklearns


def test_vague_words_hold_both_lists_and_are_not_counted():
    assert STOP_WORDS | ENGLISH_STOP_WORDS == vague_words()
    assert content_words("please take something, the nvidia-smi output hangs") == {"nvidia-smi", "output", "hangs"}


def test_reading_a_short_ticket_does_not_import_scikit_learn():
    code = ("import sys; from kb.core.abstain import says_too_little; says_too_little('help', False, 3); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
