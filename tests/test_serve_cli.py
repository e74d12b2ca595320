"""python -m hetu.serve's command line: --help names the verbs and exits 0, as each verb's --help does."""
import sys

import pytest

import jobs


def serve(*argv):
    return jobs.run([sys.executable, "-m", "hetu.serve", *argv], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_names_the_verbs_and_exits_0(flag):
    done = serve(flag)
    assert done.returncode == 0, done.stderr
    for verb in ("export", "predict", "run"):
        assert f"\n  {verb} " in done.stdout, done.stdout
    nothing = serve()
    assert nothing.returncode == 2 and "--help" in nothing.stderr


@pytest.mark.parametrize("verb", ["export", "predict", "run"])
def test_each_verb_s_help_exits_0(verb):
    done = serve(verb, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m hetu.serve {verb}"), done.stdout
    assert done.stderr == ""
