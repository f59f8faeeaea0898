"""Chat templates with tool calling, for models whose own template has none, chosen by name in YAML.

TRL 1.16's GRPOTrainer needs two things from the tokenizer before it runs a tool loop:
- a chat template that renders user -> assistant(tool_calls) -> tool (trl.chat_template_utils.supports_tool_calling)
  and is prefix-preserving (is_chat_template_prefix_preserving; TRL only patches templates it knows);
- a response parser: `tokenizer.response_template` (transformers >= 5.13). TRL's add_response_schema sets one only
  for the templates it recognises (Qwen, Llama 3.1/3.2, GLM, GPT-OSS, ...), and skips itself when one is set.

`install(tokenizer, "chatml_tools")` provides both. The parser is ours (parse_assistant) rather than transformers'
template-driven one because TRL turns a completion that fails to parse into plain text and ends the episode, so the
model never learns what was wrong; here a malformed <tool_call> becomes a call to INVALID_CALL, which the trainer
answers with an error tool message. `response_template` is still set, to the equivalent transformers template, so
a saved tokenizer parses well-formed calls the same way anywhere (tests check the two parsers agree).
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from pathlib import Path

from trl.chat_template_utils import add_response_schema, supports_tool_calling

# Reserved tool name for a <tool_call> block that does not parse: never a registered tool, never in the prompt.
INVALID_CALL = "invalid_tool_call"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
TEMPLATE_DIR = Path(__file__).resolve().parent / "chat_templates"  # package data (pyproject.toml)


@dataclass(frozen=True)
class ToolTemplate:
    name: str
    jinja_file: str
    end_of_turn: str  # must be a single token and the tokenizer's EOS, or generation never stops at a turn's end
    response_template: dict

    @property
    def chat_template(self) -> str:
        return (TEMPLATE_DIR / self.jinja_file).read_text()


CHATML_TOOLS = ToolTemplate(
    name="chatml_tools",
    jinja_file="chatml_tools.jinja",
    end_of_turn="<|im_end|>",
    # transformers' response-template form of the same format (the Qwen3 one, without <think>).
    response_template={
        "defaults": {"role": "assistant"},
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "tool_calls": {
                "open": OPEN,
                "close_pattern": r"</tool_call>\s*",
                "repeats": True,
                "content": "json",
                "transform": {"type": "function", "function": "{content}"},
            },
            "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
        },
    },
)
TEMPLATES = {t.name: t for t in (CHATML_TOOLS,)}


def _invalid(problem: str, text: str, kind: str = "malformed") -> dict:
    args = {"problem": problem, "text": text[:200], "kind": kind}
    return {"type": "function", "function": {"name": INVALID_CALL, "arguments": args}}


def _tool_names(tools) -> set[str]:
    names = set()
    for t in tools or ():
        fn = t.get("function", t) if isinstance(t, dict) else None
        names.add(fn.get("name") if isinstance(fn, dict) else getattr(t, "__name__", None))
    return names - {None}


def check_names(message: dict, tools) -> dict:
    """Calls to a tool the prompt did not offer become INVALID_CALL(kind=unknown_tool), so the error message can
    list the real tools (TRL's own answer is "Tool X not found.")."""
    names = _tool_names(tools)
    if not names:
        return message
    for i, call in enumerate(message.get("tool_calls", ())):
        fn = call["function"]
        if fn["name"] != INVALID_CALL and fn["name"] not in names:
            text = json.dumps({"name": fn["name"], "arguments": fn["arguments"]})
            message["tool_calls"][i] = _invalid(f"no tool named '{fn['name']}'", text, "unknown_tool")
    return message


_DECODER = json.JSONDecoder()


def _check_call(call, body: str) -> dict:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return _invalid('expected a JSON object with a string "name"', body)
    if set(call) - {"name", "arguments"}:
        extra = sorted(set(call) - {"name", "arguments"})
        return _invalid(f'unexpected keys {extra}; use "name" and "arguments"', body)
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI's API does
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            return _invalid('"arguments" is a string that is not a JSON object', body)
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return _invalid('"arguments" must be a JSON object', body)
    return {"type": "function", "function": {"name": call["name"], "arguments": args}}


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _block(text: str, start: int) -> tuple[dict, int]:
    """The call whose <tool_call> starts at `start` -> (call, position after the block)."""
    body = start + len(OPEN)
    # Decode one JSON value first: a string argument may itself contain "</tool_call>" (python code can).
    try:
        value, end = _DECODER.raw_decode(text, _skip_space(text, body))
        after = _skip_space(text, end)
        if text.startswith(CLOSE, after):
            return _check_call(value, text[body:after].strip()), after + len(CLOSE)
    except (json.JSONDecodeError, RecursionError):  # deep nesting ("[[[[...") raises RecursionError in json
        pass
    end = text.find(CLOSE, body)
    nxt = text.find(OPEN, body)
    if end < 0 or 0 <= nxt < end:
        stop = len(text) if nxt < 0 else nxt
        return _invalid("<tool_call> without </tool_call>", text[body:stop]), stop
    inner = text[body:end].strip()
    try:
        value = json.loads(inner)
    except json.JSONDecodeError as exc:
        return _invalid(f"not valid JSON ({exc.msg} at char {exc.pos})", inner), end + len(CLOSE)
    except RecursionError:
        return _invalid("JSON nested too deeply", inner), end + len(CLOSE)
    return _check_call(value, inner), end + len(CLOSE)


def parse_assistant(text: str, end_of_turn: str = CHATML_TOOLS.end_of_turn) -> dict:
    """One assistant turn (the text after the generation prompt) -> {"role", "content"[, "tool_calls"]}.

    Never raises. A <tool_call> block that is unclosed, not JSON, or not {"name": str, "arguments": object} becomes
    a call to INVALID_CALL whose arguments say what was wrong; a stray </tool_call> is one too.
    """
    text = text.split(end_of_turn, 1)[0]
    content, calls, pos = [], [], 0
    while True:
        start = text.find(OPEN, pos)
        stray = text.find(CLOSE, pos)
        if stray >= 0 and (start < 0 or stray < start):
            calls.append(_invalid("</tool_call> without <tool_call>", text[pos:stray]))
            content.append(text[pos:stray])
            pos = stray + len(CLOSE)
            continue
        if start < 0:
            content.append(text[pos:])
            break
        content.append(text[pos:start])
        call, pos = _block(text, start)
        calls.append(call)
    # The template writes "\n" between the content and each call; whitespace between calls is layout, not content.
    first, rest = content[0], [c.strip() for c in content[1:] if c.strip()]
    if calls:
        first = first.removesuffix("\n")
    message = {"role": "assistant", "content": "\n".join([first, *rest]) if rest else first}
    if calls:
        message["tool_calls"] = calls
    return message


def _parse_response(self, response, schema=None, *, prefix=None, tools=None):
    """Bound over tokenizer.parse_response: TRL calls it with one completion's token ids (EOS included).

    This template pre-writes nothing into the assistant turn, so the prefix is not needed; tool arguments stay as
    the model typed them (the tool guard checks them against the signature).
    """
    if isinstance(response, str):
        return check_names(parse_assistant(response), tools)
    if response and isinstance(response[0], (list, tuple)):
        return [check_names(parse_assistant(self.decode(r, skip_special_tokens=False)), tools) for r in response]
    return check_names(parse_assistant(self.decode(response, skip_special_tokens=False)), tools)


class ToolTemplateError(ValueError):
    pass


TOOL_TEMPLATE_CHOICES = ("model", *TEMPLATES)


def prepare_tokenizer(tokenizer, name: str):
    """What every run with tools does right after loading the tokenizer (also an SFT'd folder, or when resuming: the
    parser is an instance attribute and is never saved): install the named template, or check the model's own."""
    if name == "model":
        check_model_template(tokenizer)
        return tokenizer
    return install(tokenizer, name)


def install(tokenizer, name: str):
    """Give `tokenizer` the named tool template and its parser. Refuses a tokenizer whose tokens do not fit."""
    if name not in TEMPLATES:
        raise ToolTemplateError(f"tool_template: unknown '{name}'; known: {', '.join(TEMPLATES)} (or 'model': the "
                                "model's own template, when TRL can parse its tool calls)")
    spec = TEMPLATES[name]
    ids = tokenizer.convert_tokens_to_ids([spec.end_of_turn, "<|im_start|>"])
    unk = tokenizer.unk_token_id
    if any(i is None or i == unk for i in ids) or tokenizer.eos_token != spec.end_of_turn:
        raise ToolTemplateError(
            f"tool_template: '{name}' needs a ChatML tokenizer (<|im_start|> and {spec.end_of_turn} as single "
            f"tokens, EOS {spec.end_of_turn}); this one has EOS {tokenizer.eos_token!r}. Use a model whose own chat "
            "template supports tools (tool_template: model) or add a template for this tokenizer")
    tokenizer.chat_template = spec.chat_template
    tokenizer.response_template = spec.response_template
    # An instance attribute, so only this tokenizer object parses with it (TRL calls tokenizer.parse_response).
    tokenizer.parse_response = types.MethodType(_parse_response, tokenizer)
    return tokenizer


def check_model_template(tokenizer) -> None:
    """tool_template: model -> the model's own template must render tool calls and be parseable by TRL."""
    if not supports_tool_calling(tokenizer):
        raise ToolTemplateError(
            "tool_template: the model's chat template cannot render tool calls (assistant tool_calls -> tool "
            f"results). Set tool_template to one of: {', '.join(TEMPLATES)} (for ChatML models such as SmolLM2)")
    if getattr(tokenizer, "response_template", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError:
            raise ToolTemplateError(
                "tool_template: the model's chat template renders tool calls but TRL has no parser for it (it "
                "knows Qwen, Llama 3.1/3.2, GLM-4, GPT-OSS, ...). Set tool_template to one of: "
                f"{', '.join(TEMPLATES)}, or give the tokenizer a response_template") from None
