"""What both tools say about themselves: --version, a grouped --help with one spelling per option,
the --rdzv-conf keys, shell completion, and elastic-ctl's PET_* defaults."""

from __future__ import annotations

import os
import re
from importlib.metadata import version

from rendezvous.settings import CONF_KEYS

from .cli_helpers import run


def test_both_tools_print_their_version():
    for tool_name in ("elastic-run", "elastic-ctl"):
        shown = run(["--version"], tool_name=tool_name)
        assert shown.returncode == 0 and shown.stdout == f"{tool_name} {version('etcd-elastic')}\n", shown


def test_help_groups_the_options_and_shows_one_spelling_of_each():
    shown = run(["--help"]).stdout
    for title in ("The job:", "Rendezvous (etcd):", "Workers:", "Hangs:", "Output and logs:", "Metrics and probes:"):
        assert f"\n{title}\n" in shown, title
    assert "--nproc-per-node" in shown and "--nproc_per_node" not in shown and "--stop-grace" not in shown
    assert "--redirects" in shown and "\n  -r " not in shown
    assert "--help-rdzv-conf" in shown
    assert run(["--nproc_per_node", "1", "--version"]).returncode == 0  # the other spellings still work


def test_help_rdzv_conf_lists_every_key():
    shown = run(["--help-rdzv-conf"])
    assert shown.returncode == 0
    for key, (_, _, text) in CONF_KEYS.items():
        assert re.search(rf"^  {key} +{re.escape(text)}$", shown.stdout, re.M), key
    section = re.search(r"\(README: ([^,)]+)", shown.stdout).group(1)  # the README section it points to is there
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"), encoding="utf-8") as handle:
        assert f"\n## {section}\n" in handle.read(), section


def test_shell_completion_completes_commands_and_options():
    env = {**os.environ, "COMP_WORDS": "elastic-ctl sta", "COMP_CWORD": "1", "_ELASTIC_CTL_COMPLETE": "bash_complete"}
    assert run([], tool_name="elastic-ctl", env=env).stdout.split() == ["plain,status"]
    env = {
        **os.environ,
        "COMP_WORDS": "elastic-run --rdzv-e",
        "COMP_CWORD": "1",
        "_ELASTIC_RUN_COMPLETE": "bash_complete",
    }
    assert "plain,--rdzv-endpoint" in run([], env=env).stdout.split()


def test_elastic_ctl_takes_the_job_from_the_agents_pet_variables(etcd_endpoints):
    env = {**os.environ, "PET_RDZV_ENDPOINT": etcd_endpoints, "PET_RDZV_ID": "no-such-job-here"}
    shown = run(["status"], tool_name="elastic-ctl", env=env)
    assert shown.returncode == 1 and "no job 'no-such-job-here'" in shown.stderr, shown.stderr
