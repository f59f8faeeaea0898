"""The chatml_tools template and its parser: render -> parse round trips, malformed calls, TRL's own checks."""

import json

import pytest
from transformers import AutoTokenizer

from grpo_recipes.tools.templates import (
    CHATML_TOOLS,
    INVALID_CALL,
    ToolTemplateError,
    check_model_template,
    install,
    parse_assistant,
)


def call(name, **args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


def render_turn(tok, message) -> str:
    """The assistant turn as the template writes it, minus the generation prompt: what a model would generate."""
    head = [{"role": "user", "content": "q"}]
    prompt = tok.apply_chat_template(head, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(head + [message], tokenize=False)
    assert full.startswith(prompt)
    return full[len(prompt):]


ROUND_TRIPS = [
    {"role": "assistant", "content": "The answer is \\boxed{94}."},
    {"role": "assistant", "content": "", "tool_calls": [call("calculator", expression="95 - 21 / 21")]},
    {"role": "assistant", "content": "Let me compute.", "tool_calls": [call("calculator", expression="1+2")]},
    {"role": "assistant", "content": "", "tool_calls": [call("calculator", expression="1+2"),
                                                        call("python", code='print("a}b</tool_call>"[0])\n')]},
    {"role": "assistant", "content": "", "tool_calls": [call("lookup", key="naïve ü", n=3, deep={"a": [1, None]})]},
    {"role": "assistant", "content": "", "tool_calls": [call("noargs")]},
]


@pytest.mark.parametrize("message", ROUND_TRIPS)
def test_round_trip_render_then_parse(tool_tokenizer, message):
    text = render_turn(tool_tokenizer, message)
    assert parse_assistant(text) == message
    ids = tool_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tool_tokenizer.parse_response(ids) == message  # the path TRL takes: token ids, EOS included


@pytest.mark.parametrize("message", [m for m in ROUND_TRIPS if '</tool_call>' not in json.dumps(m)])
def test_transformers_parser_agrees_on_well_formed_turns(tool_tokenizer, message):
    """The response_template saved with the tokenizer reads well-formed turns as our parser does."""
    from transformers.utils.chat_parsing.response_parser import parse_response

    text = render_turn(tool_tokenizer, message)
    theirs = parse_response(text, CHATML_TOOLS.response_template, prefix="")
    theirs.setdefault("content", "")
    theirs["content"] = theirs["content"].removesuffix("\n")  # their text field keeps the layout newline
    assert theirs == message


def test_string_arguments_are_decoded(tool_tokenizer):
    msg = parse_assistant('<tool_call>\n{"name": "calculator", "arguments": "{\\"expression\\": \\"1+2\\"}"}\n'
                          "</tool_call><|im_end|>")
    assert msg["tool_calls"] == [call("calculator", expression="1+2")]


@pytest.mark.parametrize("text, problem", [
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": 1+2}}\n</tool_call>', "not valid JSON"),
    ("<tool_call>\ncalculator(1+2)\n</tool_call>", "not valid JSON"),
    ('<tool_call>\n["calculator"]\n</tool_call>', 'string "name"'),
    ('<tool_call>\n{"arguments": {}}\n</tool_call>', 'string "name"'),
    ('<tool_call>\n{"name": "c", "arguments": [1]}\n</tool_call>', "must be a JSON object"),
    ('<tool_call>\n{"name": "c", "arguments": "1+2"}\n</tool_call>', "not a JSON object"),
    ('<tool_call>\n{"name": "c", "args": {}}\n</tool_call>', "unexpected keys"),
    ('<tool_call>\n{"name": "c", "arguments": {}}', "without </tool_call>"),  # truncated or stopped early
    ('{"name": "c", "arguments": {}}\n</tool_call>', "without <tool_call>"),
])
def test_malformed_blocks_become_invalid_calls(text, problem):
    msg = parse_assistant(text + "<|im_end|>")
    [only] = msg["tool_calls"]
    assert only["function"]["name"] == INVALID_CALL
    assert problem in only["function"]["arguments"]["problem"]
    assert only["function"]["arguments"]["kind"] == "malformed"


def test_a_bad_block_does_not_hide_a_good_one():
    msg = parse_assistant('<tool_call>\n{"name": "c", "arguments": {}\n<tool_call>\n{"name": "d", "arguments": {}}\n'
                          "</tool_call><|im_end|>")
    assert [c["function"]["name"] for c in msg["tool_calls"]] == [INVALID_CALL, "d"]


def test_text_after_end_of_turn_is_ignored():
    assert parse_assistant("hi<|im_end|>\n<tool_call>x</tool_call>") == {"role": "assistant", "content": "hi"}


def test_unknown_tool_names_are_flagged_when_tools_are_given(tool_tokenizer, tools):
    text = '<tool_call>\n{"name": "calc", "arguments": {"expression": "1"}}\n</tool_call><|im_end|>'
    ids = tool_tokenizer(text, add_special_tokens=False)["input_ids"]
    [only] = tool_tokenizer.parse_response(ids, prefix=[], tools=tools)["tool_calls"]
    assert only["function"]["name"] == INVALID_CALL
    assert only["function"]["arguments"]["kind"] == "unknown_tool"
    assert "calc" in only["function"]["arguments"]["text"]
    assert tool_tokenizer.parse_response(ids)["tool_calls"][0]["function"]["name"] == "calc"  # no tools: as written


def test_trl_accepts_the_template(tool_tokenizer):
    from trl.chat_template_utils import (
        is_chat_template_prefix_preserving,
        is_chat_template_stop_token_trained,
        supports_tool_calling,
    )

    assert supports_tool_calling(tool_tokenizer)
    assert is_chat_template_prefix_preserving(tool_tokenizer)  # else TRL swaps in a template it knows, or raises
    assert is_chat_template_stop_token_trained(tool_tokenizer)


def test_tools_render_in_the_system_turn(tool_tokenizer, tools):
    text = tool_tokenizer.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "q"}],
                                              tools=tools, tokenize=False, add_generation_prompt=True)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nS\n\n# Tools")
    assert "\n- calculator(expression: string): Evaluate" in system and "\n- python(code: string): Run" in system
    assert system.endswith('<tool_call>\n{"name": <tool name>, "arguments": {<argument>: <value>}}\n</tool_call>')
    assert "timeout_s" not in system  # settings are not shown to the model


def test_optional_arguments_are_marked(tool_tokenizer):
    def lookup(key: str, n: int = 1) -> str:
        """Look up.

        Args:
            key: what
            n: how many
        """

    text = tool_tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tools=[lookup], tokenize=False)
    assert "- lookup(key: string, n?: integer): Look up.\n    key: what\n    n: how many\n" in text


def test_sft_mask_covers_assistant_turns_not_tool_results(tool_tokenizer):
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [call("calculator", expression="1+2")]},
            {"role": "tool", "name": "calculator", "content": "3"},
            {"role": "assistant", "content": "\\boxed{3}"}]
    out = tool_tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    trained = tool_tokenizer.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m])
    assert trained == ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
                       "<|im_end|>\\boxed{3}<|im_end|>")
    assert "tool_response" not in trained


def test_smollm2_own_template_is_refused_with_the_fix(smollm_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(smollm_tokenizer_dir)
    with pytest.raises(ToolTemplateError, match="tool_template to one of: chatml_tools"):
        check_model_template(tok)


def test_install_refuses_a_non_chatml_tokenizer(smollm_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(smollm_tokenizer_dir)
    tok.eos_token = "<|endoftext|>"
    with pytest.raises(ToolTemplateError, match="needs a ChatML tokenizer"):
        install(tok, "chatml_tools")
    with pytest.raises(ToolTemplateError, match="unknown 'qwen9'"):
        install(tok, "qwen9")


@pytest.mark.parametrize("text", [
    "<tool_call>" + "[" * 5000 + "</tool_call>",  # json raises RecursionError, not JSONDecodeError
    '<tool_call>{"name": "c", "arguments": "' + "[" * 5000 + '"}</tool_call>',
    "<tool_call>" * 300, "</tool_call>" * 300, "<tool_call>\n{" + '"a":' * 3000 + "</tool_call>",
])
def test_parser_never_raises_on_adversarial_text(text):
    msg = parse_assistant(text)
    assert msg["role"] == "assistant"
    assert all(c["function"]["name"] == INVALID_CALL for c in msg.get("tool_calls", []))
