"""Bad input: one clear line on stderr, a non-zero exit, no traceback, no hang."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest

from .cli_helpers import PROBE, finish, run, run_id, start, tool, wait_joined

ETCD = "127.0.0.1:1"  # nothing listens there; only reached by the unreachable-etcd case
BASE = ["--rdzv-endpoint", ETCD, "--rdzv-id", "job", "--rdzv-conf", "read_timeout=1,connect_timeout=1"]

CASES = [
    # (args, env, expected exit code, words the line must contain)
    (["--nnodes", "3:2", *BASE, PROBE], {}, 2, "MIN (3) is larger than MAX (2)"),
    (["--nnodes", "0", *BASE, PROBE], {}, 2, "at least 1"),
    (["--nnodes", "abc", *BASE, PROBE], {}, 2, "--nnodes must be N or MIN:MAX"),
    (["--nproc-per-node", "0", *BASE, PROBE], {}, 2, "--nproc-per-node must be at least 1"),
    (["--nproc_per_node", "lots", *BASE, PROBE], {}, 2, "a number, cpu, gpu, xpu or auto"),
    (
        ["--rdzv-backend", "c10d", "--nnodes", "2", "--rdzv-endpoint", "localhost:0", PROBE],
        {},
        2,
        "port 0 (a free port) serves one node only",
    ),
    (
        ["--rdzv-backend", "static", *BASE, PROBE],
        {},
        2,
        "use --standalone for one node, or give --rdzv-endpoint the host:port of an etcd",
    ),
    (["--rdzv-backend", "zookeeper", *BASE, PROBE], {}, 2, "supports etcd-v3 (aliases: etcd, etcd-v2)"),
    (["--rdzv-endpoint", "localhost:http", "--rdzv-id", "j", PROBE], {}, 2, "port 'http' is not a number"),
    (["--rdzv-endpoint", "ftp://h:1", "--rdzv-id", "j", PROBE], {}, 2, "scheme 'ftp' is not supported"),
    ([*BASE, PROBE], {}, 200, "cannot reach etcd at 127.0.0.1:1 (connection refused)"),
    ([*BASE, "no/such/train.py"], {}, 2, "training script 'no/such/train.py' does not exist"),
    ([*BASE[:4], "--rdzv-conf", "join_timeout", PROBE], {}, 2, "'join_timeout' is not key=value"),
    ([*BASE[:4], "--rdzv-conf", "join_timeout=5,read_timeout=x", PROBE], {}, 2, "read_timeout='x': expected a number"),
    ([*BASE[:4], "--rdzv-conf", "join_timeout=soon", PROBE], {}, 2, "join_timeout='soon': expected a number"),
    ([*BASE[:4], "--rdzv-conf", "lease_ttl=1", PROBE], {}, 2, "lease_ttl must be whole seconds from 2"),
    (["--max-restarts", "-1", *BASE, PROBE], {}, 2, "'--max-restarts' / '--max_restarts': -1 is not an integer >= 0"),
    (["--master-port", "70000", *BASE, PROBE], {}, 2, "70000 is not an integer from 0 to 65535"),
    (["--checkpoint-every", "x", *BASE, PROBE], {}, 2, "'x' is not a valid integer"),
    (["--monitor-interval", "0", *BASE, PROBE], {}, 2, "--monitor-interval"),
    (["--nnodes", "2", "--rdzv-id", "j", PROBE], {}, 2, "--rdzv-endpoint is required"),
    (["--rdzv-endpoint", ETCD, PROBE], {}, 2, "--rdzv-id is required"),
    (["--rdzv-endpoint", ETCD, "--rdzv-id", "a/../b", PROBE], {}, 2, "run id"),
    (["--rdzv-endpoint", ETCD, "--rdzv-id", "..", PROBE], {}, 2, "would name a directory outside the job's own"),
    (["--rdzv-endpoint", ETCD, "--rdzv-id", ".", PROBE], {}, 2, "would name a directory outside the job's own"),
    (["--rdzv-endpoint", ETCD, "--rdzv-id", "a\\b", PROBE], {}, 2, "may not contain"),
    (["--rdzv-endpoint", ETCD, "--rdzv-id", "a\x01b", PROBE], {}, 2, "may not contain"),
    (["--rdzv-endpoint", ETCD, "--rdzv-id", "a b", PROBE], {}, 2, "may not contain"),
    (["--redirects", "7", *BASE, PROBE], {}, 2, "--redirects must be 0, 1, 2 or 3"),
    (["--local-ranks-filter", "a,b", *BASE, PROBE], {}, 2, "--local-ranks-filter takes local ranks"),
    (["--nprocs", "2", *BASE, PROBE], {}, 2, "No such option '--nprocs'"),
    ([*BASE], {}, 2, "Missing argument 'SCRIPT'"),
    (["-m", "--no-python", *BASE, "pkg"], {}, 2, "cannot be used together"),
    (["--no-python", *BASE, "no-such-program-xyz"], {}, 2, "is not an executable file or a command on PATH"),
    (["--log-dir", PROBE, *BASE, PROBE], {}, 2, "--log-dir"),
    ([*BASE, PROBE], {"PET_NNODES": "x:y"}, 2, "--nnodes must be N or MIN:MAX"),
    (["--standalone", "--rdzv-conf", "read_timeout=-3", PROBE], {}, 2, "read_timeout must be a positive number"),
    # torchrun 2.13's options and argparse's abbreviations
    (["--n", "2", *BASE, PROBE], {}, 2, "ambiguous option: --n could match --nnodes, --no-python"),
    (["--rdzv", "x", *BASE, PROBE], {}, 2, "ambiguous option: --rdzv could match --rdzv-backend"),
    (["--signals-to-handle", "SIGKILL", *BASE, PROBE], {}, 2, "'SIGKILL' is not a signal that can be handled"),
    (
        ["--numa-binding", "rack", *BASE, PROBE],
        {},
        2,
        "'rack' is not one of 'node', 'socket', 'exclusive', 'core-complex'",
    ),
    (
        ["--logs-specs", "fancy", *BASE, PROBE],
        {},
        2,
        "--logs-specs 'fancy': no such entry point in group torchrun.logs_specs",
    ),
    (["--event-log-handler", "kafka", *BASE, PROBE], {}, 2, "'kafka' is not one of 'null', 'console'"),
    (["--shutdown-timeout", "-1", *BASE, PROBE], {}, 2, "--shutdown-timeout"),
    ([*BASE, PROBE], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "soon"}, 2, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT must be a number"),
    (
        ["--virtual-local-rank", "--nproc-per-node", "3", *BASE, PROBE],
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        2,
        "CUDA_VISIBLE_DEVICES=0,1 names fewer devices than --nproc-per-node 3",
    ),
]


@pytest.mark.parametrize("args,env,code,words", CASES, ids=[c[3][:40] for c in CASES])
def test_bad_input_gives_one_clear_line(args, env, code, words):
    result = run(args, timeout=30, env=env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("elastic-run: ")
    assert words in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_the_same_command_run_again_after_the_job_finished_runs_a_new_run(etcd_endpoints, tmp_path):
    """As torchrun's c10d allows: the second launch of a finished job's line begins a new run of its
    id; the first run's history stays readable beside it, and the report is the newest run's."""
    rid = run_id()
    args = ["--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rid, "--local-addr", "127.0.0.1", PROBE, str(tmp_path)]
    assert run(args).returncode == 0
    again = run(args)
    assert again.returncode == 0, again.stderr
    shown = run(["history", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rid, "--json"], tool_name="elastic-ctl")
    records = json.loads(shown.stdout)
    kinds = [record["kind"] for record in records]
    assert kinds.count("job_closed") == 2 and kinds.count("job_rerun") == 1, kinds
    assert kinds.index("job_closed") < kinds.index("job_rerun") < len(kinds) - 1 - kinds[::-1].index("job_closed")
    report = run(["report", rid, "--rdzv-endpoint", etcd_endpoints, "--json", "--no-html"], tool_name="elastic-ctl")
    assert report.returncode == 0, report.stderr
    first_closed = next(r["time"] for r in records if r["kind"] == "job_closed")
    assert json.loads(report.stdout)["start"] > first_closed, report.stdout  # the newest run's account


@pytest.mark.parametrize("prefix", ["", "/other-tenant"])
def test_a_job_an_operator_closed_is_refused_with_a_reset_that_runs_as_pasted(etcd_endpoints, tmp_path, prefix):
    """A job closed by an operator stays closed for a new launch (one line, exit 4) until the reset
    the line suggests, pasted as printed; then the same command runs."""
    rid = run_id()
    conf = ["--rdzv-conf", f"key_prefix={prefix}"] if prefix else []
    base = ["--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rid, *conf]
    args = [*base, "--local-addr", "127.0.0.1", PROBE, str(tmp_path)]
    waiting = start([*base, "--nnodes", "2", "--local-addr", "127.0.0.1", PROBE, str(tmp_path)])
    try:
        wait_joined(etcd_endpoints, rid, 1, prefix=prefix)
        closed = run(["close", *base, "--reason", "stopped for maintenance"], tool_name="elastic-ctl")
        assert closed.returncode == 0, closed.stderr
        assert finish(waiting, 60)[0] == 4
    finally:
        if waiting.poll() is None:
            waiting.kill()
    refused = run(args)
    lines = [line for line in refused.stderr.splitlines() if line.strip() and not _about_etcds_version(line)]
    assert refused.returncode == 4 and len(lines) == 1, refused.stderr
    assert "starts no new run of it: an operator closed it" in lines[0], lines[0]
    listing = re.search(r"expire by themselves: `(elastic-ctl list [^`]*)`", refused.stderr).group(1)
    argv = shlex.split(listing)
    listed = subprocess.run([tool(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and f"{rid} " in listed.stdout, (listed.stdout, listed.stderr)  # its prefix too
    command = re.search(r"after `(elastic-ctl reset [^`]*)`", refused.stderr).group(1)
    print(f"\nsuggested: {command}\n       and {listing}")
    argv = shlex.split(command)
    pasted = subprocess.run([tool(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60)
    assert pasted.returncode == 0, pasted.stderr
    assert run(args).returncode == 0


def test_elastic_ctl_bad_endpoint_is_one_line():
    result = run(["status", "--rdzv-endpoint", "h:99999", "--rdzv-id", "x"], tool_name="elastic-ctl")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "port '99999'" in result.stderr


@pytest.mark.parametrize(
    "args,code,words",
    [
        (["report", "no-such-job"], 1, "elastic-ctl: no job 'no-such-job' at "),
        (["report"], 2, "name the job: elastic-ctl report RDZV_ID"),
        (["report", "bad id"], 2, "run id 'bad id' may not contain"),
    ],
)
def test_elastic_ctl_report_refuses_in_one_line(etcd_endpoints, args, code, words):
    result = run([*args, "--rdzv-endpoint", etcd_endpoints], tool_name="elastic-ctl")
    assert result.returncode == code and result.stderr.count("\n") == 1 and words in result.stderr, result.stderr


def test_elastic_ctl_report_with_nowhere_to_write_its_page_says_so_in_one_line(etcd_endpoints):
    rdzv_id = run_id()
    job = ["--nnodes", "1", "--rdzv-endpoint", etcd_endpoints, "--rdzv-id", rdzv_id, "--local-addr", "127.0.0.1"]
    assert run([*job, "--no-python", "true"]).returncode == 0
    args = ["report", rdzv_id, "--rdzv-endpoint", etcd_endpoints, "--html", "/nonexistent-dir/page.html"]
    result = run(args, tool_name="elastic-ctl")
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "--html '/nonexistent-dir/page.html' cannot be written" in result.stderr
    assert result.stdout.startswith(f"job {rdzv_id}: ")  # the table came first


def _about_etcds_version(line: str) -> bool:
    """The line an agent says once about the test etcd's release (3.5.1: rendezvous/etcd/version.py)."""
    return "etcd's maintainers advise against" in line
