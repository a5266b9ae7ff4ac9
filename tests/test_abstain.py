"""When a suggestion abstains, and why."""

from kb.core.abstain import (
    LOW_CONFIDENCE,
    TOO_LITTLE_TEXT,
    abstain_reason,
    content_words,
)


def test_content_words_skip_stop_words_and_short_tokens():
    assert content_words("Something is off. Not sure what happened, please take a look.") == {
        "sure", "happened", "look"}
    assert content_words("NCCL timeout on gpu-b07, job 4411") == {"nccl", "timeout", "gpu-b07", "4411"}  # "job" says nothing


def test_content_words_count_other_alphabets_and_scripts_without_spaces():
    assert content_words("Der Trainingsjob bricht ab: Speicherfehler auf Knoten") >= {
        "trainingsjob", "bricht", "speicherfehler", "knoten"}
    assert len(content_words("训练任务在节点上失败了，显存报错")) >= 5  # a full sentence is not "too little"
    assert len(content_words("失败")) == 1


def test_too_little_text_abstains_whatever_the_confidence():
    assert abstain_reason(0.99, 0.35, too_little_text=True) == TOO_LITTLE_TEXT
    assert abstain_reason(0.2, 0.35, too_little_text=False) == LOW_CONFIDENCE
    assert abstain_reason(0.35, 0.35, too_little_text=False) is None  # at the threshold it labels
