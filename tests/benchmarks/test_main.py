"""`make bench`'s results file (benchmarks/__main__.py)."""

from benchmarks import __main__ as bench


def test_hand_measured_sections_survive_a_rewrite(tmp_path):
    path = tmp_path / "results.md"
    assert bench.hand_sections(str(path)) == ""  # no file yet
    generated = bench.markdown({"date": "d", "cpu": "c", "cores": 2, "python": "3",
                                "tensorflow": "t", "keras": "k"},
                               {"onednn": [{"model": "m", "ratio": 0.5}]})  # fmt: skip
    hand = "\n## By hand\n\n| a |\n|---|\n| 1 |\n\n## Another\n\ntext\n"
    path.write_text(generated + hand)
    assert bench.hand_sections(str(path)) == hand
    path.write_text(generated)  # nothing by hand: nothing kept
    assert bench.hand_sections(str(path)) == ""
    assert "**onednn**" in generated and "## " not in generated
