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


def test_help_groups_the_options_and_shows_each_with_its_own_spellings():
    shown = run(["--help"]).stdout
    for title in (
        "The job:",
        "Rendezvous (etcd):",
        "Workers:",
        "Health, hangs and crash loops:",
        "Output and logs:",
        "Metrics and probes:",
    ):
        assert f"\n{title}\n" in shown, title
    assert (
        "--nproc-per-node" in shown and "--nproc_per_node" not in shown
    )  # torchrun's other spelling: taken, not shown
    for spelled in ("-m, --module", "-r, --redirects", "-t, --tee", "--shutdown-timeout, --stop-grace"):
        assert spelled in shown, spelled
    assert "--warm-start / --no-warm-start" in shown and "xpu" in shown
    assert "--help-rdzv-conf" in shown
    assert run(["--nproc_per_node", "1", "--version"]).returncode == 0  # the other spellings still work


def test_every_option_the_parser_takes_is_in_help_and_every_help_line_fits_80_columns():
    from launcher.cli.run import elastic_run

    shown = run(["--help"]).stdout
    options = [p for p in elastic_run.params if p.param_type_name == "option"]
    taken = {o for p in options for o in (*p.opts, *p.secondary_opts) if "_" not in o}
    missing = sorted(o for o in taken if not re.search(rf"(^|[ ,/]){re.escape(o)}([ ,\n]|$)", shown, re.M))
    assert not missing, f"taken but not in --help: {missing}"
    for args in (["--help"], ["--help-rdzv-conf"]):
        wide = [line for line in run(args).stdout.splitlines() if len(line) > 80]
        assert not wide, (args, wide)


def test_no_option_listed_as_having_no_effect_changes_what_the_run_does(tmp_path):
    """Each option --help lists as "accepted ... with no effect here" gives the very plan the
    command gives without it (--master-port, which sets the agent store's port, was listed there)."""
    from dataclasses import replace

    from launcher.cli.parse import RunOptions, plan_from
    from launcher.options.table import OPTIONS, moot

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    base = RunOptions(script=str(script), rdzv_endpoint="127.0.0.1:2379", rdzv_id="job", log_dir=str(tmp_path))
    samples = {"--node-rank": 3, "--master-addr": "10.0.0.9", "--start-method": "fork", "--master-port": 29400}

    def changes(name: str) -> bool:
        dest = next(o.key for o in OPTIONS if o.name == name)
        return essence(plan_from(base)) != essence(plan_from(replace(base, **{dest: samples[name]})))

    def essence(plan):  # what the agent is given; its log directory (checked too) is named after a random node id
        config = replace(
            plan.config, logs=replace(plan.config.logs, root=""), checks=replace(plan.config.checks, dirs=())
        )
        return config, plan.settings, plan.exported

    listed = [name for name in moot() if changes(name)]
    assert not listed, f"listed as having no effect, but they change the run: {listed}"
    assert changes("--master-port")  # the check sees a change where there is one
    assert set(moot()) == {"--node-rank", "--master-addr", "--start-method"}


def test_help_rdzv_conf_lists_every_key():
    shown = run(["--help-rdzv-conf"])
    assert shown.returncode == 0
    flat = " ".join(shown.stdout.split())
    for key, (_, _, text) in CONF_KEYS.items():
        assert f" {key} {' '.join(text.split())}" in flat, key
    page, section = re.search(r"\((docs/[\w.-]+): ([^,)]+)", shown.stdout).groups()  # the section it points to
    with open(os.path.join(os.path.dirname(__file__), "..", "..", page), encoding="utf-8") as handle:
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
