"""--batch FILE --plan: what a batch will take before anything is sent: its runs, requests and tokens
(from the results of an earlier batch in its folder when there are some, else from the size of its
first requests), what that costs at --price, and how large a difference between two configurations
so many tasks can show at the paired test's level.

It imports prompts, records, tools, outcome and the results' scoring.
"""
import math
import statistics
from typing import Any, Dict, List, Optional

from agent_demo_kit import prompts
from agent_demo_kit.outcome import cost
from agent_demo_kit.limits import ESTIMATED_CHARS_A_TOKEN
from agent_demo_kit.records import json_size
from agent_demo_kit.scoring import paired_test
from agent_demo_kit.tools import REGISTRY, in_use

ROUNDS_GUESSED = 2  # a run's rounds with nothing run before: a tool call, then the answer
ROUND_GROWTH_TOKENS = 80  # what a round adds to the next request: its reply and the results fed back
REPLY_TOKENS = 40  # a reply of an action
DIFFERING_SHARE = 0.2  # of the tasks, where two configurations differ, for the power estimate
POWER = 0.8


def plan(tasks: List[Any], settings: Any, tries: int, earlier: Optional[dict], level: float) -> dict:
    """The figures of a batch of these tasks (each tried `tries` times) with these settings; earlier:
    the summary of the results already in its folder (None: none)."""
    runs = len(tasks) * tries
    tools = in_use({name: tool for name, tool in REGISTRY.items()
                    if settings.tool_names is None or name in settings.tool_names}, settings.tool_names == [])
    system = prompts.render_system_prompt(tools, settings.mode, settings.max_calls)
    first = statistics.fmean(json_size([{"role": "system", "content": system},
                                        {"role": "user", "content": prompts.render_task(task.task)}])
                             for task in tasks) / ESTIMATED_CHARS_A_TOKEN if tasks else 0
    done = earlier and earlier.get("runs") and earlier.get("rounds", {}).get("mean")
    if done:  # what the same tasks took before
        rounds = earlier["rounds"]["mean"]
        prompt = earlier["tokens"]["prompt"] / earlier["runs"]
        completion = earlier["tokens"]["completion"] / earlier["runs"]
    else:
        rounds = ROUNDS_GUESSED
        prompt = rounds * first + rounds * (rounds - 1) / 2 * ROUND_GROWTH_TOKENS
        completion = rounds * REPLY_TOKENS
    most = settings.max_rounds
    most_prompt = most * first + most * (most - 1) / 2 * ROUND_GROWTH_TOKENS
    used = {"rounds": rounds, "prompt": prompt * runs, "completion": completion * runs, "tokens": 1}
    at_most = {"rounds": most, "prompt": most_prompt * runs,
               "completion": most * (settings.max_reply_tokens or REPLY_TOKENS) * runs, "tokens": 1}
    prices = settings.prices() if settings.price else {}
    return {"tasks": len(tasks), "runs": runs, "model": settings.model, "rounds_a_run": round(rounds, 2),
            "from_earlier_results": bool(done), "requests": round(rounds * runs), "requests_at_most": most * runs,
            "tokens": round((prompt + completion) * runs),
            "tokens_at_most": round(at_most["prompt"] + at_most["completion"]),
            "cost": cost({settings.model: used}, prices) if prices else None,
            "cost_at_most": cost({settings.model: at_most}, prices) if prices else None,
            "level": level, "fewest_differing": fewest_differing(level),
            "detectable": smallest_difference(len(tasks), level)}


def fewest_differing(level: float) -> int:
    """The fewest tasks two configurations must differ on, all one way, for the paired test to say
    more than noise at this level."""
    differ = 1
    while paired_test(differ, 0) >= level:
        differ += 1
    return differ


def smallest_difference(tasks: int, level: float, differing: float = DIFFERING_SHARE,
                        power: float = POWER) -> Optional[float]:
    """The smallest difference in pass rate (a share of the tasks) the paired test finds with this
    power at this level, when `differing` of the tasks differ (Connor's approximation for McNemar's
    test); None when it cannot, whatever the difference."""
    if not tasks:
        return None
    normal = statistics.NormalDist()
    z_level, z_power = normal.inv_cdf(1 - level / 2), normal.inv_cdf(power)

    def needed(difference: float) -> float:
        return (z_level * math.sqrt(differing) + z_power * math.sqrt(differing - difference ** 2)) ** 2 \
            / difference ** 2
    low, high = 1e-6, differing  # a difference cannot pass the share that differs
    if needed(high) > tasks:
        return None
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if needed(middle) > tasks else (low, middle)
    return round(max(high, fewest_differing(level) / tasks), 4)


def render_plan(figures: Dict[str, Any], price_given: bool) -> List[str]:
    """The plan for people."""
    share = "a run, as the earlier results in its folder averaged" if figures["from_earlier_results"] else \
        "a run, a guess: a tool call and the answer"
    lines = [f"plan: {figures['tasks']:,} task(s)" + (f", {figures['runs']:,} runs" if figures["runs"] !=
                                                       figures["tasks"] else "") + f" with {figures['model']}",
             f"  requests    about {figures['requests']:,} ({figures['rounds_a_run']:g} {share}); at most"
             f" {figures['requests_at_most']:,} at --max-rounds",
             f"  tokens      about {figures['tokens']:,}; at most {figures['tokens_at_most']:,}"]
    if price_given:
        lines.append("  cost        " + (f"about ${figures['cost']:,.4g}; at most ${figures['cost_at_most']:,.4g}"
                                         if figures["cost"] is not None else "n/a: no price for the model"))
    detectable = figures["detectable"]
    lines.append(f"  detectable  at {figures['level']:g}, two configurations must differ on"
                 f" {figures['fewest_differing']} tasks or more, all one way; " + (f"with a fifth of the tasks differing, a difference of"
                                                    f" {detectable:.0%} of them or more, 4 times in 5"
                                                    if detectable is not None else
                                                    "with a fifth of them differing, no difference is likely found"))
    lines.append("nothing was sent: the same command without --plan runs it")
    return lines
