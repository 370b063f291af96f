"""Figures about runs: one run's, read from its trace records (the batch's results.jsonl lines are
these), and a table across many runs (a batch, shards merged, or the run log folder), kept as
numbers only so that it stays small however many runs it counts.

It imports records and scoring.
"""
import math
from array import array
from typing import Any, Dict, List, Optional

from agent_demo_kit import scoring, trace_file
from agent_demo_kit.records import is_count, number

CONTROL_TOOLS = ("finish", "fail", "recall", "note")  # answered by the loop: not tool calls


def no_figures() -> Dict[str, Any]:
    """The figures of a run that has none yet."""
    return {"status": "unfinished", "answer": None, "answered_in_words": False, "error": None, "summary": "",
            "rounds": 0, "tokens": {"total": 0, "prompt": 0, "completion": 0, "cached": 0}, "tool_calls": 0,
            "tool_errors": 0, "retries": 0, "format_errors": 0, "checks": {"runs": 0, "passed": 0}, "seconds": 0.0,
            "largest_request_chars": 0, "attempts": 0, "errors": 0, "escalations": 0, "models": {},
            "max_context": None}


def run_figures(records: List[dict]) -> Optional[dict]:
    """The figures of the last run among a trace's records (resumes included), or None if there is
    no start record: status ("unfinished" when cut short), answer, rounds, tokens, tool calls and
    errors, retries, format errors, checks, seconds, the largest request, attempts and errors
    (how often it was started or resumed, and ended in an error), and rounds and tokens per model."""
    run = trace_file.last_run(records)
    if not run:
        return None
    figures = no_figures()
    figures["max_context"] = run[0].get("max_context") if is_count(run[0].get("max_context")) else None
    model = str(run[0].get("model"))
    began = last = None
    for record in run:
        event, at = trace_file.event_of(record), record.get("ts")
        if number(at):  # a time a trace could hold
            if event in trace_file.SETS_UP:
                figures["seconds"] += segment(began, last)
                began = at
            last = at
        if event in trace_file.SETS_UP:
            figures["attempts"] += 1
            figures["status"] = "unfinished"
            model = str(record.get("model", model))
        elif event == trace_file.ROUND and isinstance(record.get("round"), int):
            count_round(figures, record, str(record.get("model") or model))
            figures["status"] = "unfinished"
        elif event == trace_file.RETRY:
            figures["retries"] += 1
        elif event == trace_file.ESCALATION and record.get("to_model"):
            model = str(record["to_model"])
            figures["escalations"] += record.get("trigger") != "calm"
        elif event == trace_file.END:
            status = str(record.get("status"))
            figures["status"] = status
            # an error counts against --retry-errors unless no request got an answer: a refused key, no connection
            figures["errors"] += status == "error" and record.get("http_status") not in (401, 403) \
                and not record.get("unreachable")
            figures["answer"] = record.get("result") if status in ("finished", "failed") else None
            figures["answered_in_words"] = status == "finished" and record.get("answered_in_words") is True
            figures["error"] = str(record.get("error")) if status == "error" and record.get("error") else None
            figures["summary"] = str(record.get("summary") or "")
    figures["seconds"] = round(figures["seconds"] + segment(began, last), 3)
    return figures


def segment(began: Optional[float], last: Optional[float]) -> float:
    """The seconds from a start or resume record to the last record after it."""
    return max(0.0, last - began) if began is not None and last is not None else 0.0


def count_round(figures: dict, record: dict, model: str) -> None:
    """Add one round record's figures."""
    figures["rounds"] += 1
    usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
    tokens = figures["tokens"]
    for name, key in (("total", "total_tokens"), ("prompt", "prompt_tokens"), ("completion", "completion_tokens"),
                      ("cached", "cached_tokens")):
        if is_count(usage.get(key)):
            tokens[name] += usage[key]
    per_model = figures["models"].setdefault(model, {"rounds": 0, "tokens": 0, "prompt": 0, "completion": 0,
                                                      "cached": 0})
    per_model["rounds"] += 1
    for name, key in (("tokens", "total_tokens"), ("prompt", "prompt_tokens"), ("completion", "completion_tokens"),
                      ("cached", "cached_tokens")):
        per_model[name] = per_model.get(name, 0) + (usage[key] if is_count(usage.get(key)) else 0)
    if is_count(record.get("request_chars")):
        figures["largest_request_chars"] = max(figures["largest_request_chars"], record["request_chars"])
    calls = [call for call in record.get("calls") or [] if isinstance(call, dict)]
    figures["format_errors"] += (not calls and record.get("problem") is not None) \
        + sum(bool(call.get("format_error")) for call in calls)
    for call in calls:
        result = call.get("result") if isinstance(call.get("result"), dict) else {}
        if isinstance(call.get("check"), dict):
            figures["checks"]["runs"] += 1
            figures["checks"]["passed"] += call["check"].get("exit_code") == 0
        if call.get("tool") not in CONTROL_TOOLS and not call.get("format_error"):
            figures["tool_calls"] += 1
            figures["tool_errors"] += result.get("ok") is not True


# --- across runs -------------------------------------------------------------------------------

def percentile(values: "array", share: float) -> float:
    """The nearest-rank percentile of values (0 when there are none)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


MOST_GROUPS = 20  # metadata keys, and values of a key, counted apart (the rest: "(others)")
GROUP_NAME_CHARS = 40


class Tally:
    """The figures of many runs added up, one run at a time, keeping numbers only."""

    def __init__(self, tries: int = 1) -> None:
        self.runs = 0  # a task's tries are a run each (--repeat)
        self.status_counts: Dict[str, int] = {}
        self.rounds, self.seconds = array("d"), array("d")
        self.tokens = {"total": 0, "prompt": 0, "completion": 0, "cached": 0}
        self.sums = dict.fromkeys(("tool_calls", "tool_errors", "retries", "format_errors", "attempts"), 0)
        self.checked = self.passed = 0  # runs whose answer a check judged, and whose last judged answer passed
        self.escalated = self.rescued = 0  # runs a stronger model took over, and those of them that finished
        self.largest_request, self.max_context = 0, None
        self.models: Dict[str, Dict[str, int]] = {}
        self.in_words = 0  # runs that finished with words, not a finish action
        self.scored = self.correct = 0  # runs whose task had an expected answer, and those that matched it
        self.succeeded = 0  # runs that finished, and were right when their task expected an answer
        self.cost, self.costed = 0.0, 0  # dollars, and the runs whose cost is known
        self.tries = tries
        self.outcomes: Dict[str, List[bool]] = {}  # with repeats: each task's successes, try by try
        self.scored_tasks: set = set()  # with repeats: the tasks (not tries) that had an expected answer
        self.scores: Dict[str, List[float]] = {}  # --scorer's name -> [sum, runs scored]
        self.scorer_errors = 0
        # --judge: the answers it graded, its tokens and cost (apart from the runs'), the answers it could not
        self.judged = {"runs": 0, "prompt": 0, "completion": 0, "cost": 0.0, "costed": 0, "errors": 0}
        self.groups: Dict[str, Dict[str, List[int]]] = {}  # metadata key -> value -> [runs, succeeded, scored, correct]

    def add(self, figures: dict) -> None:
        """One run's figures (a results.jsonl line, or run_figures of a trace)."""
        self.runs += 1
        status = str(figures.get("status"))
        self.in_words += status == "finished" and figures.get("answered_in_words") is True
        correct = figures.get("correct")
        if isinstance(correct, bool):
            self.scored += 1
            self.correct += correct
            if self.tries > 1:
                self.scored_tasks.add(str(figures.get("id")))
        self.succeeded += correct if isinstance(correct, bool) else status == "finished"
        if number(figures.get("cost")) or figures.get("cost") == 0 and not isinstance(figures.get("cost"), bool):
            self.cost += number(figures["cost"])
            self.costed += 1
        if self.tries > 1:
            tries = self.outcomes.setdefault(str(figures.get("id")), [])
            at = int(number(figures.get("repeat")) or 1) - 1
            if 0 <= at < self.tries:
                tries.extend([False] * (at + 1 - len(tries)))
                tries[at] = correct if isinstance(correct, bool) else status == "finished"
        self.status_counts[status] = self.status_counts.get(status, 0) + 1
        scores = figures.get("scores")
        for name, value in (scores.items() if isinstance(scores, dict) else ()):
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1 \
                    and (name in self.scores or len(self.scores) < MOST_GROUPS):
                counted = self.scores.setdefault(str(name)[:GROUP_NAME_CHARS], [0.0, 0])
                counted[0] += value
                counted[1] += 1
        self.scorer_errors += bool(figures.get("scorer_error"))
        self.add_judged(figures)
        metadata = figures.get("metadata")
        if isinstance(metadata, dict):
            self.add_to_groups(metadata, status == "finished", correct)
        self.rounds.append(number(figures.get("rounds")))
        self.seconds.append(number(figures.get("seconds")))
        tokens = figures.get("tokens") if isinstance(figures.get("tokens"), dict) else {}
        for name in self.tokens:
            self.tokens[name] += int(number(tokens.get(name)))
        for name in self.sums:
            self.sums[name] += int(number(figures.get(name)))
        checks = figures.get("checks") if isinstance(figures.get("checks"), dict) else {}
        if number(checks.get("runs")):
            self.checked += 1
            self.passed += status == "finished" and number(checks.get("passed")) > 0
        self.largest_request = max(self.largest_request, int(number(figures.get("largest_request_chars"))))
        if number(figures.get("escalations")):
            self.escalated += 1
            self.rescued += status == "finished"
        if is_count(figures.get("max_context")):
            self.max_context = figures["max_context"]
        models = figures.get("models") if isinstance(figures.get("models"), dict) else {}
        for name, used in models.items():
            if isinstance(used, dict):
                total = self.models.setdefault(str(name), {"rounds": 0, "tokens": 0})
                total["rounds"] += int(number(used.get("rounds")))
                total["tokens"] += int(number(used.get("tokens")))
                if isinstance(used.get("cost"), (int, float)) and not isinstance(used["cost"], bool):
                    total["cost"] = round(total.get("cost", 0.0) + number(used["cost"]), 6)

    def add_judged(self, figures: dict) -> None:
        """What the --judge spent on one run's answer, and whether it could grade it."""
        judged, counted = figures.get("judge"), self.judged
        counted["errors"] += bool(figures.get("judge_error"))
        if not isinstance(judged, dict):
            return
        counted["runs"] += "score" in judged  # graded; a reply without a score costs its tokens all the same
        tokens = judged.get("tokens") if isinstance(judged.get("tokens"), dict) else {}
        counted["prompt"] += int(number(tokens.get("prompt")))
        counted["completion"] += int(number(tokens.get("completion")))
        if number(judged.get("cost")) or judged.get("cost") == 0 and not isinstance(judged.get("cost"), bool):
            counted["cost"] += number(judged["cost"])
            counted["costed"] += 1

    def add_to_groups(self, metadata: dict, finished: bool, correct: Any) -> None:
        """A run's place in each group its task's metadata names (at most MOST_GROUPS keys, and values)."""
        for key, value in list(metadata.items())[:MOST_GROUPS]:
            key, value = " ".join(str(key).split()), " ".join(str(value).split())  # a name on one line
            values = self.groups.get(str(key)[:GROUP_NAME_CHARS])
            if values is None:
                if len(self.groups) >= MOST_GROUPS:
                    continue
                values = self.groups[str(key)[:GROUP_NAME_CHARS]] = {}
            name = str(value)[:GROUP_NAME_CHARS] if len(values) < MOST_GROUPS else "(others)"
            counted = values.setdefault(name, [0, 0, 0, 0])
            counted[0] += 1
            counted[1] += correct if isinstance(correct, bool) else finished
            counted[2] += isinstance(correct, bool)
            counted[3] += correct is True

    def summary(self, pending: int = 0, pending_scored: int = 0, tasks: Optional[int] = None) -> dict:
        """The table as data: what summary.json and --summary --json hold. pending: runs not made (a
        stopped batch), pending_scored: how many of them have an expected answer; both count as not
        done, and not right. tasks: how many tasks (with --repeat, fewer than runs). The accuracy's
        interval is of the tasks, not of their tries, which are not independent."""
        runs, finished = self.runs + pending, self.status_counts.get("finished", 0)
        tasks = runs if self.tries == 1 else tasks if tasks is not None else len(self.outcomes)
        counts = {**self.status_counts, **({"pending": pending} if pending else {})}
        calls, scored = self.sums["tool_calls"], self.scored + pending_scored
        accuracy = rate(self.correct, scored)
        sampled = scored if self.tries == 1 else max(len(self.scored_tasks), round(scored / self.tries))
        return {
            "tasks": tasks, "runs": runs, "status_counts": dict(sorted(counts.items())),
            "completion_rate": rate(finished, runs), "succeeded": self.succeeded,
            "answered_in_words": self.in_words, "completion_rate_by_finish": rate(finished - self.in_words, runs),
            "scored": scored, "correct": self.correct, "accuracy": accuracy,
            "accuracy_interval": scoring.interval(accuracy * sampled, sampled) if accuracy is not None else None,
            "cost": round(self.cost, 8) if self.costed else None,
            "cost_per_run": round(self.cost / self.costed, 8) if self.costed else None,
            **({"cost_unknown": self.runs - self.costed} if self.costed and self.costed < self.runs else {}),
            **({"repeats": scoring.repeats(list(self.outcomes.values()), self.tries)} if self.tries > 1 else {}),
            "check_pass_rate": rate(self.passed, self.checked), "checked": self.checked,
            "rounds": {"total": int(sum(self.rounds)), "mean": round(sum(self.rounds) / self.runs, 2) if self.runs else 0,
                       "p50": percentile(self.rounds, 0.5), "p95": percentile(self.rounds, 0.95)},
            "tokens": {**self.tokens, "cached_share": rate(self.tokens["cached"], self.tokens["prompt"])},
            "tool_calls": calls, "tool_errors": self.sums["tool_errors"],
            "tool_error_rate": rate(self.sums["tool_errors"], calls),
            "retries": self.sums["retries"], "format_errors": self.sums["format_errors"],
            "attempts": self.sums["attempts"],
            "seconds": {"total": round(sum(self.seconds), 3), "p50": round(percentile(self.seconds, 0.5), 3),
                        "p95": round(percentile(self.seconds, 0.95), 3)},
            "largest_request_chars": self.largest_request, "max_context": self.max_context,
            "models": self.models, "escalated": self.escalated, "finished_after_escalating": self.rescued,
            **({"scores": {name: {"mean": round(total / runs, 4), "runs": runs}
                           for name, (total, runs) in self.scores.items()}} if self.scores else {}),
            **({"scorer_errors": self.scorer_errors} if self.scorer_errors else {}),
            **({"judge": {"runs": self.judged["runs"], "errors": self.judged["errors"],
                          "tokens": {"prompt": self.judged["prompt"], "completion": self.judged["completion"],
                                     "total": self.judged["prompt"] + self.judged["completion"]},
                          "cost": round(self.judged["cost"], 8) if self.judged["costed"] else None}}
               if self.judged["runs"] or self.judged["errors"] else {}),
            **({"groups": {key: {name: {"runs": runs, "success_rate": rate(succeeded, runs), "scored": scored,
                                        "correct": correct, "accuracy": rate(correct, scored)}
                                 for name, (runs, succeeded, scored, correct) in sorted(values.items())}
                           for key, values in self.groups.items()}} if self.groups else {}),
        }


def rate(part: float, whole: float) -> Optional[float]:
    """part / whole, rounded; None when there is no whole."""
    return round(part / whole, 4) if whole else None


def render(summary: dict) -> List[str]:
    """The table for people, a line a figure."""
    def share(value: Optional[float]) -> str:
        return "n/a" if value is None else f"{value:.1%}"
    counts = ", ".join(f"{status} {count}" for status, count in summary["status_counts"].items()) or "none"
    rounds, tokens, seconds = summary["rounds"], summary["tokens"], summary["seconds"]
    in_words = summary.get("answered_in_words") or 0
    lines = [
        f"tasks            {summary['tasks']}"
        + (f" ({summary['runs']} runs)" if summary.get("runs", summary["tasks"]) != summary["tasks"] else "")
        + f": {counts}",
        f"completion rate  {share(summary['completion_rate'])}"
        + (f" ({share(summary.get('completion_rate_by_finish'))} by a finish action; {in_words} answered in words)"
           if in_words else ""),
    ]
    if summary.get("scored"):
        low, high = summary["accuracy_interval"]
        repeated = summary.get("repeats")
        lines.append(f"accuracy         {share(summary['accuracy'])} ({summary['correct']} of {summary['scored']}"
                     f"{' runs' if repeated else ''} with an expected answer; 95% interval"
                     f"{' of the ' + str(repeated['tasks']) + ' tasks' if repeated else ''} {share(low)} to {share(high)})")
    if summary.get("repeats"):
        lines.append(f"repeats          {repeats_words(summary['repeats'])}")
    lines += [
        f"check pass rate  {share(summary['check_pass_rate'])}"
        + (f" (of {summary['checked']} checked)" if summary["checked"] else ""),
        f"rounds           mean {rounds['mean']:g}, p50 {rounds['p50']:g}, p95 {rounds['p95']:g}",
        f"tokens           {tokens['total']:,} ({share(tokens['cached_share'])} of prompt tokens cached)",
        f"tool calls       {summary['tool_calls']:,}, {summary['tool_errors']:,} errors"
        f" ({share(summary['tool_error_rate'])})",
        f"retries          {summary['retries']:,}; format errors {summary['format_errors']:,}",
        f"time per task    p50 {seconds['p50']:.3g} s, p95 {seconds['p95']:.3g} s",
        *([f"cost             {dollars(summary['cost'])}"
           + (f", {dollars(summary['cost_per_run'])} a run" if summary.get("cost_per_run") is not None else "")
           + (f" ({summary['cost_unknown']} task(s) with no price for a model they used)"
              if summary.get("cost_unknown") else "")] if summary.get("cost") is not None else []),
        f"largest request  {summary['largest_request_chars']:,} chars"
        + (f" of --max-context {summary['max_context']:,}" if summary["max_context"] else ""),
    ]
    if summary.get("escalated"):
        lines.append(f"escalated        {summary['escalated']} task(s), {summary['finished_after_escalating']} of them"
                     " finished")
    if summary.get("scores") or summary.get("scorer_errors"):
        lines.append("scores           " + "; ".join(f"{name} {score['mean']:.3g} (mean of {score['runs']} runs)"
                                                       for name, score in (summary.get("scores") or {}).items())
                     + (f"; {summary['scorer_errors']} run(s) the scorer failed on" if summary.get("scorer_errors")
                        else ""))
    judged = summary.get("judge")
    if judged:
        lines.append(f"judge            {judged['runs']} answer(s) graded, {judged['tokens']['total']:,} tokens"
                     + (f", {dollars(judged['cost'])}" if judged.get("cost") is not None else "")
                     + " (apart from the runs')"
                     + (f"; {judged['errors']} it could not grade" if judged["errors"] else ""))
    for key, values in (summary.get("groups") or {}).items():  # by the tasks' metadata
        lines.append(f"by {key:<13} " + "; ".join(
            f"{name} {share(group['accuracy'])} ({group['correct']} of {group['scored']})" if group["scored"] else
            f"{name} {share(group['success_rate'])} succeeded ({group['runs']} runs)" for name, group in values.items()))
    if len(summary["models"]) > 1:
        lines += [f"  {name:<14} {used['rounds']:,} rounds, {used['tokens']:,} tokens"
                  + (f", {dollars(used['cost'])}" if "cost" in used else "")
                  for name, used in summary["models"].items()]
    return lines


def repeats_words(repeated: dict) -> str:
    """A summary's repeats in words: pass@1 and pass^k, and the share of each try; the same in --summary
    and on the report page."""
    def share(value: Optional[float]) -> str:
        return "n/a" if value is None else f"{value:.1%}"
    per_try = ", ".join(share(value) for value in repeated["per_try"])
    return (f"{repeated['tries']} tries of {repeated['tasks']} task(s): pass@1 {share(repeated['pass_at_1'])},"
            f" pass^{repeated['tries']} {share(repeated['pass_all'])} (pass@1 of the runs, pass^{repeated['tries']}"
            f" of the tasks); per try {per_try} (sd {repeated['spread'] * 100:.1f} points)")


def dollars(amount: float) -> str:
    """An amount of dollars as people read it: cents from a dollar up, else three significant digits."""
    if amount >= 1 or amount <= 0:
        return f"${amount:,.2f}"
    places = max(2, 2 - math.floor(math.log10(amount)))
    whole, part = f"{amount:.{places}f}".split(".")
    return f"${whole}.{part.rstrip('0').ljust(2, '0')}"  # $0.0000045, not $0.00000450
