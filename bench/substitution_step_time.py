"""A job's step time as is and with each kernel substituted (ATTNCAP_SUBSTITUTE), nothing captured:
what substitution costs a job beyond its kernel's own time. Runs alternate (as is, then each kernel,
round after round) so that a drifting clock or a warming machine touches every way alike. The job
prints its own step time on its last line ("... step 8.52 ms ..." or "decode step 3.08 ms ...").

    python bench/substitution_step_time.py --attncap build/capture/libattncap.so \
        --kernels sage2-int8-fp8 fa3-fp8 --rounds 3 --json steps.json -- python bench/flux_block_job.py --save /tmp/o.pt
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

STEP = re.compile(r"step ([0-9.]+) ms")
ACCOUNT = re.compile(r"substitution by \S+: (\d+) attention calls substituted \(([^)]*)\), (\d+) left")


def run_once(job, attncap, kernel):
    env = dict(os.environ)
    for name in [n for n in env if n.startswith("ATTNCAP_")]:
        del env[name]
    if kernel:
        env.update(LD_PRELOAD=attncap, ATTNCAP_SUBSTITUTE=kernel)
    result = subprocess.run(job, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{kernel or 'as is'}: the job failed ({result.returncode}):\n{result.stderr[-3000:]}")
    steps = STEP.findall(result.stdout)
    if not steps:
        sys.exit(f"{kernel or 'as is'}: no 'step N ms' in the job's output:\n{result.stdout[-2000:]}")
    account = ACCOUNT.search(result.stderr)
    if kernel and not account:
        sys.exit(f"{kernel}: no substitution account at exit:\n{result.stderr[-3000:]}")
    return float(steps[-1]), account.groups() if account else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attncap", required=True, help="the preload (build/capture/libattncap.so)")
    parser.add_argument("--kernels", nargs="+", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("job", nargs=argparse.REMAINDER, help="-- then the job's command")
    args = parser.parse_args()
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not job:
        parser.error("no job: give its command after --")
    ways = [None, *args.kernels]
    steps = {way: [] for way in ways}
    accounts = {}
    for _ in range(args.rounds):
        for way in ways:
            step, account = run_once(job, args.attncap, way)
            steps[way].append(step)
            if account:
                accounts[way] = {"substituted": int(account[0]), "how": account[1], "left": int(account[2])}
    as_is = statistics.median(steps[None])
    print(f"{' '.join(job)}: step time (ms), median of {args.rounds} runs, alternating")
    print(f"{'way':<18} {'median':>8} {'min':>8} {'max':>8} {'x as is':>8}  substituted")
    rows = []
    for way in ways:
        median = statistics.median(steps[way])
        account = accounts.get(way)
        how = f"{account['substituted']} ({account['how']}), {account['left']} left" if account else "-"
        print(f"{way or 'as is':<18} {median:8.3f} {min(steps[way]):8.3f} {max(steps[way]):8.3f} "
              f"{median / as_is:8.2f}  {how}")
        rows.append({"kernel": way, "step_ms": steps[way], "median_ms": median, "ratio": median / as_is,
                     "substitution": account})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"job": job, "rounds": args.rounds, "ways": rows}, f, indent=1)


if __name__ == "__main__":
    main()
