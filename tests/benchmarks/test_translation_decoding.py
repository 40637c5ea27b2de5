"""benchmarks/translation_decoding.py: the dev's settings, then the run's own and the
dev's best on the test split, each scored by sacreBLEU on the run's translations."""

import gzip

import pytest
import sacrebleu

from benchmarks import translation_decoding
from tests.support import tiny

SOURCES = ["abcde", "edcab", "aabbc", "cdeab"]


@pytest.mark.slow  # the shared tiny seq2seq run
def test_dev_settings_then_own_and_best_on_test(shared_runs, tmp_path, capsys):
    import zoo

    run = shared_runs.command("train", tiny.PAGE_RUNS["seq2seq"])
    paths = []
    for name, lines in (("src", SOURCES), ("ref.gz", [s[::-1] for s in SOURCES])):
        path = tmp_path / name
        with (gzip.open if name.endswith(".gz") else open)(path, "wt", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        paths.append(str(path))
    argv = [run, *paths, *paths, "--settings", "1:0.6,2:1.0"]
    assert translation_decoding.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split(" | ") for line in out if line.startswith(("| dev", "| test"))]
    assert [(r[0].strip("| "), r[1], r[2]) for r in rows[:2]] == [
        ("dev", "1", "0.6"),
        ("dev", "2", "1"),
    ]
    best = max(rows[:2], key=lambda r: float(r[3]))
    # On test: the run's own setting (config.json: beam 1 on an embedded task), then the
    # dev's best unless it is the same one.
    want = [("1", "0.6")] + ([] if (best[1], best[2]) == ("1", "0.6") else [(best[1], best[2])])
    assert [(r[1], r[2]) for r in rows[2:]] == want
    task = zoo.load(run)
    for r in rows[2:]:
        hyps = task.translate(SOURCES, beam_width=int(r[1]), alpha=float(r[2]))
        bleu = sacrebleu.corpus_bleu(hyps, [[s[::-1] for s in SOURCES]]).score
        assert float(r[3]) == pytest.approx(bleu, abs=0.01)
