"""Where a completion's final answer is, and whether an answer is a number literal.

Shared by the rewards that read an `answer` column (rewards/math.py, rewards/exact.py) and the agent rewards, so the
policy below is written once. docs/rewards.md ("What the answer rewards read") states it for users.

- Only the text after the last </think> counts. A <think> that is never closed, or one opened again after the last
  </think>, means no answer yet. What a reader does not see is not read: HTML comments and LaTeX `%` comments.
- The final answer is the last \\boxed{...} (or \\fbox{...}). Boxes joined to it by nothing but connectors (spacing,
  punctuation, "or", "and", "maybe"...), or by a few words that offer an alternative ("or it could be"), belong to the
  same final answer: if they differ, the answer is a hedge. Boxes separated from it by other words ("Wait, ...") are
  drafts, and a reasoning model that corrects itself is judged on its last box. A last box left open (a truncated
  completion) is no answer.
- A second value joined to the final answer by connectors outside any box (`\\boxed{3} or 5`, `\\boxed{3} or
  \\framebox{5}`, "The answer is $3$ or $5$", "$3$, $5$") makes it a hedge as well.
- The text around the final answer is read: a negation just before it ("It is not \\boxed{3}"), a sentence after it
  that judges an answer wrong ("\\boxed{3} is wrong.", "That is not correct."), or a correction after it that states
  another value ("\\boxed{3}. Wait, 5", "Actually, the answer is 5.") takes it back: no answer.
- Without a box: the text after the last "final answer is", "answer is" or "answer:".

A number literal is an integer, a decimal (1,000.5; 1\\,000; .5; 3.; 1e-7) or a fraction in lowest terms (3/4,
\\frac{3}{4}, \\frac34), with an optional sign, currency sign, percent sign, unit word or `x =` in front. It is never
an expression: -9 - 8, (2+3), -(-3), 6/2 and 2^3 are not literals, nor is a number next to a negation ("never 3",
"3 is wrong"). Full-width and other scripts' digits, Unicode minus signs, zero-width characters and direction marks are
read as their plain forms; superscript and subscript digits are exponents and indices (1³ is 1^{3}, not 13).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import unicodedata
from dataclasses import dataclass
from fractions import Fraction

from . import arithmetic

MAX_CHARS = 20_000  # the answer is at the end; scanning only the tail keeps megabyte completions cheap
_MAX_NUMBER = 200  # characters in one literal: no answer is longer, and exact arithmetic stays cheap

# ---- text normalisation

# Zero-width characters, the soft hyphen and direction marks (LRM, RLM, ALM: they set no order, unlike the overrides
# U+202D/U+202E, which make reversed digits display as another number and stay unread).
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad\u200e\u200f\u061c"))
_MINUS = str.maketrans({"\u2212": "-", "\u2012": "-", "\u2013": "-", "\ufe63": "-"})
_DIGIT = re.compile(r"\d")
# NFKC would turn 1³ into 13: superscript and subscript runs become an exponent and an index instead.
_SUPERSCRIPT = re.compile("[\u00b2\u00b3\u00b9\u2070-\u207f]+")
_SUBSCRIPT = re.compile("[\u2080-\u209c]+")


def normalize_text(text: str) -> str:
    """Full-width forms, other scripts' digits, Unicode minus signs and zero-width characters -> their plain forms;
    superscripts and subscripts -> ^{...} and _{...}."""
    if text.isascii():
        return text
    text = _SUPERSCRIPT.sub(lambda m: "^{" + unicodedata.normalize("NFKC", m.group()) + "}", text)
    text = _SUBSCRIPT.sub(lambda m: "_{" + unicodedata.normalize("NFKC", m.group()) + "}", text)
    text = unicodedata.normalize("NFKC", text).translate(_INVISIBLE).translate(_MINUS)
    return _DIGIT.sub(lambda m: str(unicodedata.decimal(m.group(), m.group())), text)


# ---- where the final answer is

# `%` starts a LaTeX comment, except as a percent sign: `\%`, `25%`, `25 %`.
_LATEX_COMMENT = re.compile(r"(?<![\\\d])(?<!\d )%[^\n]*")
# An argument shown as blank space (\phantom) or struck out (\cancel, \sout, \st), and the braces that close it.
_LATEX_HIDING = re.compile(r"\\(?:[hv]?phantom|cancel|bcancel|xcancel|sout|xout|st)\s*\{")
_LATEX_HIDING_TOKENS = re.compile(rf"{_LATEX_HIDING.pattern}|[{{}}]")
_MARKDOWN_STRUCK = re.compile(r"~~(?=\S)[^\n~]*~~")
# (opening, closing, whether an unclosed one hides the rest): a browser hides all after an unclosed `<!--`. Not
# `<s>...</s>`: a tokenizer's start and end tokens, written out, would strike the whole completion.
_HTML_HIDING = (("<!--", "-->", True), ("<del>", "</del>", False), ("<strike>", "</strike>", False))


def _cut(text: str, opening: str, closing: str, unclosed_hides: bool) -> str:
    """`text` without what lies between `opening` and `closing`, and the tags. Linear."""
    parts, start = [], 0
    while (found := text.find(opening, start)) >= 0:
        close = text.find(closing, found + len(opening))
        if close < 0 and not unclosed_hides:
            break
        parts.append(text[start:found])
        start = len(text) if close < 0 else close + len(closing)
    return " ".join([*parts, text[start:]])


def _cut_latex_hiding(text: str) -> str:
    """`text` without the arguments of \\phantom, \\cancel, \\sout...: one pass over braces (an unclosed argument
    runs to the end)."""
    kept, depth, start = [], 0, 0  # depth > 0: inside a hidden argument
    for m in _LATEX_HIDING_TOKENS.finditer(text):
        if depth == 0:
            if m.group() not in "{}":
                kept.append(text[start : m.start()])
                depth = 1
        else:
            depth += -1 if m.group() == "}" else 1
            if depth == 0:
                start = m.end()
    if depth == 0:
        kept.append(text[start:])
    return " ".join(kept)


def visible_text(text: str, latex: bool = True) -> str:
    """`text` as a reader sees it rendered: without HTML comments and struck-out text (`<del>`, `<strike>`, `~~...~~`)
    and, with `latex`, without LaTeX comments (`%` to the end of the line), \\phantom arguments (blank space) and
    struck-out arguments (\\cancel, \\sout). What the reader cannot see, or sees withdrawn, cannot be an answer."""
    if "<" in text:
        for opening, closing, unclosed_hides in _HTML_HIDING:
            if opening in text:
                text = _cut(text, opening, closing, unclosed_hides)
    if "~~" in text:
        text = _MARKDOWN_STRUCK.sub(" ", text)
    if latex and "%" in text:
        text = _LATEX_COMMENT.sub("", text)
    if latex and _LATEX_HIDING.search(text):
        text = _cut_latex_hiding(text)
    return text


def answer_region(text: str) -> str | None:
    """The visible text after the last </think> (its last MAX_CHARS); None while a <think> is open: never closed, or
    opened again after the last </think>."""
    close = text.rfind("</think>")
    if close >= 0:
        text = text[close + 8 :]
    if "<think>" in text:
        return None
    return visible_text(text)[-MAX_CHARS:]


_BOX_TOKENS = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]+")
_CONNECTORS = frozenset({"or", "and", "either", "maybe", "perhaps", "possibly", "alternatively", "also", "both",
                         "otherwise", "vs", "versus", "text"})
# A few words between two answers that offer an alternative ("or else", "or it could be") make them one hedge; a
# correction word among them ("Wait, it could be") makes the earlier one a draft.
_MAX_HEDGE_WORDS = 8
_HEDGE_WORDS = frozenset({"else", "could", "might", "may", "possible", "possibility", "alternative", "likely",
                          "probably", "guess", "unsure", "unless"})
_CORRECTION_WORDS = frozenset({"wait", "actually", "sorry", "oops", "correction", "rather", "instead", "mean", "no",
                               "not", "nope", "wrong", "incorrect", "mistake", "error", "check", "recheck",
                               "recompute", "redo", "fix", "fixed", "correct", "corrected", "scratch"})


def _joined(between: str) -> bool:
    """True when two answers state one final answer together: only connectors between them, however long the
    spacing, or a few words offering an alternative and none correcting."""
    words = [w.lower() for w in _WORD.findall(_COMMAND.sub(" ", between))]
    if all(w in _CONNECTORS for w in words):
        return True
    return (len(words) <= _MAX_HEDGE_WORDS and any(w in _HEDGE_WORDS for w in words)
            and not any(w in _CORRECTION_WORDS for w in words))


def final_box_group(region: str) -> tuple[str, ...] | None:
    """Contents of the boxes that make the final answer, in order; () when the last box is left open or the text
    around it takes it back (`taken_back`); None: no box.

    One linear pass over braces: completions can be megabytes of nested braces.
    """
    stack: list[tuple[bool, int, int]] = []  # (is a box, where its content starts, where the command starts)
    boxes: list[tuple[int, int, int]] = []  # top-level boxes: (command start, content start, closing brace)
    open_boxes = 0
    for m in _BOX_TOKENS.finditer(region):
        token = m.group()
        if token == "}":
            if not stack:
                continue
            is_box, content_start, start = stack.pop()
            if is_box:
                open_boxes -= 1
                if open_boxes == 0:
                    boxes.append((start, content_start, m.start()))
        else:
            is_box = token != "{"
            stack.append((is_box, m.end(), m.start()))
            open_boxes += is_box
    unclosed = [start for is_box, _, start in stack if is_box]
    if unclosed and (not boxes or unclosed[0] > boxes[-1][0]):
        return ()
    if not boxes:
        return None
    group = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        if not _joined(region[box[2] + 1 : group[0][0]]):
            break
        group.insert(0, box)
    second = _joined_value(region, boxes[-1][2] + 1)
    contents = tuple(region[content_start:end] for _, content_start, end in group) + ((second,) if second else ())
    if taken_back(region, group[0][0], boxes[-1][2] + 1, contents[-1]):
        return ()
    return contents


# A value after an answer, outside any box: a number, a fraction, or a box command LaTeX reads without braces
# (`\boxed 5`) or that the box tokens above do not count (`\framebox{5}`).
_SECOND_VALUE = re.compile(r"[-+]?\s*(?:\d|\\[dt]?frac|\\(?:boxed|fbox|framebox)(?![A-Za-z]))")
_LIST_MARK = re.compile(r"[,;]")
_CLOSING_MATH = re.compile(r"(?:\s|\$|\\[)\]])+$")  # the `$` or `\)` that closes the value's math


def _joined_value(text: str, start: int) -> str | None:
    """The value that follows an answer ending at `start` through connectors only (`\\boxed{3} or 5`, `$3$, $5$`,
    `\\boxed{3} or \\framebox{5}`): with the answer, a hedge. None when what follows is anything else."""
    m = _SECOND_VALUE.search(text, start)
    if m is None:
        return None
    between = text[start : m.start()]
    if not (_WORD.search(_COMMAND.sub(" ", between)) or _LIST_MARK.search(between)) or not _joined(between):
        return None
    cut = _CLAUSE_END.search(text, m.end(), m.end() + 200)
    return _CLOSING_MATH.sub("", text[m.start() : cut.start() if cut else m.end() + 200]).strip()


# ---- what the text around the final answer says about it

# A negation just before the answer: "It is not \boxed{3}", "isn't $\boxed{3}$", "no \boxed{3}" (but "Wait, no:
# \boxed{3}" is a correction that leads to it).
_NEGATED_BEFORE = re.compile(r"(?i)(?:\b(?:not|never|nor)|n['’]t|\bno(?=\s))\s*(?:\$|\\[(\[])?\s*$")
_SENTENCE = re.compile(r"[.!?](?:\s|$)|\n")
_VERDICTS = frozenset({"right", "correct", "true", "valid", "really", "quite", "wrong", "incorrect", "false",
                       "invalid", "mistake", "mistaken", "error", "erroneous"})
_WRONG_MARK = re.compile("[\u2717\u2718\u274c\u274e\u26d4\U0001f6ab]")  # ✗ ✘ ❌ ❎ ⛔ 🚫 next to an answer
_CORRECTION = re.compile(r"(?i)\b(?:wait|actually|sorry|oops|correction|rather|instead|i mean|i meant|scratch that|"
                         r"nope|no(?=\s*[,.!;:]|\s+wait)|wrong|incorrect|mistake)\b")
_NUMBER_TOKEN = re.compile(r"\d+(?:\.\d+)?")
_WITHDRAWN = re.compile(r"(?i)\b(?:just kidding|kidding|joking|scratch that|disregard|never ?mind|"
                        r"i take (?:it|that) back|ignore (?:that|this|it|the above|my (?:previous |last )?answer))\b")
_MAX_CORRECTIONS = 8  # correction words read after an answer (the first ones): each costs a few literal parses
_CLAUSE_TRIM = " \t:;,.-—!?"


def taken_back(region: str, start: int, end: int, answer: str) -> bool:
    """The text around the answer written at region[start:end] takes it back: a negation just before it, or text
    after it that `retracted` reads as taking it back."""
    before = region[max(0, start - 40) : start].lower()
    if ("no" in before or "never" in before or "n't" in before or "n’t" in before) and _NEGATED_BEFORE.search(before):
        return True
    return retracted(region[end:], answer)


def retracted(after: str, answer: str | None, any_correction: bool = False) -> bool:
    """The text after an answer takes it back: a cross next to it (`\\boxed{3} ✗`), a sentence that judges an answer
    wrong and names no other number ("\\boxed{3} is wrong.", "That is not correct.", "(not really)"), a correction
    word followed by another value ("Wait, 5", "Actually, the answer is 5", "is wrong, it's 5"), another "answer is",
    or words that withdraw it ("Just kidding", "Ignore that"). With any_correction (an answer that is no number, such
    as a JSON record), any correction word after it ("Actually, ...") takes it back."""
    if not after.isascii() and _WRONG_MARK.search(_SENTENCE.split(after, 1)[0]):
        return True
    if not _WORD.search(after):  # the common case: a period, a closing `$`
        return False
    if _WITHDRAWN.search(after):
        return True
    parsed: list[Literal | None] = []

    def differs(stated: Literal) -> bool:
        if not parsed:
            parsed.append(parse_literal(answer) if answer is not None else None)
        return parsed[0] is None or not literal_equal(stated, parsed[0])

    def names_another(sentence: str) -> bool:  # "8 is wrong" after \boxed{7} judges the 8, not the answer
        return any(differs(Literal(v, 0, False, False)) and differs(Literal(-v, 0, False, False))
                   for v in map(Fraction, _NUMBER_TOKEN.findall(sentence)))

    for sentence in _SENTENCE.split(after):
        words = {w.lower() for w in _WORD.findall(_COMMAND.sub(" ", sentence))}
        if words & _VERDICTS and words & _NEGATIONS and not names_another(sentence):
            return True
    for i, m in enumerate(_CORRECTION.finditer(after)):
        if any_correction:
            return True
        if i == _MAX_CORRECTIONS:
            break
        stated = _first_value(after[m.end() : m.end() + 200])
        if stated is not None and differs(stated):
            return True
    if not any_correction and (anchor := _ANCHOR.search(after)):
        restated = anchored_answer(after)
        if restated is None:
            return _DIGIT.search(after, anchor.end()) is not None  # "The answer is 5 or 6": a hedge after it
        stated = parse_literal(restated, words=True)
        return stated is not None and differs(stated)
    return False


def _first_value(text: str) -> Literal | None:
    """The value the first clauses of `text` state ("Wait, 5", "Actually, the answer is 5"), else None."""
    clauses = (c.strip(_CLAUSE_TRIM) for c in _CLAUSE_END.split(text))
    for clause in [c for c in clauses if c][:3]:
        if (literal := parse_literal(clause, words=True)) is not None:
            return literal
    return None


# Font and text commands: around a number they show the number (\boxed{\boldsymbol{3}} is a bold 3).
_FONTS = (r"text|textbf|textrm|textnormal|textit|textsf|texttt|textup|emph|mathrm|mathbf|mathit|mathsf|mathtt|"
          r"mathnormal|boldsymbol|bm|pmb|mbox|hbox")
# What a box can hold and still show nothing: spacing, \phantom{...} (it reserves the space of its argument, blank),
# an empty \text{}, braces, math delimiters; and characters that render as blanks.
_HIDDEN = re.compile(r"\\(?:[hv]?phantom|hspace\*?|vspace\*?)\s*\{|[{}]")
_SHOWS_NOTHING = re.compile(
    r"\\(?:quad|qquad|enspace|enskip|thinspace|medspace|thickspace|negthinspace|space|nobreakspace|strut|mathstrut|"
    rf"relax|empty|null|displaystyle|textstyle|{_FONTS})"
    r"(?![A-Za-z])|\\[,;:!> ()\[\]]|[{}$~]")
_BLANK_CHARS = frozenset("\u2800\u3164\u115f\u1160\uffa0\u180e")


def is_blank(content: str) -> bool:
    """True when a box's content shows nothing: `{}`, `\\text{}`, `\\phantom{0}`, `\\quad`, a zero-width space."""
    text, kept, depth, start = normalize_text(content), [], 0, 0  # depth > 0: inside a \phantom's argument
    for m in _HIDDEN.finditer(text):
        token = m.group()
        if depth == 0 and token not in "{}":
            kept.append(text[start : m.start()])
            depth = 1
        elif depth:
            depth += 1 if token.endswith("{") else -1
            start = m.end()
    if depth == 0:
        kept.append(text[start:])
    return all(ch.isspace() or ch in _BLANK_CHARS or unicodedata.category(ch) in ("Cf", "Cc")
               for ch in _SHOWS_NOTHING.sub("", "".join(kept)))


_ANCHOR = re.compile(r"(?i)\banswer(?:\*\*)?\s*(?:is\b\s*:?|:)(?:\*\*)?")
_DISPLAY = (("$$", "$$"), ("\\[", "\\]"), ("$", "$"), ("\\(", "\\)"))
_SENTENCE_END = re.compile(r"\.(?:\s|$)|\n")


def anchored_answer(region: str) -> str | None:
    """The answer stated after the last "answer is" / "answer:" (math delimiters kept); None without an anchor, or
    when another value follows the answer through connectors ("$3$ or $5$")."""
    last = None
    for last in _ANCHOR.finditer(region):
        pass
    if last is None:
        return None
    rest = region[last.end() :].lstrip(" \t*")
    for opening, closing in _DISPLAY:
        end = rest.find(closing, len(opening)) if rest.startswith(opening) else -1
        if end > 0:
            answer, after = rest[: end + len(closing)].strip(), end + len(closing)
            break
    else:
        cut = _SENTENCE_END.search(rest)
        after = cut.start() if cut else len(rest)
        answer = rest[:after].strip().strip("*").strip()
    if _joined_value(rest, after) is not None:
        return None  # "$3$ or $5$", "3. Or 5.": two answers
    if answer and retracted(rest[after:], answer):
        return None  # "The answer is 3. Wait, 5."
    return answer or None


_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
EQUALS = re.compile(r"(?<![<>!:\\])=(?!=)")  # an equals sign, not <=, >=, !=, ==, := or \=
_LEADING_NUMBER = re.compile(r"\(?\s*([-+]?)\s*(\d+(?:\.\d+)?)")
_CLAUSE_END = re.compile(r"[.,;](?:\s|$)|\n")  # "1,000" and "7.5" go on; "7, so" and "7. So" end
_CLAUSE_SPLIT = re.compile(rf"({_CLAUSE_END.pattern})")

# ---- the working: how its equations are read
#
# Working the checks cannot read must not pass for working that holds, so every way of writing a relation that means
# "equals" is read as `=`: `＝` (as any full-width form), `==`, `:=`, `≈`, `≡`, `\approx`, "equals", "is equal to";
# an arrow (`→`, `->`, `=>`, `⇒`, `\to`, `\implies`) is `=` too, except between two equations, where it is
# "therefore" (`x + 3 = 5 ⇒ x = 2`); "is", "gives", "makes"... are `=` where the side before them is arithmetic
# (`-7 - 8 is 15`), or names a result and the side after them is a number (`The sum is 15`; not `The second is 4`).
# LaTeX layout (`\begin{aligned}`, `&`, `\\`, `\left(`) and runs of spaces are dropped, and a line that starts with
# `=` goes on with the chain above it.
_THINK_TAG = re.compile(r"</?think>")
_LATEX_BREAK = re.compile(r"\\(?:begin|end)\s*\{[^{}\n]{0,40}\}|\\\\")
_LATEX_ALIGN = re.compile(r"&|\\(?:left|right|bigl?|bigr?|Bigl?|Bigr?|biggl?|biggr?)(?![A-Za-z])")
_SPACES_INLINE = re.compile(r"[^\S\n]{2,}|[\t\r\f\v]")
_CONTINUED = re.compile(r" ?\n ?(?==)")
_ARROW = re.compile(r"=+>|-+>|\\(?:to|rightarrow|Rightarrow|longrightarrow|Longrightarrow|implies|mapsto)(?![A-Za-z])"
                    r"|[→⟶⇒⟹↦]")
_ARROW_MARK = "\x00"
# Other relations end a chain: in `3 + 4 ≠ 8 = 7` the chain is `8 = 7`.
_OTHER_RELATION = re.compile(r"\\not\s*=|\\(?:neq?|leq?|geq?|lt|gt|leqslant|geqslant)(?![A-Za-z])"
                             r"|!=|<=|>=|[≠≤≥<>]")
_EQUALITY = re.compile(r"==+|:=|\\(?:approx|equiv|simeq|doteq|coloneqq)(?![A-Za-z])|[≈≡≃≐≔]"
                       r"|(?i:\b(?:is\s+)?equal(?:s|led|ed|ling|ing)?(?:\s+to)?\b)")
_WEAK_WORDS = ("is", "was", "gives", "makes", "yields", "leaves", "becomes", "comes to", "results in")
_WEAK_RELATION = re.compile(rf"(?i)\b(?:{'|'.join(_WEAK_WORDS)})\b")
_RESULT_WORDS = re.compile(r"(?i)\b(?:sum|difference|product|quotient|total|result|answer|value)\b")


def read_relations(text: str) -> str:
    """`text` with every relation that means "equals" written `=` and LaTeX layout dropped (see above). Each pattern
    runs only where a plain substring test says it can match: completions can be 40,000 characters of reasoning."""
    if "think>" in text:
        text = _THINK_TAG.sub("\n", text)
    text = normalize_text(text)
    other_script = not text.isascii()
    if "&" in text or any(c in text for c in ("\\\\", "\\begin", "\\end", "\\left", "\\right", "\\big", "\\Big")):
        text = _LATEX_ALIGN.sub("", _LATEX_BREAK.sub("\n", text))
    text = _SPACES_INLINE.sub(" ", text)
    if "\n" in text and "=" in text:
        text = _CONTINUED.sub(" ", text)
    if other_script or ">" in text or any(c in text for c in ("\\to", "arrow", "\\implies", "\\mapsto")):
        text = _ARROW.sub(_ARROW_MARK, text)
    lowered = text.lower()
    if other_script or any(c in text for c in ("==", ":=", "eq", "\\approx")) or "equal" in lowered:
        text = _EQUALITY.sub(" = ", text)
    if other_script or any(c in text for c in ("<", ">", "!=", "\\n", "\\l", "\\g")):
        text = _OTHER_RELATION.sub("; ", text)
    arrows = _ARROW_MARK in text
    weak = any(f"{w} " in lowered for w in _WEAK_WORDS) and _WEAK_RELATION.search(text) is not None
    if not (arrows or weak):
        return text
    parts = _CLAUSE_SPLIT.split(text)  # clauses at even indices, what ends them at odd ones
    weak_budget = _MAX_SIDES  # clauses read for "is", "gives"...: the last ones, as the checks read the last sides
    for i in reversed(range(0, len(parts), 2)):
        clause = parts[i]
        if arrows and _ARROW_MARK in clause:
            pieces = clause.split(_ARROW_MARK)
            clause = pieces[0] + "".join(
                ("; " if EQUALS.search(before) and EQUALS.search(after) else " = ") + after
                for before, after in itertools.pairwise(pieces))
        if weak and weak_budget > 0 and _DIGIT.search(clause) and not EQUALS.search(clause):
            found = list(_WEAK_RELATION.finditer(clause))
            if len(found) == 1:
                weak_budget -= 1
                left, right = clause[: found[0].start()], clause[found[0].end() :]
                if (OPERATION.search(left) or not left.isascii() or "\\" in left or _OPERATOR_WORDS.search(left)) \
                        and _computation(left) is not None:
                    clause = f"{left} = {right}"
                elif _RESULT_WORDS.search(left) and parse_literal(right.strip()) is not None:
                    clause = f" = {right}"
        parts[i] = clause
    return "".join(parts)


_FRAC = re.compile(r"\\[dtc]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_TEXT_ARGUMENT = re.compile(r"\\(?:text|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
_LATEX_ARITHMETIC = (("\\times", "*"), ("\\cdot", "*"), ("\\ast", "*"), ("\\div", "/"), ("\\,", " "), ("\\;", " "),
                     ("\\!", ""), ("\\ ", " "), ("\\qquad", " "), ("\\quad", " "), ("\\(", " "), ("\\)", " "),
                     ("\\[", " "), ("\\]", " "), ("$", " "), ("·", "*"))
_OPERATOR_WORDS = re.compile(r"(?i)\b(?:plus|minus|times|multiplied by|divided by)\b")
_LETTER_TIMES = re.compile(r"(?<=\d)\s*[xX]\s*(?=[\d(])")  # 2 x 3
_OPERATOR_SIGNS = {"plus": "+", "minus": "-", "times": "*", "multiplied by": "*", "divided by": "/"}
OPERATION = re.compile(r"\d\s*\)*\s*[-+*/×÷^]\s*[-+(]*\s*\d")  # an operator between two numbers


def _plain_side(side: str) -> str | None:
    """One side of an equation as plain arithmetic after an optional lead-in ("So 1 - 4"), with LaTeX (`\\left( 1 - 4
    \\right)`, `3 \\times 4`, `\\frac{1}{2}`) and operator words (`1 minus 4`) spelled as operators; None when it is
    not (`x + 3`, `\\sqrt{9}`, words)."""
    if "\\" in side or "{" in side or "$" in side:
        side = _TEXT_ARGUMENT.sub(r" \1 ", _FRAC.sub(r"((\1)/(\2))", side))
        for latex, plain in _LATEX_ARITHMETIC:
            side = side.replace(latex, plain)
        side = side.replace("{", "(").replace("}", ")")
    if _WORD.search(side):
        side = _OPERATOR_WORDS.sub(lambda m: _OPERATOR_SIGNS[" ".join(m.group().lower().split())], side)
        side = _LETTER_TIMES.sub(" * ", side)
    side = side.rpartition(":")[2].strip()  # a label: "Step 1: 3 + 4"
    if (lead := _LEAD_WORDS.match(side)) and not _stop(lead.group()):
        side = side[lead.end() :]
    side = side.strip()
    return side if _DIGIT.search(side) and "\\" not in side else None


def _computation(side: str) -> str | None:
    """The side as plain arithmetic when it computes something (an operator between two numbers), else None."""
    plain = _plain_side(side)
    return plain if plain is not None and OPERATION.search(plain) else None


def _completion_text(text: str) -> tuple[str, str] | None:
    """(the visible reasoning inside <think>, its last MAX_CHARS; the answer region), None while a <think> is open."""
    region = answer_region(text)
    if region is None:
        return None
    close = text.rfind("</think>")
    return (visible_text(text[:close])[-MAX_CHARS:] if close >= 0 else ""), region


@functools.lru_cache(maxsize=8)
def _working(text: str) -> str | None:
    """The working, as read_relations reads it: the reasoning and the answer region up to the final answer (the last
    box, else the last "answer is"); None while a <think> is open."""
    parts = _completion_text(text)
    if parts is None:
        return None
    think, region = parts
    end = None
    for end in _BOX_START.finditer(region):
        pass
    if end is None:
        for end in _ANCHOR.finditer(region):
            pass
    return read_relations(f"{think}\n{region[: end.start()] if end is not None else region}")


@functools.lru_cache(maxsize=8)
def _equations(text: str) -> str:
    """The whole completion (the reasoning inside <think> and the answer region) as read_relations reads it."""
    parts = _completion_text(text)
    return read_relations("\n".join(parts)) if parts is not None else ""


def _last_equation(working: str) -> tuple[list[str], Literal | None] | None:
    """(other sides, stated number) of the working's last chain of equations, None when the working has no `=`. The
    stated number is what follows its last `=` up to the end of the clause (`-7 - 8 = 15. \\boxed{-15}` -> 15; None for
    `= x + 3`), and the other sides are those of the chain it ends, back to the clause's start (`-7 - 8 = -(7 + 8) =
    -15` -> `-7 - 8`, `-(7 + 8)`)."""
    last = None
    for last in EQUALS.finditer(working):
        pass
    if last is None:
        return None
    rest = working[last.end() :]
    cut = _CLAUSE_END.search(rest)
    before = working[: last.start()]
    begin = max((m.end() for m in _CLAUSE_END.finditer(before)), default=0)
    return EQUALS.split(before[begin:])[-_MAX_SIDES:], _stated(rest[: cut.start()] if cut else rest)


def _stated(text: str) -> Literal | None:
    """The number the text after an `=` states: a literal, else the number it starts with, else one in words."""
    stated = text.strip().removesuffix("\\)").removesuffix("\\]").strip("$ ")
    literal = parse_literal(stated) if stated else None
    if literal is None and (lead := _LEADING_NUMBER.match(normalize_text(stated))):
        # A number with junk after it (`= 5ne`, `= 11 1`) still states 5 and 11: the check must not be dodged by noise.
        literal = parse_literal(lead.group(1).replace(" ", "") + lead.group(2))
    if literal is None and (value := number_words(stated)) is not None:  # `= fifteen` states 15 all the same
        literal = Literal(Fraction(value), 0, False, False)
    return literal


def _side_value(side: str) -> Fraction | None:
    """The value of one side of an equation when it reads as plain arithmetic (`_plain_side`), or the number it
    starts with when that is its only number (`8 (just kidding)`); else None (`x + 3`, words: not judged)."""
    plain = _plain_side(side)
    if plain is None:
        return None
    try:
        return arithmetic.evaluate(plain, arithmetic.WORKING_CHARS)
    except arithmetic.ArithmeticFault:
        pass
    lead = _LEADING_NUMBER.match(plain)
    if lead and len(_NUMBER_TOKEN.findall(plain)) == 1:
        return Fraction(lead.group(1) + lead.group(2))
    return None


def working_disagrees(text: str, gold: str) -> bool:
    """The completion's working ends with a number other than the gold (`-7 - 8 = 15. \\boxed{-15}` for -15), or a
    side of its last chain of equations is plain arithmetic of another value (`1 - 4 = 5. \\boxed{5}` for 5: a wrong
    sum that lands on the answer). The working includes the reasoning inside <think>."""
    equation = _last_equation(_working(text) or "")
    gold_literal = parse_literal(gold, lowest_terms=False)
    if equation is None or equation[1] is None or gold_literal is None:
        return False
    sides, stated = equation
    if not literal_equal(stated, gold_literal):
        return True
    # A decimal result may be rounded as written (10 / 3 = 3.33): each side must equal it at its own places.
    values = [v for v in map(_side_value, sides) if v is not None]
    return any((round(v, stated.places) if stated.places else v) != stated.value for v in values)


_EXPRESSION = re.compile(r"(?:[-(]\s*)*\d[\d\s.+\-*/×÷^()]*[\d)]")


def _expressions(question: str) -> list[str]:
    return [m.group().strip() for m in _EXPRESSION.finditer(question[:2000]) if OPERATION.search(m.group())]


def question_expression(question: str) -> str | None:
    """The arithmetic expression a question asks about ("Calculate ( -9 - 8 )." -> "( -9 - 8 )"), or None."""
    found = _expressions(question)
    return max(found, key=len) if found else None


def question_text(prompt) -> str:
    """The question of a prompt as TRL hands it: the last user turn of a chat (a list of messages; the earlier turns
    are instructions and worked examples), or the prompt's text."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt if isinstance(prompt, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
                return " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
            return str(content or "")
    return ""


def asked_expression(prompt, gold: str) -> str | None:
    """The arithmetic expression the prompt's question asks for, when its exact value is the gold ("Calculate 3 + 4."
    with gold 7 -> "3 + 4"); None when the question holds none (a word problem) or none worth the gold."""
    gold_literal = parse_literal(str(gold), lowest_terms=False)
    if gold_literal is None:
        return None
    for expression in reversed(_expressions(question_text(prompt))):
        try:
            if arithmetic.evaluate(expression) == gold_literal.value:
                return expression
        except arithmetic.ArithmeticFault:
            continue
    return None


def numbers_in(text: str) -> set[Fraction]:
    """The numbers written in `text`, as absolute values (`-7 + 2.5` -> {7, 2.5})."""
    return {abs(Fraction(n)) for n in _NUMBER_TOKEN.findall(text)}


def question_numbers(expression: str) -> set[Fraction] | None:
    """What working about `expression` may compute with: its numbers and the values of its parts, not its own value
    (absolute values: `(3 + 4) * 2` -> {3, 4, 7, 2}); None when it is not arithmetic."""
    try:
        parts, _ = arithmetic.parts(expression)
    except arithmetic.ArithmeticFault:
        return None
    return {abs(v) for v in parts}


def working_unrelated(text: str, expression: str) -> bool:
    """A step of the working computes with a number that is neither in the question's `expression` (its numbers and
    the values of its parts, not its own value) nor a result an earlier step computed: `0 + 7 = 7` or `2 + 5 = 7`
    for `3 + 4` (true working that lands on the answer without computing it). Steps are the sides of the working's
    equations that are arithmetic with an operator; the first _MAX_SIDES are read."""
    working = _working(text)
    allowed = question_numbers(expression)
    if allowed is None:
        return False
    budget = _MAX_SIDES
    for clause in _CLAUSE_END.split(working or ""):
        sides = EQUALS.split(clause) if EQUALS.search(clause) else []
        reached: list[Fraction] = []
        for side in sides[:budget]:
            plain = _computation(side)
            if plain is None or parse_literal(side) is not None:
                continue
            try:
                inner, value = arithmetic.parts(plain, arithmetic.WORKING_CHARS)
            except arithmetic.ArithmeticFault:
                continue  # not arithmetic after all: not judged
            if not numbers_in(plain) <= allowed:
                return True
            reached += [*inner, value]
        budget -= len(sides)
        if budget <= 0:
            break
        if reached:  # a step about the question: what its chain reached may be used by the next steps
            allowed |= {abs(v) for v in reached}
            allowed |= {abs(lit.value) for side in sides if (lit := _stated(side)) is not None}
    return False


_MAX_SIDES = 256  # sides of equations judged, the last ones: each costs a parse, and a completion can hold 10,000


def false_equation(text: str) -> bool:
    """A chain of equations in the completion, the reasoning inside <think> included (`a = b = c`, up to the end of
    its clause; relations as read_relations reads them), whose sides read as numbers do not all agree: `7 + 1 = 7`,
    and `3 + 4 = 8` in `3 + 4 = 8. So 7 = 7`. A side is read as a number literal, else as plain arithmetic
    (`_plain_side`: `So 1 - 4`, `1 minus 4`, `\\left(1 - 4\\right)`); the last side also as the number it starts with
    (`= 5ne`) or one in words; sides that read as none (`x`, `\\sqrt{9}`, words) and percentages are not judged. A
    decimal literal may be rounded as written (`10 / 3 = 3.33`). Only the last _MAX_SIDES sides are read."""
    equations = _equations(text)
    budget = _MAX_SIDES
    for clause in reversed([c for c in _CLAUSE_END.split(equations) if EQUALS.search(c)]):
        if budget <= 0:
            break
        sides = EQUALS.split(clause)[-budget:]
        budget -= len(sides)
        exact: list[Fraction] = []
        rounded: list[Literal] = []
        for i, side in enumerate(sides):
            literal = parse_literal(side)
            if literal is None and (value := _side_value(side)) is not None:
                exact.append(value)
                continue
            if literal is None and i == len(sides) - 1:
                literal = _stated(side)
            if literal is not None and not literal.percent:
                if literal.places:
                    rounded.append(literal)
                else:
                    exact.append(literal.value)
        if exact and (any(v != exact[0] for v in exact)
                      or any(round(exact[0], r.places) != r.value for r in rounded)):
            return True
    return False


_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_WORD_RUN = re.compile(r"(?i)\s*((?:minus|negative)\s+|-\s*)?([a-z]+(?:[\s-]+(?:and\s+)?[a-z]+)*)")


def number_words(text: str) -> int | None:
    """The integer a text starts with when written in English words (`fifteen`, `minus twenty-one`, `-six`, `one
    hundred and five`), else None. Words after the number are ignored, as digits' trailing junk is."""
    m = _WORD_RUN.match(text)
    if not m:
        return None
    total = current = 0
    seen = False
    for word in re.split(r"[\s-]+", m.group(2).lower()):
        if word in _UNITS or word in _TENS:
            current += _UNITS.get(word, 0) + _TENS.get(word, 0)
        elif word in _SCALES and seen:
            if _SCALES[word] == 100:
                current *= 100
            else:
                total, current = total + current * _SCALES[word], 0
        elif word == "and" and seen:
            continue
        else:
            break
        seen = True
    if not seen:
        return None
    value = total + current
    return -value if m.group(1) else value


def last_line(region: str) -> str | None:
    lines = [line.strip() for line in region.splitlines() if line.strip()]
    return lines[-1] if lines else None


# ---- number literals

@dataclass(frozen=True)
class Literal:
    value: Fraction
    places: int  # digits after the decimal point as written (0 for integers and fractions)
    fraction: bool  # written as a/b or \frac{a}{b}
    percent: bool


def _closing(text: str, open_at: int) -> int:
    """Index of the brace closing the one at open_at, or -1."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


_GROUP = re.compile(rf"(?:\\(?:boxed|fbox|{_FONTS}))?\s*\{{")
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("\\left(", "\\right)"), ("(", ")"))


def unwrap(text: str) -> str:
    """Strip what encloses the whole text: math delimiters, \\boxed{}, \\text{}, braces, parentheses, a final period."""
    for _ in range(10):
        before = text
        text = text.strip().replace("\\displaystyle", "").strip()
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1].rstrip()
        for opening, closing in _DELIMITERS:
            if text.startswith(opening) and text.endswith(closing) and len(text) > len(opening) + len(closing) - 1:
                inner = text[len(opening) : len(text) - len(closing)]
                if opening != "(" or _balanced_parens(inner):
                    text = inner
                    break
        m = _GROUP.match(text)
        if m and _closing(text, m.end() - 1) == len(text) - 1:
            text = text[m.end() : -1]
        if text == before:
            return text
    return text


def _balanced_parens(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            return False
    return depth == 0


_PERCENT = re.compile(r"\s*(?:\\?%|\\text\{\s*(?:percent|%)\s*\}|\bpercent)\s*$")
# Words that make a phrase around a number more than a unit or a label: "3 or 5", "3 or more", "minus 5", and
# negations: "never 3", "no 3", "3 is wrong".
_NEGATIONS = frozenset({"not", "nor", "never", "no", "nope", "nah", "none", "neither", "nothing", "wrong", "incorrect",
                        "false", "invalid", "impossible", "unlikely", "cannot", "isn", "wasn", "aren", "doesn", "don"})
# Words that qualify a number rather than name what it counts: a hedge or an exclusion (`3 \text{ is ruled out}`), a
# verb (`is`), a number in words (`3 \text{ eight}`).
_HEDGES = frozenset({"maybe", "perhaps", "possibly", "probably", "roughly", "nearly", "almost", "around", "excluded",
                     "eliminated", "rejected", "discarded", "ruled", "disproved", "doubtful", "uncertain"})
_VERBS = frozenset({"is", "are", "was", "were", "been", "being", "seems"})
_NUMBER_WORDS = frozenset([*_UNITS, *_TENS, *_SCALES, "billion", "dozen"])
_QUALIFIERS = _NEGATIONS | _HEDGES | _VERBS | _NUMBER_WORDS
_STOP_WORDS = _NEGATIONS | _HEDGES | {"or", "and", "to", "plus", "minus", "times", "over", "divided", "than", "more",
                                      "less", "least", "most", "about", "approximately", "between", "from", "per",
                                      "negative", "sqrt", "frac", "pi", "either", "without", "except"}
_UNIT_STOP_WORDS = _STOP_WORDS | _QUALIFIERS  # a unit names what is counted, and nothing else
# Cost: runs of whitespace are squashed to one space before any pattern runs, since several `\s*` in a row try every
# split of a run (in _NUMBER, `-<800 spaces>7x` costs seconds unsquashed), and the end-anchored unit and percent
# patterns look at the last _TAIL characters only (a unit is short), so that their search is linear, not quadratic.
_SPACES = re.compile(r"\s{2,}")
_TAIL = 64
_UNIT = re.compile(
    r"(?:\s*\\(?:text|textnormal|textrm|mbox|mathrm)\s*\{\s*([A-Za-z][A-Za-z .]*)\}"
    r"|\s+([A-Za-z]{2,}(?:\s+[A-Za-z]{2,})*)"
    r"|\s*(?:\^\s*\{?\s*\\circ\s*\}?|°))"
    r"(?:\s*\^\s*\{?\s*[23]\s*\}?)?\s*$")
_VARIABLE = re.compile(r"\s*(?:[A-DF-HJ-Za-df-hj-z]|\\(?:alpha|beta|gamma|delta|theta|lambda|mu|sigma|phi|omega|"
                       r"rho|tau))(?:_\{?\w+\}?)?\s*")
_PHRASE = re.compile(r"[A-Za-z][A-Za-z ]*")
_LEAD_WORDS = re.compile(r"[A-Za-z][A-Za-z\s,:;'’]*(?:\s|:)")
_SPACING = [("{,}", ","), (",\\!", ","), ("\\!", ""), ("\\,", " "), ("\\;", " "), ("\\ ", " "), ("~", " ")]
_CURRENCY = r"(?:\\\$|\$|€|£|¥|₹)"
_DECIMAL = r"(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?: \d{3})+|\d+)(?:\.\d*)?|\.\d+"
_NUMBER = re.compile(
    rf"([-+]?)\s*{_CURRENCY}?\s*([-+]?)\s*(?:"
    rf"(?P<dec>{_DECIMAL})(?:[eE](?P<exp>[-+]?\d{{1,4}}))?"
    r"|\\[dtc]?frac\s*(?:\{\s*(?P<fn>-?\d+)\s*\}|(?P<fn1>\d))\s*(?:\{\s*(?P<fd>\d+)\s*\}|(?P<fd1>\d))"
    r"|(?P<sn>\d+)\s*/\s*(?P<sd>\d+))")


def negated(text: str) -> bool:
    """The text holds a negation word outside LaTeX commands: `3 \\text{ is wrong}`, `not 3` (`\\neq` is no word)."""
    return any(w.lower() in _NEGATIONS for w in _WORD.findall(_COMMAND.sub(" ", text)))


def qualified(text: str) -> bool:
    """The text holds a word outside LaTeX commands that qualifies a number rather than names what it counts: a
    negation, a hedge, a verb or a number in words (`3 \\text{ is ruled out}`, `3 \\text{ eight}`)."""
    return any(w.lower() in _QUALIFIERS for w in _WORD.findall(_COMMAND.sub(" ", text)))


def squash_spaces(text: str) -> str:
    """Runs of whitespace as one space: no pattern, here or in math-verify, then retries over a run."""
    return _SPACES.sub(" ", text)


def _stop(phrase: str, single_letters: bool = False, stop_words: frozenset = _STOP_WORDS) -> bool:
    words = [w.lower() for w in _WORD.findall(phrase)]
    return any(w in stop_words or (single_letters and len(w) == 1) for w in words)


def parse_literal(text: str, *, words: bool = False, lowest_terms: bool = True) -> Literal | None:
    """The number `text` states as a literal (module docstring), or None when it is anything else.

    words=True also accepts a leading phrase ("So she has 42 apples"), for answers written as a sentence.
    lowest_terms=False accepts fractions such as 2/4 (for gold answers, which the dataset wrote, not the policy).
    """
    if len(text) > 4 * _MAX_NUMBER:  # a number, even with a unit and a label, is short; unwrapping is linear per pass
        return None
    text = unwrap(_SPACES.sub(" ", normalize_text(text)))
    percent = _PERCENT.search(text, max(0, len(text) - _TAIL))
    if percent:
        text = unwrap(text[: percent.start()])
    if "=" in text:
        lhs, _, rhs = text.partition("=")
        label = words and _PHRASE.fullmatch(lhs.strip()) and not _stop(lhs)
        if "=" in rhs or not (_VARIABLE.fullmatch(lhs) or label):
            return None
        text = unwrap(rhs)
    elif words and (lead := _LEAD_WORDS.match(text)) and not _stop(lead.group()):
        text = text[lead.end() :].lstrip(" :")
    unit = _UNIT.search(text, max(0, len(text) - _TAIL))
    if unit and not _stop(unit.group(1) or unit.group(2) or "", unit.group(2) is not None, _UNIT_STOP_WORDS):
        text = unwrap(text[: unit.start()])
    if not percent and (percent := _PERCENT.search(text, max(0, len(text) - _TAIL))):
        text = text[: percent.start()]
    for old, new in _SPACING:
        text = text.replace(old, new)
    text = _SPACES.sub(" ", text)  # the spacing commands just became spaces
    m = _NUMBER.fullmatch(text.strip())
    if m is None or len(text) > _MAX_NUMBER or (m.group(1) and m.group(2)):
        return None
    negative = "-" in (m.group(1) + m.group(2))
    if m.group("dec") is not None:
        digits = m.group("dec").replace(",", "").replace(" ", "")
        exponent = int(m.group("exp") or 0)
        value = Fraction(digits.rstrip(".") or "0") * Fraction(10) ** exponent
        places = max(0, len(digits.partition(".")[2]) - exponent)
        literal = Literal(-value if negative else value, places, False, bool(percent))
    else:
        num = int(m.group("fn") or m.group("fn1") or m.group("sn"))
        den = int(m.group("fd") or m.group("fd1") or m.group("sd"))
        if den == 0 or (lowest_terms and (den < 2 or math.gcd(num, den) != 1)):
            return None
        value = Fraction(num, den)
        literal = Literal(-value if negative else value, 0, True, bool(percent))
    return literal


def literal_equal(pred: Literal, gold: Literal) -> bool:
    """Equal values; or a fraction and a decimal of at least 6 places that is that fraction rounded (0.333333 and
    1/3, as math-verify's 6-place rounding allows). 0.33 is not 1/3: a short decimal may be exact, and a fraction
    near it would otherwise pass (2/7 for 0.3). Percent signs are ignored on both sides: 25% matches 25, not 0.25."""
    if pred.value == gold.value:
        return True
    decimal, fraction = (gold, pred) if gold.places else (pred, gold)
    if fraction.fraction and decimal.places >= 6:
        return abs(pred.value - gold.value) * 2 * 10**decimal.places <= 1
    return False


def single_answer(group: tuple[str, ...]) -> str | None:
    """The one answer a final box group states, or None when its boxes state different things (a hedge)."""
    if not group:
        return None
    keys = {re.sub(r"\s+", "", normalize_text(c)) for c in group}
    if len(keys) == 1:
        return group[-1]
    first = parse_literal(group[0])
    for content in group[1:]:  # stops at the first that differs: a hedge of many boxes costs two parses
        value = parse_literal(content) if first is not None else None
        if value is None or not literal_equal(value, first):
            return None
    return group[-1]


def strip_percent(text: str) -> str:
    """`text` without a final percent sign (or "percent"): the math rewards compare 25% with 25, not with 0.25."""
    inner = unwrap(text)
    m = _PERCENT.search(inner)
    return inner[: m.start()].strip() if m else text


def is_variable(text: str) -> bool:
    """A single letter (not e or i), optionally subscripted, or a Greek variable: the x of `x = 3`."""
    return _VARIABLE.fullmatch(text) is not None


def literal_text(literal: Literal) -> str:
    """The literal's value written plainly ("5", "-0.25", "\\frac{3}{4}"): math-verify misreads "+5" and "1 000"."""
    value = literal.value
    if value.denominator == 1:
        return str(value.numerator)
    if literal.places:
        scaled = value * 10**literal.places
        if scaled.denominator == 1:
            digits = str(abs(scaled.numerator)).rjust(literal.places + 1, "0")
            return f"{'-' if value < 0 else ''}{digits[: -literal.places]}.{digits[-literal.places:]}"
    return f"{'-' if value < 0 else ''}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"
