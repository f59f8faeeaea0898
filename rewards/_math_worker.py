"""math-verify in a child process that rewards/math.py can kill: the hard deadline behind `answer_form: expression`.

Started by rewards/math.py as `python -I <this file>` (never imported; the registry skips files starting with "_").
Protocol, one JSON line each way: request [mode, answer, gold, timeout_s]; reply "1" (equal), "0" (not equal) or
"N" (gold unparseable). Mode "box" reads `answer` as the content of a \\boxed{}, mode "text" lets math-verify find
the answer in free text. The parent kills this process when a reply is
late: sympy can spend minutes inside one C call (9^{9^{9^9}}), where no signal or thread can interrupt it.
"""

import json
import os
import re
import sys

# -I keeps this file's folder (rewards/, whose math.py would shadow the standard library's math) off sys.path and
# ignores PYTHONPATH; the parent passes its own import path instead, so both import the same math-verify.
sys.path[:] = json.loads(os.environ.get("GRPO_RECIPES_SYS_PATH", "[]")) or sys.path


def _limit_cpu(timeout_s: float) -> None:
    """If the parent dies while this process is stuck, the kernel ends it once it has used this much more CPU."""
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime + timeout_s) + 5
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


_PROSE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")  # a word, not a LaTeX command: "\sqrt{2}" and "x+1" are no prose


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += (ch == "{") - (ch == "}")
        if depth < 0:
            return False
    return depth == 0


def main() -> None:
    import functools
    import logging
    import resource
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer; this process ends when its stdin closes
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a CPU-limit kill must not leave core files behind
    logging.disable(logging.CRITICAL)  # math-verify logs every timeout and unparseable string

    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    box_config = [LatexExtractionConfig(boxed_match_priority=0)]
    text_config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    @functools.lru_cache(maxsize=4096)
    def parse_gold(gold: str, seconds: int) -> tuple:
        # A bare gold (no $, no box: what an answer column usually holds) is the content of a box: read as free text,
        # "1, -2" would be one number and "2x+1" a 2. Prose ("forty two") is read as TRL reads it: unparseable.
        if not any(d in gold for d in ("$", "\\(", "\\[", "\\boxed")) and not _PROSE.search(gold) and _balanced(gold):
            parsed = parse(f"\\boxed{{{gold}}}", box_config, parsing_timeout=seconds)
            if parsed:
                return tuple(parsed)
        return tuple(parse(gold, parsing_timeout=seconds))

    def judge(mode: str, answer: str, gold: str, seconds: int) -> str:
        # math-verify's own timeouts (SIGALRM: this is the main thread) turn slow cases into "not equal" as in TRL.
        gold_parsed = parse_gold(gold, seconds)
        if not gold_parsed:
            return "N"
        text, config = (f"\\boxed{{{answer}}}", box_config) if mode == "box" else (answer, text_config)
        pred = parse(text, config, extraction_mode="first_match", parsing_timeout=seconds)
        return "1" if pred and verify(list(gold_parsed), pred, timeout_seconds=seconds) else "0"

    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        mode, answer, gold, timeout_s = json.loads(line)
        _limit_cpu(timeout_s)
        out.write(judge(mode, answer, gold, max(1, int(timeout_s))) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
