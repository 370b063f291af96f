"""--escalate: a cheap model first, a stronger one when the first is in trouble, against a scripted
endpoint that answers each model from its own script."""
import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import KEY, run_cli, start_cli
from scripted_server import ScriptedServer, action

FINISH = action("finish", result="1536")
BROKEN = '{"tool": "calculator", "args": {"expression": '  # no usable action: cut off mid-JSON
CHECK = 'test "$AGENT_ANSWER" = 1536'


class ByModel:
    """Plays each model's own list of replies (the last one repeats); keeps each request by model."""

    def __init__(self, **scripts):
        self.scripts = scripts
        self.requests = {name: [] for name in scripts}

    def __call__(self, body):
        model = body["model"]
        self.requests[model].append(body)
        script = self.scripts[model]
        return script[min(len(self.requests[model]), len(script)) - 1]


def records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def escalations(path):
    return [record for record in records(path) if record["event"] == "escalation"]


def test_three_replies_without_an_action_hand_the_run_to_the_stronger_model(cli, serve, tmp_path):
    script = ByModel(small=[BROKEN + '"1', BROKEN + '"2', BROKEN + '"3'], big=[FINISH])
    serve([], screen=script)
    code, out, err = cli("-m", "small", "--escalate", "big", "--trace", tmp_path / "run.jsonl", "compute 512 * 3")
    assert (code, out) == (0, "1536\n"), err
    assert "escalated to big: its replies held no usable action, again and again (after round 3)" in err
    [switch] = escalations(tmp_path / "run.jsonl")
    assert (switch["trigger"], switch["from_model"], switch["to_model"], switch["after_round"]) == \
        ("format", "small", "big", 3)
    first_request = script.requests["big"][0]["messages"]
    assistant = [m["content"] for m in first_request if m["role"] == "assistant"]
    assert assistant == [BROKEN + '"1', BROKEN + '"2', BROKEN + '"3'], "the whole conversation"
    assert first_request[-1]["role"] == "user" and first_request[-1]["content"].endswith(switch["notice"])
    assert "you (big) take over this task from small" in switch["notice"]
    assert "no usable action" in switch["notice"]
    rounds = [record for record in records(tmp_path / "run.jsonl") if record["event"] == "round"]
    assert [record["model"] for record in rounds] == ["small", "small", "small", "big"]


@pytest.mark.processes
def test_the_stronger_models_request_is_the_first_models_with_the_receipt_appended(cli, serve, tmp_path):
    script = ByModel(small=[action("calculator", expression="512 * 3"), action("finish", result="512")],
                     big=[FINISH])
    serve([], screen=script)
    code, out, err = cli("-m", "small", "--escalate", "big", "--check", CHECK, "--json", "compute 512 * 3")
    result = json.loads(out)
    assert (code, result["status"], result["result"]) == (0, "finished", "1536"), err
    assert set(result["models"]) == {"small", "big"}
    assert result["models"]["small"]["rounds"] == 2 and result["models"]["big"]["rounds"] == 1
    assert result["models"]["small"]["tokens"] == 30 and result["models"]["big"]["tokens"] == 15
    before, after = script.requests["small"][-1]["messages"], script.requests["big"][0]["messages"]
    assert after[:len(before)] == before, "append-only: every message the first model saw, unchanged"
    said = after[len(before):]
    assert [m["role"] for m in said] == ["assistant", "user"]
    assert "the check rejected its answer" in said[1]["content"] and '"512"' in said[1]["content"]
    assert "calculator" in said[1]["content"], "what was tried"
    assert "escalated to big: the check rejected its answer" in err


def test_a_model_the_endpoint_does_not_have_hands_the_run_over_instead_of_exit_3(cli, serve):
    missing = {"status": 404, "body": {"error": {"message": "model 'small' not found"}}}
    script = ByModel(small=[missing], big=[FINISH])
    serve([], screen=script)
    code, out, err = cli("-m", "small", "--escalate", "big", "compute 512 * 3")
    assert (code, out) == (0, "1536\n"), err
    assert "escalated to big: its endpoint failed: " in err and "not found" in err
    assert len(script.requests["small"]) == 1, "a 404 is not retried"
    assert "you (big) take over this task from small" in script.requests["big"][0]["messages"][1]["content"]


def test_a_first_endpoint_that_is_down_hands_the_run_to_the_stronger_models_own(cli, monkeypatch, tmp_path):
    script = ByModel(big=[FINISH])
    with ScriptedServer([], screen=script) as strong:
        monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")  # nothing listens there
        monkeypatch.setenv("LLM_ESCALATE_KEY", "sk-escalate-SECRET-0123456789")
        monkeypatch.setenv("AGENT_RETRIES", "0")
        code, out, err = cli("-m", "small", "--escalate", "big", "--escalate-url", strong.url, "--json",
                             "compute 512 * 3")
        assert strong.requests[0]["headers"]["Authorization"] == "Bearer sk-escalate-SECRET-0123456789"
    assert (code, json.loads(out)["status"]) == (0, "finished"), err
    assert "escalated to big: its endpoint failed: cannot reach" in err
    assert "sk-escalate-SECRET" not in out + err


def test_the_first_models_key_never_goes_to_another_endpoint(cli, monkeypatch):
    with ScriptedServer([{"status": 500, "body": "down"}]) as first, ScriptedServer([FINISH]) as strong:
        monkeypatch.setenv("LLM_API_URL", first.url)
        monkeypatch.setenv("LLM_API_KEY", KEY)
        monkeypatch.setenv("AGENT_RETRIES", "0")
        code, _, err = cli("-m", "small", "--escalate", "big", "--escalate-url", strong.url, "compute 512 * 3")
        assert first.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
        assert "Authorization" not in strong.requests[0]["headers"]
    assert code == 0, err


def test_a_call_repeated_until_stuck_and_replies_cut_at_the_cap_hand_the_run_over(cli, serve, tmp_path):
    again = action("calculator", expression="2 + 2")
    script = ByModel(small=[again], big=[FINISH])
    serve([], screen=script)
    code, _, err = cli("-m", "small", "--escalate", "big", "--trace", tmp_path / "stuck.jsonl", "add up")
    assert code == 0 and [s["trigger"] for s in escalations(tmp_path / "stuck.jsonl")] == ["stuck"], err
    cut = {"content": "Let me think about this very carefully, step by", "finish_reason": "length"}
    script = ByModel(small=[cut], big=[FINISH])
    serve([], screen=script)
    code, _, err = cli("-m", "small", "--escalate", "big", "--trace", tmp_path / "cut.jsonl", "add up")
    assert code == 0 and [s["trigger"] for s in escalations(tmp_path / "cut.jsonl")] == ["length"], err
    assert escalations(tmp_path / "cut.jsonl")[0]["after_round"] == 2


def test_a_trigger_turned_off_leaves_the_ending_as_it_was(cli, serve):
    script = ByModel(small=[BROKEN], big=[FINISH])
    serve([], screen=script)
    code, _, err = cli("-m", "small", "--escalate", "big", "--escalate-on", "check,endpoint", "--mode", "json",
                       "--max-rounds", 6, "add up")
    assert code == 1 and not script.requests["big"], err


def test_good_rounds_hand_the_run_back_and_escalations_stop_at_the_most(cli, serve, tmp_path):
    work = [action("calculator", expression=f"{n} + 1") for n in range(40)]
    script = ByModel(small=[BROKEN + f'"{n}' for n in range(100)], big=work)
    serve([], screen=script)
    code, _, err = cli("-m", "small", "--escalate", "big", "--escalate-back", 2, "--escalate-max", 2,
                       "--max-rounds", 16, "--trace", tmp_path / "run.jsonl", "add up")
    switches = [(s["trigger"], s["to_model"]) for s in escalations(tmp_path / "run.jsonl")]
    assert switches == [("format", "big"), ("calm", "small"), ("format", "big")], err
    rounds = [r["model"] for r in records(tmp_path / "run.jsonl") if r["event"] == "round"]
    assert rounds[:8] == ["small"] * 3 + ["big"] * 2 + ["small"] * 3
    assert set(rounds[8:]) == {"big"} and len(rounds) == 16, "after the last escalation the stronger model keeps it"
    assert code == 1 and "round limit" in err


@pytest.mark.processes
def test_a_resume_after_kill_9_during_an_escalated_round_goes_on_with_the_stronger_model(tmp_path):
    slow_finish = {"content": FINISH, "delay": 30}
    script = ByModel(small=[BROKEN + '"1', BROKEN + '"2', BROKEN + '"3'], big=[slow_finish])
    trace = tmp_path / "run.jsonl"
    with ScriptedServer([], screen=script) as server:
        env = {"LLM_API_URL": server.url, "LLM_API_KEY": KEY}
        process = start_cli("-m", "small", "--escalate", "big", "--trace", trace, "add up", env=env)
        deadline = time.monotonic() + 20
        while not script.requests["big"] and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.communicate()
        assert script.requests["big"], "the stronger model's request was in flight"
        script.scripts["big"] = [FINISH]
        sent_small = len(script.requests["small"])
        code, out, err = run_cli("--resume", trace, "-m", "small", "--escalate", "big", env=env)
        assert (code, out) == (0, "1536\n"), err
        assert len(script.requests["small"]) == sent_small, "not a request to the first model"
        resumed = script.requests["big"][-1]["messages"]
    assert resumed == script.requests["big"][0]["messages"], "the same request, the receipt included"
    assert [r["model"] for r in records(trace) if r["event"] == "round"][-1] == "big"


def test_without_escalate_rounds_carry_no_model_and_json_no_models(cli, serve, tmp_path):
    serve([FINISH])
    code, out, _ = cli("--json", "--trace", tmp_path / "run.jsonl", "compute")
    assert code == 0 and "models" not in json.loads(out)
    assert all("model" not in r for r in records(tmp_path / "run.jsonl") if r["event"] == "round")


@pytest.mark.parametrize("args, said", [
    (("--escalate-on", "format,typo"), "must name triggers among format,stuck,check,length,endpoint"),
    (("--escalate-back", "-1"), "must be at least 0"),
    (("--escalate-max", "0"), "must be at least 1"),
])
def test_escalation_flags_are_checked(cli, args, said):
    code, _, err = cli("--escalate", "big", *args, "task")
    assert code == 2 and said in err


def test_show_and_the_batch_summary_count_rounds_and_tokens_per_model(cli, serve, tmp_path):
    script = ByModel(small=[BROKEN], big=[FINISH])
    serve([], screen=script)
    assert cli("-m", "small", "--escalate", "big", "--trace", tmp_path / "run.jsonl", "add")[0] == 0
    code, out, err = cli("--show", tmp_path / "run.jsonl", "--json")
    assert json.loads(out)["models"] == {"small": {"rounds": 3, "tokens": 45}, "big": {"rounds": 1, "tokens": 15}}
    assert "escalated to big" in err and "  small: 3 round(s), 45 tokens; big: 1 round(s), 15 tokens" in err
    code, _, err = cli("--show", tmp_path / "run.jsonl")
    assert "  small: 3 round(s), 45 tokens; big: 1 round(s), 15 tokens" in err, "on the trace as it ran, too"
    (tmp_path / "tasks.txt").write_text("add one\nadd two\n")
    code, out, _ = cli("--batch", tmp_path / "tasks.txt", "-m", "small", "--escalate", "big", "--json")
    summary = json.loads(out)
    assert summary["models"] == {"small": {"rounds": 6, "tokens": 90}, "big": {"rounds": 2, "tokens": 30}}
    assert summary["escalated"] == 2 and summary["finished_after_escalating"] == 2


def test_escalating_to_the_same_model_is_refused_before_anything_is_sent(cli, serve):
    server = serve([FINISH])
    code, _, err = cli("-m", "small", "--escalate", "small", "task")
    assert code == 2 and "--escalate names the model the run starts with" in err and not server.requests


@pytest.mark.processes
def test_the_round_that_ends_the_run_hands_nothing_back(cli, serve, tmp_path):
    script = ByModel(small=[action("finish", result="512")],
                     big=[action("calculator", expression="12 + 500"), action("calculator", expression="512 * 3"),
                          FINISH])
    serve([], screen=script)
    code, _, err = cli("-m", "small", "--escalate", "big", "--check", CHECK, "--trace", tmp_path / "run.jsonl",
                       "compute (12 + 500) * 3")
    assert code == 0 and [s["trigger"] for s in escalations(tmp_path / "run.jsonl")] == ["check"], err


@pytest.mark.processes
def test_from_python_escalation_takes_its_settings_by_keyword(serve):
    import agent_demo
    script = ByModel(small=[action("finish", result="512")], big=[FINISH])
    serve([], screen=script)
    result = agent_demo.run("compute 512 * 3", model="small", escalate="big", escalate_on=["check"], check=CHECK)
    assert (result.status, result.result) == ("finished", "1536")
    assert result.models == {"small": {"rounds": 1, "tokens": 15}, "big": {"rounds": 1, "tokens": 15}}
    with pytest.raises(agent_demo.ConfigError, match="escalate_on must name triggers"):
        agent_demo.run("task", escalate="big", escalate_on=["sometimes"])


@pytest.mark.processes
def test_the_note_stays_with_the_task_once_its_round_is_folded(cli, serve, tmp_path):
    work = [action("calculator", expression=f"{n} + 1") for n in range(8)]
    script = ByModel(small=[*work, action("finish", result="512")], big=[FINISH])
    serve([], screen=script)
    code, _, err = cli("-m", "small", "--escalate", "big", "--check", CHECK, "--max-rounds", 12,
                       "--max-context", 3500, "compute")
    assert code == 0 and "folded into the digest" in err, err
    first = script.requests["big"][0]["messages"]
    assert any("you (big) take over this task from small" in m["content"] for m in first), "the receipt survives"


@pytest.mark.processes
def test_the_hint_after_the_stronger_models_endpoint_failed_names_its_flags(cli, serve):
    script = ByModel(small=[action("finish", result="512")])
    serve([], screen=script)
    code, _, err = cli("-m", "small", "--escalate", "big", "--escalate-url", "http://127.0.0.1:9/v1", "--check", CHECK,
                       "--retries", 0, "compute")
    hint = next(line for line in err.splitlines() if "to continue" in line)
    assert code == 3 and "once http://127.0.0.1:9/v1/chat/completions answers (or with the right --escalate-url)" in hint
    assert "-m small" in hint and "--escalate big" in hint and "--check" in hint
    assert "--escalate-url http://127.0.0.1:9/v1" in hint, "a resume needs it given: once it answers, the hint works"


@pytest.mark.parametrize("args, said", [
    (("--escalate", " "), "--escalate must name a model"),
    (("--escalate", "big", "--escalate-on", ""), "must name triggers"),
    (("--escalate-url", "http://127.0.0.1:9/v1"), "--escalate-url goes with --escalate, which names no model"),
    (("--escalate-max", "3"), "--escalate-max goes with --escalate"),
])
def test_escalation_settings_that_would_do_nothing_are_refused(cli, serve, args, said):
    server = serve([FINISH])
    code, _, err = cli(*args, "task")
    assert code == 2 and said in err and not server.requests


def test_config_shows_an_escalation_that_cannot_work(cli, serve):
    serve([FINISH])
    code, out, _ = cli("-m", "big", "--escalate", "big", "--config", "--json")
    assert code == 0 and "names the model the run starts with" in json.loads(out)["problem"]


def test_without_escalate_the_start_record_is_as_before(cli, serve, tmp_path):
    serve([FINISH])
    cli("--trace", tmp_path / "run.jsonl", "compute")
    assert not [key for key in records(tmp_path / "run.jsonl")[0] if key.startswith("escalate")]


def test_models_are_counted_even_when_no_round_completed(cli, monkeypatch):
    with ScriptedServer([{"status": 401, "body": {"error": {"message": "bad key"}}}]) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, _ = cli("-m", "small", "--escalate", "big", "--json", "task")
    assert code == 3 and json.loads(out)["models"] == {}


@pytest.mark.parametrize("broken", ["{bad json", "{tool: calculator, args: {expression: 2 + 1}}"])
def test_a_broken_action_is_never_taken_for_the_first_models_answer_and_the_stronger_model_is_asked(
        cli, serve, tmp_path, broken):
    script = ByModel(small=[broken], big=[FINISH])
    serve([], screen=script)
    code, out, err = cli("-m", "small", "--escalate", "big", "--json", "compute 512 * 3")
    printed = json.loads(out)
    assert (code, printed["status"], printed["result"]) == (0, "finished", "1536"), err
    assert printed["answered_in_words"] is False
    assert len(script.requests["small"]) == 3 and len(script.requests["big"]) == 1


@pytest.mark.parametrize("mode", ["json", "schema"])
def test_the_model_that_takes_over_after_a_watchdog_stop_starts_its_own_count(cli, serve, tmp_path, mode):
    again = action("calculator", expression="2 + 2")
    in_mode = (lambda text: '{"actions": [' + text + "]}") if mode == "schema" else (lambda text: text)
    script = ByModel(small=[in_mode(again)], big=[in_mode(again), in_mode(action("finish", result="4"))])
    serve([], screen=script)
    trace = tmp_path / "run.jsonl"
    code, out, err = cli("-m", "small", "--escalate", "big", "--mode", mode, "--trace", trace, "add up")
    assert (code, out.strip()) == (0, "4"), err
    assert [s["trigger"] for s in escalations(trace)] == ["stuck"]
    told = json.dumps(script.requests["big"][1]["messages"][-1])
    assert '\\"data\\": 4' in told, "the repeat was answered with the recorded result"
    assert "already made" in told or "same" in told.lower() or "earlier" in told.lower(), told


def test_a_resumed_run_after_a_hand_over_keeps_the_new_models_own_count(cli, serve, tmp_path):
    again = action("calculator", expression="2 + 2")
    script = ByModel(small=[again], big=[again])
    serve([], screen=script)
    trace = tmp_path / "run.jsonl"
    code, out, err = cli("-m", "small", "--escalate", "big", "--trace", trace, "--max-rounds", 5, "add up")
    assert code == 1 and "round limit" in err, err  # small stuck at round 4; big's first repeat cached at round 5
    script = ByModel(small=[action("finish", result="no")], big=[again, action("finish", result="4")])
    serve([], screen=script)
    code, out, err = cli("--resume", trace, "-m", "small", "--escalate", "big", "--max-rounds", 8)
    assert (code, out.strip()) == (0, "4"), "big's second repeat is refused (its count, replayed), not stuck"


@pytest.mark.processes
@pytest.mark.parametrize("mode", ["json", "schema"])
def test_the_model_that_takes_over_repeats_the_stuck_call_under_a_check_and_the_run_goes_on_to_its_answer(
        cli, serve, tmp_path, mode):
    in_mode = (lambda text: '{"actions": [' + text + "]}") if mode == "schema" else (lambda text: text)
    stuck, aside = action("calculator", expression="512 * 3"), action("calculator", expression="512 + 3")
    script = ByModel(small=[in_mode(stuck)],
                     big=[in_mode(stuck), in_mode(aside), in_mode(stuck), in_mode(FINISH)])
    serve([], screen=script)
    trace = tmp_path / "run.jsonl"
    code, out, err = cli("-m", "small", "--escalate", "big", "--mode", mode, "--check", "grep -q 1536",
                         "--max-rounds", 8, "--trace", trace, "compute 512 * 3")
    assert (code, out.strip()) == (0, "1536"), err
    assert [s["trigger"] for s in escalations(trace)] == ["stuck"]
    rounds = [record for record in records(trace) if record["event"] == "round"]
    assert [record["model"] for record in rounds] == ["small"] * 4 + ["big"] * 4
    by_big = [call for record in rounds[4:] for call in record["calls"]]
    assert [call.get("watchdog") for call in by_big[:3]] == ["cached", None, "refused"], \
        "the first model's call answered from the record, then the big model's own repeat refused"
    assert by_big[0]["result"] == {"ok": True, "data": 1536} and "round 1" in by_big[0]["note"]
