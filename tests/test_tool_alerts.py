from grpo_recipes.config.schema import AlertArguments
from grpo_recipes.grpo.features.tools import ToolResultIgnored, ToolsAbandoned


def feed(det, series, key="tools/call_rate", extra=None):
    return [det.update(i, {key: v, **(extra or {})}) for i, v in enumerate(series)]


def test_abandoned_fires_once_after_patience():
    cfg = AlertArguments(alert_patience=2, alert_baseline_steps=2)
    out = feed(ToolsAbandoned(cfg), [0.6, 0.6, 0.5, 0.1, 0.1, 0.1, 0.6, 0.1, 0.1])
    fired = [a.step for a in out if a]
    assert fired == [4, 8]  # one alert per episode, again after recovery


def test_abandoned_silent_when_tools_never_used_or_missing():
    cfg = AlertArguments(alert_patience=1, alert_baseline_steps=2)
    assert not any(feed(ToolsAbandoned(cfg), [0.0, 0.01, 0.0, 0.0]))
    assert ToolsAbandoned(cfg).update(0, {"loss": 1.0}) is None


def test_ignored_results():
    cfg = AlertArguments(alert_patience=1, alert_baseline_steps=2)
    det = ToolResultIgnored(cfg)
    assert det.update(0, {"tools/call_rate": 0.8, "tools/answer_from_tool_rate": 0.9}) is None
    alert = det.update(1, {"tools/call_rate": 0.8, "tools/answer_from_tool_rate": 0.1})
    assert alert and "80% of episodes call a tool" in alert.text
    assert det.update(2, {"tools/call_rate": 0.05, "tools/answer_from_tool_rate": 0.0}) is None  # rarely calls
