"""What a run's outcome says besides its status, made from its rounds: the model's last words, the
lines said after the outcome, how much of the material piped in the model read, and each model's
rounds and tokens (what the cost is counted from).

It imports prompts, actions, records, endings, limits and scoring.
"""
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from agent_demo_kit import prompts
from agent_demo_kit.actions import said_besides_actions
from agent_demo_kit.endings import CheckFailed, Finished, GaveUp, RunEnded, RunResult
from agent_demo_kit.records import Round, answer_text, is_count, number
from agent_demo_kit.limits import CHECK_OUTPUT_LINES, CHECK_OUTPUT_SHOWN, LAST_WORDS_CHARS, LAST_WORDS_LINES


def run_result(ending: RunEnded, rounds: Sequence[Round], usage: dict, redact: Callable[[Any], Any], first: str,
               by_model: bool, material: Optional[Tuple[str, int]], trace: Optional[str],
               prices: Optional[Any]) -> RunResult:
    """The outcome of a run that ended so after these rounds (first: the model it started with;
    by_model: --escalate, so each model's share is kept). It is data a caller keeps: no key in it
    (an endpoint's error may quote it, a model may repeat it)."""
    words = last_words(ending, rounds)
    ending.args, ending.result = tuple(redact(list(ending.args))), redact(ending.result)
    return RunResult(ending, rounds=len(rounds), usage=usage,
                     calls=redact([{"round": record.number, "tool": call.tool, "args": call.args,
                                    "result": call.result} for record in rounds for call in record.calls
                                   if call.note != prompts.ANSWERED_IN_WORDS]),  # words are no call
                     progress=redact(progress(ending, words)), last_words=redact(words),
                     checks=redact([{"round": record.number, **call.check} for record in rounds
                                    for call in record.calls if call.check]),
                     trace=trace, material=material_read(material, rounds),
                     models=used_by_model(rounds, first) if by_model else None,
                     answered_in_words=answered_in_words(ending),
                     cost=cost(tokens_by_model(rounds, first), prices) if prices else None)


def last_words(ending: RunEnded, rounds: Sequence[Round]) -> str:
    """What the model last said besides its actions, when the run ended without an answer ("" else)."""
    if isinstance(ending, (Finished, GaveUp)):
        return ""
    said = next((said for said in (said_besides_actions(record.model_output) for record in reversed(rounds)) if said),
                "")
    return few_lines(said, LAST_WORDS_LINES, LAST_WORDS_CHARS)


def progress(ending: RunEnded, words: str) -> List[str]:
    """The lines said after the outcome of a run that did not finish: the last answer the check
    rejected and what the check said of it, or the model's last words."""
    if isinstance(ending, CheckFailed):
        answer = answer_text(ending.call.args.get("result")) if isinstance(ending.call.args, dict) else ""
        return ["the last answer:", *indented(answer, LAST_WORDS_LINES, LAST_WORDS_CHARS),
                "the check said:", *(indented(ending.result, CHECK_OUTPUT_LINES, CHECK_OUTPUT_SHOWN)
                                     or ["  (nothing)"])]
    if words:
        return ["the model last said:", *(f"  {line}" for line in words.splitlines())]
    return []


def indented(text: str, lines: int, chars: int) -> List[str]:
    """text's first `lines` lines, `chars` characters in all, each indented, for the lines after an outcome."""
    kept = few_lines(text, lines, chars).splitlines()
    return [f"  {line}" for line in kept]


def few_lines(text: str, lines: int, chars: int) -> str:
    """text's first `lines` lines, cut to `chars` characters in all, and how many lines were left out."""
    every = text.strip().splitlines()
    kept = prompts.clip("\n".join(every[:lines]), chars)
    return kept + (f"\n... ({len(every) - lines} more lines)" if len(every) > lines else "")


def tokens_by_model(rounds: Sequence[Round], first: str) -> Dict[str, dict]:
    """Each model's rounds and tokens (total, prompt, completion, cached), as metrics counts them; a
    round of a model that does not say is the first's."""
    used: Dict[str, dict] = {}
    for record in rounds:
        model = used.setdefault(record.model or first, {"rounds": 0, "tokens": 0, "prompt": 0, "completion": 0,
                                                        "cached": 0})
        model["rounds"] += 1
        for name, key in (("tokens", "total_tokens"), ("prompt", "prompt_tokens"),
                          ("completion", "completion_tokens"), ("cached", "cached_tokens")):
            model[name] += record.usage[key] if is_count(record.usage.get(key)) else 0
    return used


def material_read(material: Optional[Tuple[str, int]], rounds: Sequence[Round]) -> Optional[dict]:
    """How much of the material piped in (read a page at a time) the model saw: the part shown with
    the task and every page read_material gave, each counted once."""
    if material is None:
        return None
    text, shown = material
    spans = [(0, shown)] + [(call.result["data"]["offset"], call.result["data"]["offset"]
                             + len(call.result["data"]["text"]))
                            for record in rounds for call in record.calls
                            if call.tool == "read_material" and call.result.get("ok")
                            and isinstance(call.result.get("data"), dict)
                            and isinstance(call.result["data"].get("text"), str)
                            and isinstance(call.result["data"].get("offset"), int)]
    read, reached = 0, 0
    for start, end in sorted(spans):
        read += max(0, end - max(start, reached))
        reached = max(reached, end)
    return {"chars": len(text), "bytes": len(text.encode("utf-8", "replace")), "read_chars": read}


def answered_in_words(ending: RunEnded) -> bool:
    """Did the run finish with a reply of words rather than a finish action?"""
    return isinstance(ending, Finished) and ending.call is not None and ending.call.note == prompts.ANSWERED_IN_WORDS


def used_by_model(rounds: Sequence[Round], first: str) -> Dict[str, dict]:
    """Each model's rounds and tokens, as --json shows them with --escalate."""
    return {name: {"rounds": used["rounds"], "tokens": used["tokens"]}
            for name, used in tokens_by_model(rounds, first).items()}


Price = Tuple[float, float, Optional[float]]  # dollars per million input, output and cached input tokens


def cost(models: Dict[str, dict], prices: Dict[str, Price]) -> Optional[float]:
    """What the tokens of a run cost in dollars, by each model's price (cached input at the cached
    price, else the input price); None when a model that was used has no price (or it is past counting)."""
    total = 0.0  # not rounded: micro-dollars a task add up to cents
    for name, used in models.items():
        if not isinstance(used, dict) or not number(used.get("rounds")) and not number(used.get("tokens")):
            continue
        if name not in prices:
            return None
        into, out, cached = prices[name]
        prompt, completion = number(used.get("prompt")), number(used.get("completion"))
        hits = min(number(used.get("cached")), prompt)
        total += ((prompt - hits) * into + hits * (into if cached is None else cached) + completion * out) / 1e6
    return round(total, 12) if math.isfinite(total) else None  # JSON has no Infinity
