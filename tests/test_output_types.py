"""Typed output: output_type= (a JSON Schema, a dataclass, a TypedDict, a pydantic model) and
--output-schema. A fitting result comes back typed; a misfit is sent back; three misfits end failed."""
import dataclasses
import json
from typing import List, Optional, TypedDict

import pytest

import agent_demo
from agent_demo_kit.cli import main
from agent_demo_kit.output_types import output_type_of, schema_problem
from scripted_server import action as act


@dataclasses.dataclass
class Point:
    x: int
    y: int
    label: Optional[str] = None


class Movie(TypedDict):
    title: str
    years: List[int]


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"],
          "additionalProperties": False}


def pydantic_person():
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int
    return Person


KINDS = {  # kind -> (the output type, a misfit, a fit, the fit as the caller gets it)
    "schema": (lambda: SCHEMA, {"n": -1}, {"n": 3}, lambda _: {"n": 3}),
    "dataclass": (lambda: Point, {"x": 1}, {"x": 1, "y": 2}, lambda _: Point(1, 2)),
    "TypedDict": (lambda: Movie, {"title": "A", "years": ["x"]}, {"title": "A", "years": [1999]},
                  lambda _: {"title": "A", "years": [1999]}),
    "pydantic": (pydantic_person, {"name": "B"}, {"name": "B", "age": 3}, lambda kind: kind(name="B", age=3)),
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_misfit_is_sent_back_and_the_second_try_comes_back_typed(serve, kind):
    make, misfit, fit, typed = KINDS[kind]
    output_type = make()
    server = serve([act("finish", result=misfit), act("finish", result=fit)], key=None)
    result = agent_demo.run("x", output_type=output_type)
    assert (result.status, result.rounds, result.result) == ("finished", 2, fit)
    assert result.output == typed(output_type) and type(result.output) is type(typed(output_type))
    told = server.sent_messages(1)[-1]["content"]
    assert "not accepted: the result does not fit the output type" in told
    assert "JSON Schema" in server.sent_messages(0)[1]["content"], "the model is told what to fit"


@pytest.mark.parametrize("kind", KINDS)
def test_three_misfits_end_the_run_failed(serve, kind):
    make, misfit, _, _ = KINDS[kind]
    serve([act("finish", result=misfit)] * 3, key=None)
    result = agent_demo.run("x", output_type=make())
    assert (result.status, result.rounds, result.exit_code) == ("failed", 3, 1)
    assert str(result.ending) == "the output type rejected 3 answers" and result.output is None


def test_a_result_written_as_json_text_is_read_as_json(serve):
    serve([act("finish", result='{"n": 4}')], key=None)
    result = agent_demo.run("x", output_type=SCHEMA)
    assert (result.status, result.output) == ("finished", {"n": 4})


def test_what_is_wrong_is_said_with_where_it_is():
    schema = output_type_of(Movie).schema
    assert schema_problem(schema, {"title": "A", "years": [1, "2"]}) == "result.years[1] must be integer, got string"
    assert schema_problem(schema, {"title": "A"}) == "result lacks years"
    assert schema_problem(schema, {"title": "A", "years": [], "x": 1}) == "result has x, which is not one of title, years"
    assert schema_problem(SCHEMA, {"n": True}) == "result.n must be integer, got boolean"
    assert schema_problem({"$defs": {"p": {"type": "string"}}, "$ref": "#/$defs/p"}, 3) == \
        "result must be string, got integer"
    assert schema_problem(SCHEMA, {"n": 2}) is None


def test_an_output_type_that_is_none_of_the_four_is_a_config_error():
    with pytest.raises(agent_demo.ConfigError, match="output_type must be a JSON Schema"):
        agent_demo.run("x", url="http://127.0.0.1:9/v1", output_type=int)


def test_output_schema_prints_the_answer_as_json_that_fits(serve, tmp_path, capsys):
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    serve([act("finish", result="3"), act("finish", result={"n": 3})])
    assert main(["--no-log", "--output-schema", str(tmp_path / "schema.json"), "count"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"n": 3} and schema_problem(SCHEMA, printed) is None


@pytest.mark.parametrize("text, said", [(None, "cannot read --output-schema"), ("[1", "not JSON"),
                                        ("[1]", "a JSON Schema is an object")])
def test_an_output_schema_file_that_is_not_one_is_a_usage_error(tmp_path, capsys, text, said):
    path = tmp_path / "schema.json"
    if text is not None:
        path.write_text(text)
    assert main(["--no-log", "--output-schema", str(path), "count"]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["schema", "tools"])
def test_finish_is_constrained_to_the_type_where_the_endpoint_constrains_replies(serve, mode):
    server = serve([act("finish", result={"x": 1, "y": 2})] if mode == "schema" else
                   [{"content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                       "name": "finish", "arguments": json.dumps({"result": {"x": 1, "y": 2}})}}]}], key=None)
    result = agent_demo.run("x", mode=mode, output_type=Point)
    assert result.output == Point(1, 2)
    body = server.requests[0]["body"]
    if mode == "schema":
        actions = body["response_format"]["json_schema"]["schema"]["properties"]["actions"]["anyOf"]
        finish = next(branch for each in actions for branch in each["items"]["anyOf"]
                      if branch["properties"]["tool"]["enum"] == ["finish"])
        held = finish["properties"]["args"]["properties"]["result"]
    else:
        [finish] = [tool["function"] for tool in body["tools"] if tool["function"]["name"] == "finish"]
        held = finish["parameters"]["properties"]["result"]
    assert held["type"] == "object" and held["required"] == ["x", "y"] and held["additionalProperties"] is False
    assert held["properties"]["label"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
