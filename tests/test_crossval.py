"""Cross-validated figures on labelled incidents: known answers, the owner-first ranking, the shipped weights."""

import json

import numpy as np
import pytest

from kb.core.files import per_model_file
from kb.core.settings import DATA_DIR, DEFAULT_EMBEDDING_MODEL, LIGHT_EMBEDDING_MODEL
from kb.engine.classify import FEATURES, Calibration, LabelFeatures
from kb.engine.crossval import cross_validate, format_left_out
from kb.engine.history import BUNDLED_SOURCE

LABELS = ["a1", "a2", "b1", "b2"]
DIMENSION = {"a1": "alpha", "a2": "alpha", "b1": "beta", "b2": "beta"}


def _samples(n: int, informative: float, seed: int = 0) -> tuple[list[LabelFeatures], list[str]]:
    """Incidents whose first feature marks the true label with probability ``informative``."""
    rng = np.random.default_rng(seed)
    samples, truths = [], []
    for _ in range(n):
        truth = int(rng.integers(len(LABELS)))
        matrix = rng.normal(scale=0.1, size=(len(LABELS), len(FEATURES)))
        marked = truth if rng.random() < informative else int(rng.integers(len(LABELS)))
        matrix[marked, 0] += 1.0
        samples.append(LabelFeatures(LABELS, matrix))
        truths.append(LABELS[truth])
    return samples, truths


def test_an_informative_feature_scores_high_and_noise_scores_near_chance():
    informative = cross_validate(*_samples(400, 0.9), DIMENSION.get)
    noise = cross_validate(*_samples(400, 0.0), DIMENSION.get)
    assert informative.top1 > 0.85 and informative.dimension >= informative.top1
    assert noise.top1 < 0.4 and noise.top3 <= 0.85
    assert informative.n == 400 and sum(g.n for g in informative.per_dimension.values()) == 400
    assert set(informative.per_dimension) == {"alpha", "beta"}


def test_the_readings_lever_refits_without_the_reading_feature():
    """When the readings are what tells the causes apart, the figures without them fall to chance;
    when another feature does, they stay."""
    samples, truths = _samples(400, 0.9)
    reading, read = FEATURES.index("reading"), []
    for f in samples:  # the informative first column swapped into the reading feature's place
        matrix = f.matrix.copy()
        matrix[:, [0, reading]] = f.matrix[:, [reading, 0]]
        read.append(LabelFeatures(f.labels, matrix))
    by_readings = cross_validate(read, truths, DIMENSION.get)
    assert by_readings.top1 > 0.85 and by_readings.without_readings.top1 < 0.4
    by_evidence = cross_validate(samples, truths, DIMENSION.get)
    assert abs(by_evidence.without_readings.top1 - by_evidence.top1) < 0.03
    assert by_evidence.without_readings.without_readings is None


def test_the_expert_readings_lever_puts_the_labelled_readings_in_the_readers_place():
    """A reader that reads nothing scores near chance; the experts' readings, where they tell the
    causes apart, score high, and an incident without them keeps the reader's column."""
    samples, truths = _samples(400, 0.0)
    experts = [np.where(np.array(LABELS) == t, 2.0, -2.0) if n < 300 else None for n, t in enumerate(truths)]
    figures = cross_validate(samples, truths, DIMENSION.get, expert_readings=experts)
    expert = figures.with_expert_readings
    assert figures.top1 < 0.4 and 0.7 < expert.top1 < 0.9 and expert.n == 400
    assert expert.with_expert_readings is None and figures.without_readings.with_expert_readings is None
    assert "with the expert's readings in place of the reader's" in format_left_out(figures)
    assert cross_validate(samples, truths, DIMENSION.get, expert_readings=[None] * 400).with_expert_readings is None
    with pytest.raises(ValueError):
        cross_validate(samples, truths, DIMENSION.get, expert_readings=experts[:10])


def test_every_incident_is_scored_once_by_weights_fitted_without_it(monkeypatch):
    import kb.engine.classify as classify

    fitted_on: list[set[int]] = []
    scored_by: dict[int, list[int]] = {}
    fit, predict = classify.fit_weights, classify.predict

    def spy_fit(samples, truths, *args, **kwargs):
        fitted_on.append({id(s) for s in samples})
        return fit(samples, truths, *args, **kwargs)

    def spy_predict(features, weights):
        scored_by.setdefault(id(features), []).append(len(fitted_on) - 1)
        return predict(features, weights)

    monkeypatch.setattr(classify, "fit_weights", spy_fit)
    monkeypatch.setattr(classify, "predict", spy_predict)
    samples, truths = _samples(100, 0.9)
    cross_validate(samples, truths, DIMENSION.get, with_levers=False)
    assert len(fitted_on) == 5 and all(len(fold) == 80 for fold in fitted_on)
    assert sorted(scored_by) == sorted(map(id, samples))
    assert all(len(fits) == 1 and sample not in fitted_on[fits[0]] for sample, fits in scored_by.items())


def test_the_suggested_cause_is_the_owners_best():
    """The owner (the dimension with the most probability) decides the suggestion, as the engine does:
    one beta cause at 0.4 loses to two alpha causes at 0.35 and 0.25."""
    matrix = np.zeros((len(LABELS), len(FEATURES)))
    matrix[:, 0] = np.log([0.35, 0.25, 0.4, 1e-6])
    samples = [LabelFeatures(LABELS, matrix.copy()) for _ in range(50)]
    figures = cross_validate(samples, ["a1"] * 50, DIMENSION.get)
    assert figures.top1 == 1.0 and figures.dimension == 1.0


def test_too_few_incidents_give_no_figures_and_labels_outside_the_set_are_left_out():
    samples, truths = _samples(4, 0.9)
    assert cross_validate(samples, truths, DIMENSION.get) is None
    samples, truths = _samples(100, 0.9)
    figures = cross_validate(samples, truths[:90] + ["unknown"] * 10, DIMENSION.get)
    assert figures.n == 90


def test_the_figures_survive_the_calibration_file_and_print_as_a_table(tmp_path):
    figures = cross_validate(*_samples(200, 0.8), DIMENSION.get)
    Calibration(left_out=figures).save(tmp_path / "c.json")
    loaded = Calibration.load(tmp_path / "c.json").left_out
    assert loaded == figures
    table = format_left_out(loaded)
    assert f"| all | 200 | {figures.top1:.3f} |" in table and "| alpha |" in table


@pytest.mark.parametrize("model", [DEFAULT_EMBEDDING_MODEL, LIGHT_EMBEDDING_MODEL])
def test_the_shipped_weights_carry_figures_on_every_bundled_real_report(model):
    """Each bundled model's shipped calibration was fitted on the bundled data as it is now: its
    left-out figures count every real (not written) bundled report, so adding reports without
    refitting fails here."""
    shipped = Calibration.load(per_model_file(DATA_DIR / "calibration", f"sentence-transformers:{model}", ".json"))
    assert shipped is not None, f"no weights ship for {model}: `pmkb calibrate --out` them"
    real = sum(json.loads(line)["source"] != BUNDLED_SOURCE  # a written report's source is pmkb itself
               for path in (DATA_DIR / "incidents").glob("*.jsonl") for line in path.read_text().splitlines())
    assert shipped.left_out is not None and shipped.left_out.n == real
    assert 0.0 < shipped.left_out.top1 <= shipped.left_out.top3 <= 1.0
