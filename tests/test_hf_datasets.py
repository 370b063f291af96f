"""A Hugging Face dataset runs as a batch's task file (issue 45): hf:NAME[:SPLIT] from the local cache,
offline, or a folder (saved with save_to_disk, or of data files), its rows read as JSON lines are. The
datasets built here are tiny, made with the library itself where it is installed."""
import glob
import importlib.util
import json
import os
import shutil
import sys
import types

import pytest

from scripted_server import ScriptedServer, action

needs_datasets = pytest.mark.skipif(importlib.util.find_spec("datasets") is None,
                                    reason="the datasets library is not installed (agent-demo[datasets])")
QA = [{"idx": n, "question": f"What is {n}+{n}?", "answer": str(2 * n), "source": "made here"} for n in range(5)]


def adding(body):
    """A model that adds right but for 4+4 (and never sees an answer)."""
    task = body["messages"][1]["content"]
    n = int(task.split("What is ")[1].split("+")[0])
    return action("finish", result=str(9 if n == 4 else 2 * n))


@pytest.fixture
def server(monkeypatch):
    with ScriptedServer([], screen=adding) as scripted:
        monkeypatch.setenv("LLM_API_URL", scripted.url)
        yield scripted


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """The datasets library with its cache in a folder of this module's own, imported here first."""
    home = tmp_path_factory.mktemp("hf-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(home))
        patch.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
        import datasets
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
        patch.setattr(datasets.config, "HF_HUB_CACHE", str(home / "hub"), raising=False)
        datasets.disable_progress_bars()
        yield datasets


def cache(datasets, tmp_path, name, splits):
    """Put a dataset into the local cache under a hub name, as a download there would have left it."""
    from datasets.packaged_modules.json.json import Json
    files = {}
    for split, rows in splits.items():
        files[split] = str(tmp_path / f"{split}.jsonl")
        with open(files[split], "w") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)
    staging = str(tmp_path / "staging")  # its files are named after the dataset, its folder after the config
    Json(dataset_name=name.split("/")[-1], data_files=files, hash="0123abcd", cache_dir=staging).download_and_prepare()
    [made] = glob.glob(os.path.join(staging, name.split("/")[-1], "*"))
    target = os.path.join(str(datasets.config.HF_DATASETS_CACHE), "___".join(name.split("/")), "default")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.move(made, target)


@needs_datasets
def test_a_dataset_of_the_local_cache_runs_offline_with_fields_and_its_answers_never_reach_a_request(
        tmp_path, cli, server, hf):
    cache(hf, tmp_path, "tiny/qa", {"test": QA, "train": QA[:2]})
    code, out, err = cli("--batch", "hf:tiny/qa:test", "--fields", "task=question,expected=answer,id=idx", "--json")
    summary = json.loads(out)
    assert (code, summary["tasks"], summary["correct"]) == (1, 5, 4), err
    assert summary["tasks_file"] == "hf:tiny/qa:test"
    assert "--fields: source not read" in err
    lines = (tmp_path / "hf-tiny-qa-test-results" / "gpt-4o-mini" / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["0", "1", "2", "3", "4"]
    sent = json.dumps([request["body"] for request in server.requests])
    assert "What is 3+3?" in sent and '"6"' not in sent and "made here" not in sent
    code, _, err = cli("--batch", "hf:tiny/qa", "--fields", "task=question")
    assert code == 2 and "--batch hf:tiny/qa has several splits (its splits: test, train): name one as" \
                          " hf:tiny/qa:SPLIT" in err, err
    code, _, err = cli("--batch", "hf:tiny/qa:validation", "--fields", "task=question")
    assert code == 2 and "has no split 'validation' (its splits: test, train)" in err, err


@needs_datasets
def test_a_name_not_in_the_local_cache_is_refused_and_nothing_is_fetched(tmp_path, cli, server, hf):
    code, _, err = cli("--batch", "hf:nobody/missing:test")
    assert (code, len(server.requests)) == (2, 0), err
    assert "'nobody/missing' is not in the local cache of datasets" in err and "reading is offline here" in err
    assert len(err.splitlines()) == 1
    assert hf.config.HF_HUB_OFFLINE is True and os.environ["HF_HUB_OFFLINE"] == "1"


@needs_datasets
def test_a_folder_saved_with_save_to_disk_runs_as_inspect_samples(tmp_path, cli, server, hf):
    samples = [{"id": f"q{n}", "input": f"What is {n}+{n}?", "target": str(2 * n), "metadata": {"level": n % 2}}
               for n in range(5)]
    samples[0]["id"] = None  # a column a row leaves empty: its line number is its id, as a JSON line's
    hf.Dataset.from_list(samples).save_to_disk(str(tmp_path / "saved"))
    code, out, err = cli("--batch", tmp_path / "saved", "--json", "-q")
    summary = json.loads(out)
    assert (code, summary["tasks"], summary["correct"]) == (1, 5, 4), err
    assert set(summary["groups"]["level"]) == {"0", "1"}
    assert (tmp_path / "saved-results" / "gpt-4o-mini" / "traces" / "q3.jsonl").exists()
    hf.DatasetDict({"test": hf.Dataset.from_list(samples[:2]), "train": hf.Dataset.from_list(samples)}).save_to_disk(
        str(tmp_path / "both"))
    code, out, err = cli("--batch", f"{tmp_path / 'both'}:test", "--json", "-q")
    assert (code, json.loads(out)["tasks"]) == (0, 2), err
    code, _, err = cli("--batch", tmp_path / "both")
    assert code == 2 and f"name one as {tmp_path / 'both'}:SPLIT" in err, err


@needs_datasets
def test_a_folder_of_data_files_runs_through_the_library(tmp_path, cli, server, hf):
    (tmp_path / "files").mkdir()
    hf.Dataset.from_list([{"task": row["question"], "expected": row["answer"]} for row in QA]).to_parquet(
        str(tmp_path / "files" / "test.parquet"))
    code, out, err = cli("--batch", tmp_path / "files", "--json", "-q")
    assert (code, json.loads(out)["correct"]) == (1, 4), err


def test_a_dataset_without_the_library_says_what_to_install(tmp_path, cli, server, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets fails, as where it is missing
    (tmp_path / "saved").mkdir()
    for batch in ("hf:tiny/qa", str(tmp_path / "saved")):
        code, _, err = cli("--batch", batch)
        assert (code, len(server.requests)) == (2, 0), err
        assert f"--batch {batch} is a dataset: reading it needs the datasets library: pip install" \
               " 'agent-demo[datasets]'" in err


@pytest.mark.parametrize("library", ["there", "missing"])
def test_a_dataset_folder_with_a_loading_script_is_refused_and_nothing_of_it_runs(tmp_path, cli, server, monkeypatch,
                                                                                   library):
    if library == "missing":  # refused before the library is imported, or found missing
        monkeypatch.setitem(sys.modules, "datasets", None)
    evil = tmp_path / "evil"
    evil.mkdir()
    marker = tmp_path / "ran"
    (evil / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('the loading script ran')\n")
    (evil / "data.jsonl").write_text(json.dumps({"task": "2+2", "expected": "4"}) + "\n")
    for batch in (str(evil), f"{evil}:train", f"hf:{evil}"):
        code, _, err = cli("--batch", batch, "--plan")
        assert (code, server.requests, marker.exists()) == (2, [], False), err
        assert "is Python" in err or "is a path, not a dataset's name" in err, err


def test_a_datasets_library_that_may_run_loading_scripts_is_refused(tmp_path, cli, server, monkeypatch):
    old = types.ModuleType("datasets")
    old.__version__ = "2.16.0"
    hub = types.ModuleType("huggingface_hub")
    hub.constants = types.SimpleNamespace(HF_HUB_OFFLINE=False)
    monkeypatch.setitem(sys.modules, "datasets", old)
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    monkeypatch.setitem(sys.modules, "huggingface_hub.constants", hub.constants)
    (tmp_path / "saved").mkdir()
    code, _, err = cli("--batch", tmp_path / "saved")
    assert code == 2 and "datasets 2.16.0 may run a dataset's loading script" in err and server.requests == [], err


@needs_datasets
@pytest.mark.parametrize("name", ["ds.yaml", "ds.csv"])
def test_a_dataset_folder_is_read_as_rows_whatever_its_name_ends_with(tmp_path, cli, server, hf, name):
    (tmp_path / name).mkdir()
    hf.Dataset.from_list([{"task": row["question"], "expected": row["answer"]} for row in QA]).to_parquet(
        str(tmp_path / name / "test.parquet"))
    code, out, err = cli("--batch", tmp_path / name, "--json", "-q")
    assert (code, json.loads(out)["correct"]) == (1, 4), err


def test_a_dataset_folder_with_a_link_out_of_it_is_refused_and_nothing_is_sent(tmp_path, cli, server):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "private.csv").write_text("question,answer\nmy bank pin is 1234,x\n")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "data.csv").symlink_to(tmp_path / "outside" / "private.csv")
    code, _, err = cli("--batch", tmp_path / "ds", "--fields", "task=question")
    assert (code, server.requests) == (2, []) and "is a link" in err, err
