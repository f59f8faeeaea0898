"""Held-out evaluation: scoring and summaries, generation on a tiny model, the CLI, and a 2-step run whose Trackio log
holds the diagnostics and before/after evaluations."""

import json
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers import REPO, tiny_run_args

from grpo_recipes.config.schema import AlertArguments
from grpo_recipes.evaluation.heldout import (
    EvalSettings,
    HeldOutEvalCallback,
    evaluate,
    generate_greedy_and_sampled,
    generation_config,
    prompt_token_ids,
    score,
    summarise,
)
from grpo_recipes.grpo.alerts import default_detectors

MATH_CONFIG = REPO / "recipes" / "configs" / "math_cpu.yaml"


def record(greedy, samples, fmt=None, length=5):
    return {"greedy": greedy, "format": fmt, "length": length, "samples": samples}


def test_summarise_pass_rates_and_unscorable_rows():
    s = EvalSettings(k=4)
    records = [
        record(1.0, [1.0, 0.0, 0.0, 0.0], fmt=1.0, length=4),
        record(0.0, [0.0, 0.0, 0.0, 0.0], fmt=0.0, length=8),
        record(0.5, [0.5, 1.0, 1.0, 1.0], fmt=1.0, length=6),  # partial credit: not solved at threshold 1
        record(None, [None] * 4, fmt=1.0, length=10),  # the verifier cannot score this row
    ]
    r = summarise(records, s, has_format=True)
    assert r.pass_at_1 == pytest.approx(1 / 3)
    assert r.pass_at_k == pytest.approx(2 / 3)  # rows 1 and 3 have a solve among 4 samples
    assert r.pass_at_1_sampled == pytest.approx((0.25 + 0 + 0.75) / 3)
    assert r.format_rate == pytest.approx(0.75) and r.mean_length == 7.0
    assert r.rows == 4 and r.unscorable == 1
    assert r.as_logs() == {"eval_pass@1": r.pass_at_1, "eval_pass@k": r.pass_at_k,
                           "eval_pass@1_sampled": r.pass_at_1_sampled, "eval_format_rate": 0.75,
                           "eval_mean_length": 7.0}
    no_format = summarise(records, s, has_format=False)
    assert no_format.format_rate is None and "eval_format_rate" not in no_format.as_logs()


def test_score_calls_rewards_like_trl():
    seen = {}

    def verifier(prompts, completions, completion_ids, answer, question, trainer_state, log_extra, log_metric):
        seen.update(prompts=prompts, completions=completions, answer=answer)
        log_metric("ignored", 1.0)  # eval must accept reward-internal logging without feeding the training logs
        return [1.0, None, float("nan"), 0.0]

    rows = [{"prompt": [{"role": "user", "content": "1+1"}], "question": "1+1", "answer": "2"},
            {"prompt": [{"role": "user", "content": "2+2"}], "question": "2+2", "answer": "4"}]
    out = score(verifier, rows, [[1], [2], [3], [4]], ["a", "b", "c", "d"], per_row=2)
    assert out == [1.0, None, None, 0.0]
    assert seen["answer"] == ["2", "2", "4", "4"]
    assert seen["completions"][1] == [{"role": "assistant", "content": "b"}]


def test_k_0_is_greedy_only_and_none_takes_the_configs_eval_k():
    recipe, grpo = SimpleNamespace(eval_k=4, eval_max_new_tokens=8, eval_generation_batch_size=2,
                                   correctness_threshold=1.0), SimpleNamespace(seed=0, max_completion_length=16)
    assert EvalSettings.from_configs(recipe, grpo, k=0).k == 0
    assert EvalSettings.from_configs(recipe, grpo).k == 4 and EvalSettings.from_configs(recipe, grpo, k=2).k == 2


def test_generation_settings_follow_training_sampling():
    s = EvalSettings(k=3, max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=20)
    greedy = generation_config(s, False, pad_id=0, eos_ids=[2])
    sampled = generation_config(s, True, pad_id=0, eos_ids=[2])
    assert not greedy.do_sample and greedy.max_new_tokens == 7
    assert sampled.do_sample and (sampled.temperature, sampled.top_p, sampled.top_k) == (0.7, 0.9, 20)


def test_shared_prefill_generates_what_plain_generate_does(tiny_model):
    """One prompt prefill reused for the greedy pass and k sampling passes of one sample per prompt each: the same
    tokens as generate() on its own, called the same way, the samples prompt by prompt."""
    model, tok = tiny_model
    model.eval()
    questions = ["1+1?", "What is the sum of seventeen and twenty-five, written as a number in a box?", "3-2"]
    s = EvalSettings(k=3, max_new_tokens=6, temperature=0.9)
    ids = prompt_token_ids(tok, [[{"role": "user", "content": q}] for q in questions], s)
    assert len({len(i) for i in ids}) == 3  # left padding is exercised
    eos, pad = [tok.eos_token_id], tok.pad_token_id
    greedy_cfg, sample_cfg = generation_config(s, False, pad, eos), generation_config(s, True, pad, eos)
    torch.manual_seed(7)
    greedy, sampled = generate_greedy_and_sampled(model, ids, greedy_cfg, sample_cfg, 3, eos)

    def plain(config, n):
        width = max(map(len, ids))
        x = torch.tensor([[pad] * (width - len(i)) + i for i in ids])
        m = (torch.arange(width) >= torch.tensor([width - len(i) for i in ids]).unsqueeze(1)).long()
        out = model.generate(input_ids=x, attention_mask=m, generation_config=config, num_return_sequences=n)
        cut = [next((j + 1 for j, t in enumerate(seq) if t in eos), len(seq)) for seq in out[:, width:].tolist()]
        return [seq[:n] for seq, n in zip(out[:, width:].tolist(), cut)]

    torch.manual_seed(7)
    assert greedy == plain(greedy_cfg, 1)
    passes = [plain(sample_cfg, 1) for _ in range(3)]
    assert sampled == [p[i] for i in range(3) for p in passes]
    assert len(sampled) == 9 and len({tuple(s) for s in sampled}) > 3  # distinct samples: each pass draws anew


def test_evaluate_is_seeded_restores_mode_and_leaves_training_rng_alone(tiny_model):
    model, tok = tiny_model

    def length_is_even(prompts, completions, completion_ids, **_):
        return [float(len(ids) % 2 == 0) for ids in completion_ids]
    length_is_even.__name__ = "length_is_even"

    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "answer": str(2 * i)} for i in range(4)]
    s = EvalSettings(k=3, max_new_tokens=6, batch_size=2)
    model.train()
    torch.manual_seed(123)
    first, _ = evaluate(model, tok, rows, length_is_even, None, s, [tok.eos_token_id])
    after_eval = torch.rand(3)
    torch.manual_seed(123)
    expected = torch.rand(3)
    assert torch.equal(after_eval, expected)  # evaluation used a forked RNG
    assert model.training
    second, _ = evaluate(model, tok, rows, length_is_even, None, s, [tok.eos_token_id])
    assert first == second  # same seed, same samples
    assert len(first) == 4 and all(len(r["samples"]) == 3 for r in first)
    assert all(1 <= r["length"] <= 6 for r in first)


def test_callback_evaluates_held_out_rows_only():
    from grpo_recipes.run.runner import prepare
    from grpo_recipes.tasks.data import question_key

    run = prepare("math", ["--config", str(MATH_CONFIG), "--eval_size", "12", "--train_size", "60", "--output_dir",
                           "unused"])
    recipe, grpo, train, held_out, funcs = run.recipe, run.training, run.train, run.held_out, run.funcs
    trainer = SimpleNamespace(args=grpo)
    cb = HeldOutEvalCallback.from_recipe(trainer, recipe, held_out, funcs)
    assert len(cb.rows) == 12
    train_q = {question_key(q) for q in train["question"]}
    assert {question_key(r["question"]) for r in cb.rows} == {question_key(q) for q in held_out["question"]}
    assert not train_q & {question_key(r["question"]) for r in cb.rows}
    assert cb.correctness.__name__ == "math_correctness" and cb.fmt.__name__ == "boxed_format"  # role "format"
    assert cb.settings.max_new_tokens == grpo.max_completion_length and cb.settings.k == recipe.eval_k == 0
    assert cb.settings.temperature == grpo.temperature


def test_eval_cli_on_a_checkpoint(tiny_model_dir, run_env):
    from grpo_recipes.cli import main

    out = run_env / "eval.json"
    rc = main(["eval", "--recipe", "math", "--model", str(tiny_model_dir), "--limit", "3", "--k", "2",
               "--output", str(out), "--", "--max_completion_length", "6", "--format_reward", "boxed_format",
               "--output_dir", str(run_env / "unused")])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["rows"] == 3 and report["k"] == 2
    assert report["correctness_reward"] == "math_correctness" and report["format_reward"] == "boxed_format"
    assert report["pass_at_1"] is not None and report["format_rate"] is not None
    assert 1 <= report["mean_length"] <= 6
    # --k 0 is greedy pass@1 only, as eval_k 0 is (the config's eval_k is not taken instead)
    assert main(["eval", "--recipe", "math", "--model", str(tiny_model_dir), "--limit", "2", "--k", "0", "--output",
                 str(out), "--", "--max_completion_length", "4", "--eval_k", "3",
                 "--output_dir", str(run_env / "unused")]) == 0
    report = json.loads(out.read_text())
    assert report["k"] == 0 and report["pass_at_k"] is None
    assert main(["eval", "--recipe", "math", "--model", str(tiny_model_dir), "--k", "-1"]) == 2
    assert main(["eval", "--recipe", "nosuchrecipe", "--model", str(tiny_model_dir)]) == 2


def test_eval_cli_reads_a_training_output_dir_that_holds_checkpoints(tiny_model_dir, run_env, monkeypatch, capsys):
    """README: `grpo-recipes eval --recipe math --model outputs/math_grpo`, run where a default training run wrote
    its model and checkpoints (the config's output_dir). Evaluation writes no checkpoints, so the training-output
    check does not apply; training into that folder is still refused."""
    import shutil

    from grpo_recipes.cli import main
    from grpo_recipes.errors import ConfigError
    from grpo_recipes.run.runner import prepare
    from grpo_recipes.state.checkpoint import mark_complete

    monkeypatch.chdir(run_env)
    out = run_env / "outputs" / "math_grpo"  # math_cpu.yaml's output_dir
    shutil.copytree(tiny_model_dir, out)
    checkpoint = out / "checkpoint-5"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    mark_complete(checkpoint, 5)
    with pytest.raises(ConfigError, match="outputs/math_grpo already holds checkpoints of an earlier run"):
        prepare("math", ["--config", str(MATH_CONFIG)])
    capsys.readouterr()
    assert main(["eval", "--recipe", "math", "--model", "outputs/math_grpo", "--limit", "2", "--k", "1", "--",
                 "--max_completion_length", "4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 2 and report["model"] == "outputs/math_grpo"


def trackio_rows(trackio_dir, project):
    """(metrics of every row, alerts, (Trackio step, metrics) of every row), in log order."""
    with sqlite3.connect(trackio_dir / f"{project}.db") as con:
        stepped = [(step, json.loads(m)) for step, m in con.execute("SELECT step, metrics FROM metrics ORDER BY id")]
        alerts = con.execute("SELECT title, text FROM alerts").fetchall()
    return [m for _, m in stepped], alerts, stepped


def test_default_run_logs_diagnostics_and_before_after_eval(tiny_model_dir, run_env):
    out = run_env / "out"
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), *tiny_run_args(tiny_model_dir, out, 2, "--eval_k", "2")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics, alerts, stepped = trackio_rows(run_env / "trackio", "grpo-recipes-math")
    # Trackio's step is the training step (tracking.TrackioRun): the evaluations before the first step and after the
    # last, one training record, one completions table (TRL's, whose rows name their step) and the reward timings of
    # each step. test_resume.py checks the same against the runs' own records, across kills and resumes.
    assert [s for s, m in stepped if "eval/pass@1" in m] == [0, 2]
    assert [s for s, m in stepped if "train/loss" in m] == [1, 2]
    assert all(s == m["train/global_step"] for s, m in stepped if "train/global_step" in m)
    tables = [(s, {r["step"] for r in m["completions"]["_value"]}) for s, m in stepped if "completions" in m]
    assert tables == [(1, {1}), (2, {2})]
    assert [s for s, m in stepped if "walltime/rewards/math_correctness" in m] == [1, 2]
    train = [m for m in metrics if "train/diag/adv_mean" in m]
    assert {m["train/global_step"] for m in train} == {1, 2}
    for m in train:
        for key in ("adv_mean", "adv_std", "adv_abs_mean", "adv_zero_frac", "solve_all", "solve_none", "solve_mixed",
                    "pass@1", "pass@k", "none_rate/math_correctness", "none_rate/boxed_format"):
            assert f"train/diag/{key}" in m, key
        assert "train/entropy" in m
        # Captured from the same batch TRL scored: buckets partition the groups, pass@1 is the correctness mean.
        assert m["train/diag/solve_all"] + m["train/diag/solve_none"] + m["train/diag/solve_mixed"] == pytest.approx(1)
        assert m["train/diag/pass@1"] == pytest.approx(m["train/rewards/math_correctness/mean"])
    evals = {m["train/global_step"]: m for m in metrics if "eval/pass@1" in m}
    assert set(evals) == {0, 2}  # before the first step and after the last
    # The evaluation logged at step 2 must not cancel that step's own training log.
    assert {m["train/global_step"] for m in metrics if "train/loss" in m} == {1, 2}
    for m in evals.values():
        assert {"eval/pass@k", "eval/pass@1_sampled", "eval/mean_length"} <= set(m)
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["start"]["step"] == 0 and summary["end"]["step"] == 2 and summary["rows"] == 8
    assert summary["end"]["pass_at_1"] == evals[2]["eval/pass@1"]
    gain = summary["greedy_gain"]
    assert gain["rows"] == 8 and gain["gain"] == pytest.approx(summary["end"]["pass_at_1"] - summary["start"]["pass_at_1"])
    lines = [json.loads(line) for line in (out / "eval_completions.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and all(r["question"] and r["start"]["step"] == 0 and r["end"]["step"] == 2 for r in lines)
    assert sum(bool(r["end"]["correct"]) for r in lines) / 8 == summary["end"]["pass_at_1"]
    # With eval_k, the samples' accuracy too: per question in the completions file, paired in the summary.
    for when in ("start", "end"):
        assert sum(r[when]["sampled"] for r in lines) / 8 == pytest.approx(summary[when]["pass_at_1_sampled"])
    sampled = summary["sampled_gain"]
    assert sampled["rows"] == 8 and sampled["gain"] == pytest.approx(
        summary["end"]["pass_at_1_sampled"] - summary["start"]["pass_at_1_sampled"])
    assert "held-out evaluation, 8 rows (step 0 -> step 2)" in proc.stdout
    # What can honestly be asserted of a random tiny model: 2 steps raise none of the training alerts, as patience (5)
    # is not reached (its completions all hit the length limit); that healthy training stays silent is shown on
    # synthetic streams in test_alerts.py.
    ours = {d.title for d in default_detectors(AlertArguments(), ["math_correctness", "boxed_format"], "math_correctness",
                                               None)}
    assert [a for a in alerts if a[0] in ours] == []


def test_paired_gain_uses_the_spread_of_per_question_differences():
    from grpo_recipes.evaluation.heldout import paired_gain

    rec = lambda *vals: [{"greedy": v} for v in vals]  # noqa: E731
    # 4 questions: one newly right, one newly wrong, two unchanged; one unscored row is left out of the pairs.
    g = paired_gain(rec(0.0, 1.0, 1.0, 0.0, None), rec(1.0, 0.0, 1.0, 0.0, 1.0), threshold=1.0)
    assert g["rows"] == 4 and g["gain"] == 0.0
    assert g["se"] == pytest.approx((2 / 3 / 4) ** 0.5)  # sample variance of (+1, -1, 0, 0) is 2/3
    same = paired_gain(rec(1.0, 0.0), rec(1.0, 0.0), threshold=1.0)
    assert same == {"gain": 0.0, "se": 0.0, "rows": 2}  # nothing changed: no noise to report
    assert paired_gain(rec(None), rec(1.0), threshold=1.0) is None


def test_the_sampled_gain_pairs_each_questions_share_of_solving_samples():
    from grpo_recipes.evaluation.heldout import paired_gain, solved_sampled

    rec = lambda *samples: [{"greedy": 1.0, "samples": list(s)} for s in samples]  # noqa: E731
    # Greedy is right throughout, so its gain is 0; the samples go from 1/4 to 3/4 on the first question and stay at
    # 2/4 on the second (an unscorable sample is left out of its row's share); the third row has no scored sample.
    first = rec((1.0, 0.0, 0.0, 0.0), (1.0, 1.0, None, 0.0, 0.0), (None,))
    last = rec((1.0, 1.0, 1.0, 0.0), (0.0, 1.0, 1.0, 0.0), (1.0,))
    assert paired_gain(first, last, threshold=1.0)["gain"] == 0.0
    g = paired_gain(first, last, threshold=1.0, solved=solved_sampled)
    assert g["rows"] == 2 and g["gain"] == pytest.approx(0.25)
    assert g["se"] == pytest.approx(0.25)  # differences (+0.5, 0): sample sd 0.354, over sqrt(2)
    # Greedy only (eval_k 0): there is no sampled gain to report, not a gain of zero.
    assert paired_gain(rec(()), rec(()), threshold=1.0, solved=solved_sampled) is None


def test_an_evaluation_reports_its_rows_as_they_are_done(monkeypatch):
    """A progress bar over the held-out rows (tqdm gives the time left), fed batch by batch."""
    from grpo_recipes.evaluation import heldout

    seen = []

    class Bar:
        def __init__(self, total, **kwargs):
            seen.append(("total", total, kwargs["unit"], kwargs["delay"]))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            seen.append(("done", n))

    monkeypatch.setattr(heldout, "tqdm", Bar)
    monkeypatch.setattr(heldout, "prompt_token_ids", lambda tok, prompts, *a: [[1]] * len(prompts))
    monkeypatch.setattr(heldout, "generate_greedy_and_sampled", lambda model, ids, *a: ([[2]] * len(ids), []))
    monkeypatch.setattr(heldout, "scored_records", lambda tok, batch, *a: [{} for _ in batch])

    class Tokenizer:
        pad_token_id = 0

    settings = heldout.EvalSettings(max_new_tokens=4, batch_size=4, k=0)
    rows = [{"prompt": [{"role": "user", "content": str(i)}]} for i in range(10)]
    assert len(heldout.evaluate_rows(None, Tokenizer(), rows, None, None, settings, [0])) == 10
    assert seen == [("total", 10, "row", 2), ("done", 4), ("done", 4), ("done", 2)]
