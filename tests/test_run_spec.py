"""The run spec (hetu.run): the flags are generated from it, a YAML file holds the same
(--config, --print-config), validate() names every wrong field at once, the model's defaults
fill what a run leaves unset, and a checkpoint keeps the spec its resumed run takes its model from."""
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import REPO

import hetu.run as run
from hetu import threads
from hetu.run import RunSpec, SpecError
from hetu.run.defaults import catalog

sys.path.insert(0, str(REPO / "examples/ctr"))
import train  # noqa: E402

CATALOG = catalog()
# Every group touched, fields of each type and a model that is not the default.
FLAGS = ["--model", "dcn_criteo", "--embedding-size", "16", "--batch-size", "32", "--nepoch", "1.5", "--val",
         "--comm", "Hybrid", "--cache", "lfu", "--bound", "2", "--bsp", "-1", "--cache-limit-ratio", "0.25",
         "--optimizer", "adam", "--learning-rate", "0.003", "--embedding-dtype", "bf16", "--table-storage", "disk",
         "--table-dir", "/tmp/rows", "--table-cache-mb", "64", "--rows", "1000", "--checkpoint", "/tmp/ck",
         "--checkpoint-every", "5", "--save-predictions", "p.npy", "--threads", "3", "--no-progress",
         "--log-interval", "2.5", "--seed", "7", "--iters-per-epoch", "9", "--dropout", "0.1"]


def parse(*flags, herald=False):
    return run.parse(list(flags), CATALOG, herald=herald)


def written(tmp_path, data, name="run.yml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_flags_yaml_and_back_are_the_same_spec(tmp_path):
    spec = parse(*FLAGS)
    assert spec.model.name == "dcn_criteo" and spec.tables.cache_mb == 64.0 and spec.mode.bsp == -1
    assert spec.epochs == 1.5 and spec.validation.val and spec.sequence.dropout == 0.1
    again, errors, _ = run.from_dict(yaml.safe_load(run.to_yaml(spec)))
    assert errors == [] and run.validate(again, CATALOG) == [] and again == spec
    assert parse(*run.to_flags(again)) == spec
    assert run.to_flags(again) == run.to_flags(spec)
    # and through a file
    assert parse("--config", written(tmp_path, run.to_dict(spec))) == spec


def test_defaults_parse_to_the_spec_of_the_model_defaults():
    spec = parse()
    model = CATALOG[spec.model.name]
    assert spec.optimizer.name == model.optimizer and spec.optimizer.learning_rate == model.learning_rate
    assert spec.model.embedding_size == model.embedding_size and spec.batch_size == 128


def bad_value(field):
    """A value of `field` its check refuses (of its type where it has a check or choices)."""
    if field.choices is not None:
        return "no-such-choice"
    if field.check is not None:
        return field.kind(-5)
    return {bool: "yes", int: "seven", float: "x", str: 5}[field.kind]


@pytest.mark.parametrize("field", run.FIELDS, ids=[f.path for f in run.FIELDS])
def test_every_field_refuses_a_bad_value_by_name(field):
    spec = RunSpec()
    spec.set(field.path, bad_value(field))
    lines = run.validate(spec, CATALOG, herald=True)
    assert len(lines) == 1 and lines[0].startswith(f"spec error: {field.path}: "), lines
    assert repr(bad_value(field)) in lines[0]


def test_every_wrong_field_is_reported_at_once(capsys):
    with pytest.raises(SpecError) as stop:
        parse("--batch-size", "0", "--table-cache-mb", "-3", "--comm", "Ring", "--iters-per-epoch", "ten")
    assert stop.value.code == 2
    assert sorted(stop.value.lines) == sorted([
        "spec error: batch_size: argument --batch-size: must be a positive integer, got '0'",
        "spec error: tables.cache_mb: argument --table-cache-mb: must be a positive finite number, got '-3'",
        "spec error: mode.comm: argument --comm: must be one of None, PS, AllReduce, Hybrid, got 'Ring'",
        "spec error: iters_per_epoch: argument --iters-per-epoch: must be a positive integer, got 'ten'"])


@pytest.mark.parametrize("flags,path,message", [
    (["--comm", "PS", "--table-storage", "disk"], "tables.dir", "--table-storage disk: give --table-dir DIR"),
    (["--table-dir", "d"], "tables.dir", "--table-dir is for --table-storage disk"),
    (["--admit-after", "2"], "tables.admit_after", "--admit-after sets a dynamic table: give --table-capacity"),
    (["--model", "sasrec", "--rows", "10"], "data.rows",
     "--model sasrec: --rows is not supported for the sequential models yet"),
    (["--model", "hstu", "--heads", "3"], "sequence.heads", "--embedding-size 50 is not a multiple of --heads 3"),
    (["--window", "5", "--stream", "-", "--val", "--table-capacity", "8"], "validation.val",
     "--stream: --val is for a prepared folder")])
def test_what_a_field_needs_of_another_is_the_specs_check(flags, path, message):
    with pytest.raises(SpecError) as stop:
        parse(*flags)
    assert len(stop.value.lines) == 1 and stop.value.lines[0].startswith(f"spec error: {path}: ")
    assert message in stop.value.lines[0], stop.value.lines


def test_a_file_names_its_unknown_keys_and_wrong_types(tmp_path):
    path = written(tmp_path, {"tables": {"cache_size": 3, "cache_mb": "big"}, "epoch": 2, "mode": {"bsp": 0}})
    with pytest.raises(SpecError) as stop:
        parse("--config", path)
    lines = stop.value.lines
    assert any(line.startswith("spec error: tables.cache_size: unknown key in " + path) for line in lines), lines
    assert any(line.startswith("spec error: epoch: unknown key in " + path) for line in lines), lines
    assert f"spec error: tables.cache_mb: must be a positive finite number, got 'big' ({path})" in lines, lines
    assert len(lines) == 3


def test_flags_override_the_file(tmp_path):
    path = written(tmp_path, {"batch_size": 32, "model": {"name": "dfm_criteo"}, "output": {"no_progress": True}})
    spec = parse("--config", path, "--batch-size", "48")
    assert spec.batch_size == 48 and spec.model.name == "dfm_criteo" and spec.output.no_progress


def test_an_unquoted_on_or_off_is_the_choice(tmp_path):
    path = tmp_path / "run.yml"
    path.write_text("tables:\n  prefetch: off\n")   # YAML 1.1 reads a bare off as false
    assert parse("--config", str(path)).tables.prefetch == "off"


def test_print_config_writes_the_resolved_spec(capsys):
    with pytest.raises(SystemExit) as stop:
        parse("--model", "dlrm_criteo", "--comm", "PS", "--print-config", herald=True)
    assert stop.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    again, errors, _ = run.from_dict(printed)
    assert errors == [] and again == parse("--model", "dlrm_criteo", "--comm", "PS", herald=True)
    assert printed["optimizer"]["name"] == CATALOG["dlrm_criteo"].optimizer   # the model's, resolved


def test_a_herald_field_is_refused_by_run_hetu(tmp_path):
    with pytest.raises(SpecError) as stop:
        parse("--config", written(tmp_path, {"mode": {"lookahead": 4}}))
    assert stop.value.lines == [f"spec error: mode.lookahead: is for run_laia.py (the Herald scheduler), got 4 "
                                f"({tmp_path / 'run.yml'})"]


def test_the_example_file_is_a_valid_spec():
    spec = parse("--config", str(REPO / "examples/config/run.yml"))
    assert spec != parse() and spec.validation.val   # it sets something


# --------------------------------------------------------------------------- runs

@pytest.fixture
def in_process(data_home, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HETU_DATA_HOME", data_home)
    monkeypatch.chdir(tmp_path)
    for name in threads.THREAD_VARS:
        monkeypatch.setenv(name, "1")

    def train_run(*flags):
        summary = train.main(list(flags))
        return summary, capsys.readouterr().out
    return train_run


TINY = ["--model", "wdl_criteo", "--rows", "512", "--batch-size", "64", "--embedding-size", "4", "--no-progress"]


def test_a_run_from_its_file_equals_the_run_from_its_flags(in_process, tmp_path):
    in_process(*TINY, "--save-params", "flags.npz")
    path = written(tmp_path, {"model": {"name": "wdl_criteo", "embedding_size": 4}, "data": {"rows": 512},
                              "batch_size": 64, "output": {"no_progress": True, "save_params": "file.npz"}})
    in_process("--config", path)
    flags, file = np.load("flags.npz"), np.load("file.npz")
    assert sorted(flags.files) == sorted(file.files) and len(flags.files) > 3
    assert all(np.array_equal(flags[k], file[k]) for k in flags.files)


def test_resume_takes_the_model_from_the_checkpoints_spec(in_process, tmp_path):
    in_process("--model", "dfm_criteo", "--embedding-size", "4", "--rows", "512", "--batch-size", "64",
               "--no-progress", "--optimizer", "adam", "--checkpoint", "ckpt")
    summary, out = in_process("--resume", "ckpt", "--rows", "512", "--nepoch", "2", "--no-progress")
    assert summary["model"] == "dfm_criteo" and "embedding rows x 4," in out and "resumed at step 7" in out, out
    with pytest.raises(SpecError) as stop:
        in_process("--resume", "ckpt", "--rows", "512", "--nepoch", "2", "--embedding-size", "8")
    assert stop.value.lines == ["spec error: model.embedding_size: --resume ckpt: the checkpoint was trained with "
                                "--embedding-size 4, this run has --embedding-size 8"]


def test_run_hetu_exits_2_naming_each_wrong_field(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--batch-size", "-1",
                           "--cache", "lru", "--dropout", "2"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HETU_DATA_HOME=str(tmp_path / "data")))
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "spec error: sequence.dropout: argument --dropout: must be in [0, 1), got '2'",
        "spec error: batch_size: argument --batch-size: must be a positive integer, got '-1'"], proc.stderr
    assert not (tmp_path / "data").exists()


# --------------------------------------------------------------------------- the environment

def test_every_hetu_variable_the_package_reads_is_in_env_py():
    import re
    from hetu import env
    named = set()
    for root in (REPO / "python/hetu", REPO / "examples"):
        for path in root.rglob("*.py"):
            named |= set(re.findall(r"\bHETU_[A-Z0-9_]+\b", path.read_text()))
    assert named and named <= set(env.BY_NAME), sorted(named - set(env.BY_NAME))
    with pytest.raises(KeyError, match="HETU_NOT_A_VARIABLE is not one of"):
        env.raw("HETU_NOT_A_VARIABLE")


def test_the_usage_docs_table_is_env_py():
    from hetu import env
    text = (REPO / "docs/usage.md").read_text()
    section = text.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert table == env.table_markdown().splitlines()


def test_a_checkpoint_from_before_the_spec_resumes_by_its_recorded_flags():
    old = {"model": "dcn_criteo", "embedding_size": 8, "batch_size": 32, "optimizer": "sgd", "embedding_dtype": "fp32",
           "comm": None, "dataset": "synthetic", "data_dir": None, "rows": 512, "scale": None, "stream": None,
           "stream_format": "criteo", "models_dir": "/gone/examples/ctr/models"}
    spec = run.parse(["--resume", "old", "--rows", "512"], CATALOG, read_checkpoint=lambda folder: old)
    assert (spec.model.name, spec.model.embedding_size, spec.batch_size, spec.optimizer.name) == \
        ("dcn_criteo", 8, 32, "sgd")
    with pytest.raises(SpecError) as stop:
        run.parse(["--resume", "old", "--rows", "1000"], CATALOG, read_checkpoint=lambda folder: old)
    assert stop.value.lines == ["spec error: data.rows: --resume old: the checkpoint was trained with --rows 512, "
                                "this run has --rows 1000"]


def test_export_reads_the_model_and_data_from_the_checkpoints_spec():
    """hetu.serve's export rebuilds the model from flat_record(run): the spec's fields under their
    flags' names win over the flat keys written beside it; a record of before the spec keeps its own."""
    spec = parse("--model", "dcn_criteo", "--embedding-size", "16", "--rows", "512", "--data-dir", "/data/x")
    record = {"model": "wdl_criteo", "embedding_size": 8, "rows": 100, "architecture": None,
              "spec": run.to_dict(spec)}
    flat = run.flat_record(record)
    assert (flat["model"], flat["embedding_size"], flat["rows"], flat["data_dir"]) == ("dcn_criteo", 16, 512, "/data/x")
    assert "architecture" in flat and flat["spec"] == record["spec"]
    old = {"model": "wdl_criteo", "embedding_size": 8}
    assert run.flat_record(old) == old
