"""bench/learning_compare.py: the check stricter than the reward, and the paired gain, on hand-made rows."""

import importlib.util
import json

from helpers import REPO

spec = importlib.util.spec_from_file_location("learning_compare", REPO / "bench" / "learning_compare.py")
lc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lc)


def row(question, answer, start, end):
    return {"question": question, "answer": answer,
            "start": {"correct": float(start[1]), "completion": start[0]},
            "end": {"correct": float(end[1]), "completion": end[0]}}


def test_working_must_say_the_boxed_answer():
    r = row("Calculate -7 + -8.", "-15", ("-7 - 8 = -1. \\boxed{1}", 0), ("(-7) + (-8) = 15. \\boxed{-15}", 1))
    assert lc.working_right(r, "start") == 0.0  # wrong answer
    assert lc.working_right(r, "end") == 0.0  # right box, the working says 15
    r = row("Calculate 9 - -2.", "11", ("9 + 2 = 11. \\boxed{11}", 1), ("\\boxed{11}", 1))
    assert lc.working_right(r, "start") == 1.0
    assert lc.working_right(r, "end") == 1.0  # no working to contradict it
    r = row("Calculate -( 2 + 1 ).", "-3", ("-(2 + 1) = -(3) = -3. \\boxed{-3}", 1), ("= ( -3 ) \\boxed{-3}", 1))
    assert lc.working_right(r, "start") == lc.working_right(r, "end") == 1.0


def test_summary_pairs_questions(tmp_path):
    rows = [row("a", "1", ("\\boxed{2}", 0), ("\\boxed{1}", 1)), row("b", "-2", ("\\boxed{-2}", 1), ("x = 2 \\boxed{-2}", 1))]
    (tmp_path / "eval_completions.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    text = lc.summary("run", lc.load(str(tmp_path)))
    assert "0.500 -> 1.000, gain +0.500 +- 0.500 (1 fixed / 0 broken" in text
    assert "working 0.500 -> 0.500, gain +0.000" in text
