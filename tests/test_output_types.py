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


@dataclasses.dataclass
class Tree:
    name: str
    children: List["Tree"] = dataclasses.field(default_factory=list)
    size: int = dataclasses.field(init=False, default=0)


def test_shapes_of_types_that_people_write():
    tree = output_type_of(Tree)
    assert set(tree.schema["properties"]) == {"name", "children"}, "a field __init__ does not take is no part"
    value, checks = tree.checked({"name": "a", "children": [{"name": "b"}]})
    assert checks == [] and tree.value_of(value) == Tree("a", [Tree("b")])
    from typing import Literal, Tuple

    @dataclasses.dataclass
    class Vote:
        choice: Literal[0, 1]
        where: Tuple[int, str]
    vote = output_type_of(Vote)
    assert vote.checked({"choice": True, "where": [1, "a"]})[1][0]["output"] == "result.choice must be one of [0, 1]"
    assert vote.checked({"choice": 1, "where": [1, 2]})[1][0]["output"] == "result.where[1] must be string, got integer"
    assert vote.value_of({"choice": 1, "where": [1, "a"]}) == Vote(1, (1, "a"))
    assert schema_problem({"const": False}, 0) == "result must be false"


def test_a_dataclass_whose_hints_cannot_be_read_is_a_config_error():
    @dataclasses.dataclass
    class Late:
        part: "NoSuchName"  # noqa: F821
    with pytest.raises(agent_demo.ConfigError, match="the type hints of Late cannot be read"):
        output_type_of(Late)


@pytest.mark.processes
def test_misfits_and_checks_together_are_counted_by_who_rejected_them(serve):
    serve([act("finish", result={"n": "1"}), act("finish", result={"n": "2"}), act("finish", result={"n": 3})],
          key=None)
    result = agent_demo.run("x", output_type=SCHEMA, check="false")
    assert (result.status, str(result.ending)) == ("failed", "3 answers were rejected: 2 by the output type, 1 by"
                                                              " the check")
