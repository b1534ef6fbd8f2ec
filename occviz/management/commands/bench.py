"""bench: how fast the engine commits, against pgbench, and what streaming to viewers costs it.

engine: pgbench runs the engine's own read + compare-and-swap transaction (the SQL of
`compare_and_swap`) on one hot row with N clients; then `runjob` runs the `occ`
counter race with N writers on the same PostgreSQL; then the floor (`occviz.bench.floor`):
N bare Python writers running the same two statements and recording nothing, over as many
processes as the job. Rounds alternate, so a noisy machine slows every side alike; the
figures that matter are the ratios. The floor's ratio is what a Python client reaches on this
machine at all; the job's distance below it is what the job does besides the two statements.

streaming: one job watched by 50 websocket clients of the JSON stream against the same
job unwatched (`occviz.bench.streaming.streaming_bench`), and the event-to-client latency.

browser: the same with 60 clients that open the socket the job page opens (every frame
with the page's fragments).

failover: 20 leader elections (classroom timings) that kill their leader, and how long
each took to elect another, against its bound (`--failover-runs`).

watches: the API's and the home page's GET times with no watch open and with `--watches`
API watches open (`occviz.bench.watches.watches_bench`), and the web server's database
connections while they are open and after they dropped.

class: a class arriving (`occviz.bench.classroom.class_arrival_bench`): 300 job pages open at
once on one live job, 200 of them drop and reopen from seq 0 (`--class-sockets`,
`--class-reopen`); hello times, the staying pages' latency, and the web server's memory
(`--class-web-processes`: served by several Daphne processes on one listening socket).

students: a class on a student link (`occviz.bench.students.students_bench`): 60 student
pages' sockets on one live `none` job, 30 of them pressing +1 once a second (`--students`,
`--students-pressing`, `--students-seconds`), against the same job alone; the students' latency,
whether each saw every event once, and whether the job counted every press. Each round also runs
the class's floor: the same sockets, with as many presses a second made by pgbench.

`--part` picks the parts (`--part streaming browser`); all seven run by default.

How to read the figures, and what they have been: docs/performance.md.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from occviz.bench.floor import FloorFailed, floor_commits_per_s
from occviz.management.schema import apply_migrations
from occviz.pgbench import PgbenchUnavailable, run_pgbench
from occviz.store.models import Counter

MANAGE = str(Path(settings.BASE_DIR) / "manage.py")
PARTS = ["engine", "streaming", "browser", "failover", "watches", "class", "students"]


class Command(BaseCommand):
    help = (
        "Benchmark: committed compare-and-swaps per second, runjob (occ) against pgbench on one hot row; "
        "what watching a job costs it, on the JSON stream and on the job page's socket."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--writers", type=int, default=4)
        parser.add_argument("--seconds", type=float, default=3.0)
        parser.add_argument("--rounds", type=int, default=7)
        parser.add_argument("--viewers", type=int, default=50, help="streaming: JSON stream clients on one job")
        parser.add_argument("--pages", type=int, default=60, help="browser: job pages' sockets on one job")
        parser.add_argument(
            "--failover-runs", type=int, default=20, help="failover: leader-election jobs that kill their leader"
        )
        parser.add_argument("--watches", type=int, default=200, help="watches: API watches open at once")
        parser.add_argument("--class-sockets", type=int, default=300, help="class: job pages opened at once")
        parser.add_argument(
            "--class-reopen", type=int, default=200, help="class: pages that drop and reopen from seq 0"
        )
        parser.add_argument("--class-seconds", type=float, default=20.0, help="class: how long the watched job runs")
        parser.add_argument(
            "--class-web-processes", type=int, default=1, help="class: web server processes on the one listening socket"
        )
        parser.add_argument("--students", type=int, default=60, help="students: student pages' sockets on one job")
        parser.add_argument(
            "--students-pressing", type=int, default=30, help="students: of them, pressing +1 once a second"
        )
        parser.add_argument(
            "--students-seconds", type=float, default=10.0, help="students: how long the watched job runs"
        )
        parser.add_argument(
            "--students-press-via",
            choices=["socket", "http"],
            default="socket",
            help="students: press over each student's open socket (as the page does), or a POST each",
        )
        parser.add_argument(
            "--part", nargs="+", choices=["all", *PARTS], default=["all"], help="the parts to run (default: all)"
        )
        parser.add_argument(
            "--processes",
            type=int,
            default=None,
            help="engine: run the job over this many processes (at most one per writer), and pgbench with as "
            "many threads (-j); default: one process, pgbench with a thread per core",
        )
        parser.add_argument("--json", action="store_true", help="print the figures as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        writers, seconds, rounds = options["writers"], options["seconds"], options["rounds"]
        viewers = {"streaming": options["viewers"], "browser": options["pages"]}
        if not (
            1 <= writers <= 64
            and 1 <= seconds <= 120
            and 1 <= rounds <= 10
            and all(1 <= n <= 500 for n in viewers.values())
            and 1 <= options["failover_runs"] <= 200
            and 1 <= options["watches"] <= 500
            and 1 <= options["class_sockets"] <= 1000
            and 0 <= options["class_reopen"] <= options["class_sockets"]
            and 4 <= options["class_seconds"] <= 120
            and 1 <= options["class_web_processes"] <= 8
            and 1 <= options["students"] <= 200
            and 0 <= options["students_pressing"] <= options["students"]
            and 2 <= options["students_seconds"] <= 120
            and (options["processes"] is None or 1 <= options["processes"] <= 16)
        ):
            raise CommandError(
                "--writers 1..64, --seconds 1..120, --rounds 1..10, --viewers and --pages 1..500, "
                "--failover-runs 1..200, --watches 1..500, --class-sockets 1..1000, "
                "--class-reopen 0..--class-sockets, --class-seconds 4..120, --class-web-processes 1..8, "
                "--students 1..200, --students-pressing 0..--students, --students-seconds 2..120, --processes 1..16",
                returncode=2,
            )
        parts = PARTS if "all" in options["part"] else [part for part in PARTS if part in options["part"]]
        # Measure what `make run` serves: every migration applied (the live layer's tables included).
        apply_migrations()
        figures: dict[str, Any] = {}
        if "engine" in parts:
            figures["engine"] = self._engine(writers, seconds, rounds, options["processes"])
        from occviz.bench.streaming import JOB_PAGE_QUERY, streaming_bench

        queries = {"streaming": "", "browser": JOB_PAGE_QUERY}
        for part in [part for part in parts if part in queries]:
            figures[part] = streaming_bench(
                None, seconds=seconds, writers=writers, viewers=viewers[part], rounds=rounds, query=queries[part]
            )
        if "failover" in parts:
            from occviz.bench.failover import measure_failovers

            figures["failover"] = measure_failovers(options["failover_runs"], progress=self.stderr.write)
        if "watches" in parts:
            from occviz.bench.watches import watches_bench

            figures["watches"] = watches_bench(None, watches=options["watches"], rounds=rounds)
        if "class" in parts:
            from occviz.bench.classroom import class_arrival_bench

            figures["class"] = class_arrival_bench(
                None,
                sockets=options["class_sockets"],
                reopen=options["class_reopen"],
                seconds=options["class_seconds"],
                writers=writers,
                web_processes=options["class_web_processes"],
            )
        if "students" in parts:
            from occviz.bench.students import students_bench

            figures["students"] = students_bench(
                None,
                students=options["students"],
                pressing=options["students_pressing"],
                seconds=options["students_seconds"],
                writers=writers,
                rounds=rounds,
                press_via=options["students_press_via"],
            )
        if options["json"]:
            self.stdout.write(json.dumps(figures))
            return
        if "engine" in figures:
            engine = figures["engine"]
            over = f", the job over {engine['processes']} processes" if engine["processes"] else ""
            self.stdout.write(
                f"\nEngine: one hot row, {writers} concurrent writers{over}, {seconds:g} s a run, {rounds} rounds\n"
                f"  pgbench (same read + compare-and-swap): {_list(engine['pgbench_commits_per_s'])} commits/s\n"
                f"  runjob counter --strategy occ:           {_list(engine['runjob_occ_commits_per_s'])} commits/s\n"
                f"  bare writers (the floor, nothing recorded): {_list(engine['floor_commits_per_s'])} commits/s\n"
                f"  ratio runjob / pgbench: {_list(engine['ratio_per_round'], '.2f')} "
                f"(median {engine['ratio_median']:.2f}; target >= 0.80)\n"
                f"  ratio floor / pgbench:  {_list(engine['floor_ratio_per_round'], '.2f')} "
                f"(median {engine['floor_ratio_median']:.2f})"
            )
        if "streaming" in figures:
            self._streaming("Streaming", "websocket clients of the JSON stream", figures["streaming"], 0.9, 250)
        if "browser" in figures:
            self._streaming("Browser-like", "job pages' sockets", figures["browser"], 0.95, 120)
        if "class" in figures:
            self._class(figures["class"])
        if "students" in figures:
            self._students(figures["students"])
        if "failover" in figures:
            failover = figures["failover"]
            timings = failover["timings"]
            self.stdout.write(
                f"\nFailover after a kill: {failover['runs']} leader elections, {timings['replicas']} replicas, "
                f"lease {timings['lease_duration']:g} s / renew deadline {timings['renew_deadline']:g} s / "
                f"retry {timings['retry_period']:g} s\n"
                f"  new leader after: min {failover['min_s']} s, median {failover['median_s']} s, "
                f"max {failover['max_s']} s\n"
                f"  within the bound of {failover['bound_s']:g} s: {failover['within_bound']} of "
                f"{len(failover['failovers_s'])}; within LeaseDuration + 2.2 x RetryPeriod "
                f"({failover['lease_plus_jittered_retry_s']:g} s): {failover['within_lease_plus_jittered_retry']}; "
                f"invariant broken in {failover['invariant_broken']} run(s)"
            )

        if "watches" in figures:
            self._watches(figures["watches"])

    def _watches(self, figures: dict[str, Any]) -> None:
        def spread(name: str) -> str:
            return f"median {figures[name]['median']:g} (range {figures[name]['min']:g}-{figures[name]['max']:g})"

        self.stdout.write(
            f"\nWatches: GETs with none open and with {figures['watches']} API watches open, "
            f"{figures['rounds']} rounds of {figures['samples']} GETs each (medians of the rounds' medians, ms)\n"
            f"  API list:  {spread('api_quiet_ms')} alone, {spread('api_watched_ms')} watched (target < 100 ms)\n"
            f"  home page: {spread('home_quiet_ms')} alone, {spread('home_watched_ms')} watched (target < 100 ms)\n"
            f"  web server's connections: {spread('connections_watched')} with the watches open, "
            f"{spread('connections_after')} after they dropped (max_connections {figures['max_connections']})"
        )

    def _class(self, figures: dict[str, Any]) -> None:
        hello, latency, memory = figures["hello_ms"], figures["latency_ms"], figures["memory_mb"]
        self.stdout.write(
            f"\nA class arriving: {figures['sockets']} job pages open at once on one live job "
            f"({figures['seconds']:g} s, {figures['events']} events, {figures['web_processes']} web process(es)); "
            f"{figures['reopen']} drop and reopen from seq 0\n"
            f"  hello: median {hello['median']} ms, p95 {hello['p95']} ms, max {hello['max']} ms "
            f"(reopened: max {hello['reopened_max']} ms); within {hello['target']:g} ms: {hello['within_target']}; "
            f"refused: {figures['refused_count']}\n"
            f"  event-to-client latency of the pages that stayed: p50 {latency['p50']} ms, p95 {latency['p95']} ms "
            f"(target p95 < {latency['target_p95']:g} ms; {latency['live']} live events counted, "
            f"{latency['history']} recorded before their page's hello left out); {figures['complete']}\n"
            f"  web server memory: {memory['start_mb']} MB at the start, {memory['peak_mb']} MB at the peak, "
            f"{memory['end_mb']} MB after the class left ({memory['returned_within']:+} MB; "
            f"target within {figures['memory_target_mb']:g} MB)"
        )

    def _students(self, figures: dict[str, Any]) -> None:
        latency = figures["latency_ms"]
        self.stdout.write(
            f"\nA class on a student link: {figures['students']} student pages' sockets on one live job "
            f"({figures['strategy']}, {figures['seconds']:g} s, {figures['writers']} writers), "
            f"{figures['pressing']} of them pressing +1 once a second (over {figures['press_via']}); "
            f"{figures['rounds']} alternating rounds\n"
            f"  alone:   {_list(figures['commits_per_s_alone_runs'])} commits/s\n"
            f"  watched: {_list(figures['commits_per_s_watched_runs'])} commits/s\n"
            f"  ratio watched / alone: {figures['ratio']:.2f} (target >= {figures['ratio_target']:.2f}); "
            f"{figures['complete']}\n"
            + (
                f"  floor, the same sockets and {figures['pressing']} presses a second by pgbench, the cheapest "
                f"press ({_list(figures['floor_presses_runs'])} made): "
                f"{_list(figures['floor_commits_per_s_runs'])} commits/s; "
                f"ratio floor / alone {figures['floor_ratio']:.2f}\n"
                if figures["floor_ratio"] is not None
                else ""
            )
            + f"  event-to-student latency: p50 {latency['p50']} ms, p95 {latency['p95']} ms "
            f"(target p95 <= {latency['target_p95']:g} ms)\n"
            f"  presses, each round: {'; '.join(figures['presses_counted'])}; refused: {figures['refused_count']} "
            f"{figures['refused']}; "
            f"busy (503, the job settling): {figures['busy']}"
        )

    def _streaming(self, title: str, clients: str, figures: dict[str, Any], ratio: float, p95_ms: float) -> None:
        self.stdout.write(
            f"\n{title}: the same occ job, alone and watched by {figures['viewers']} {clients} "
            f"(/ws/jobs/<id>/events/{figures['query']})\n"
            f"  alone:   {_list(figures['commits_per_s_alone_runs'])} commits/s\n"
            f"  watched: {_list(figures['commits_per_s_watched_runs'])} commits/s\n"
            f"  ratio watched / alone: {figures['ratio']:.2f} (target >= {ratio:.2f}); "
            f"{figures['viewers_complete']}; {figures['decoded_complete']}\n"
            f"  event-to-client latency: p50 {figures['latency_ms']['p50']} ms, "
            f"p95 {figures['latency_ms']['p95']} ms (target p95 <= {p95_ms:g} ms)\n"
            f"  web server CPU while watched: {figures['web_cpu_ms_per_1000_events']} ms per 1,000 events "
            f"(runs {_list(figures['web_cpu_ms_per_1000_events_runs'], '.1f')})"
        )

    def _engine(self, writers: int, seconds: float, rounds: int, processes: int | None = None) -> dict[str, Any]:
        """`processes`: the job over that many (no more than its writers), pgbench with as many threads."""
        counter, _ = Counter.objects.get_or_create(namespace="bench", name="pgbench-hot")
        pgbench_rates: list[float] = []
        engine_rates: list[float] = []
        floor_rates: list[float] = []
        if processes is not None:
            processes = min(processes, writers)
        for round_number in range(1, rounds + 1):
            pgbench_rates.append(self._pgbench(counter.pk, writers, seconds, processes))
            engine_rates.append(self._runjob(writers, seconds, processes))
            try:
                floor_rates.append(floor_commits_per_s(counter.pk, writers, seconds, processes or 1))
            except FloorFailed as error:
                raise CommandError(str(error)) from None
            self.stderr.write(
                f"round {round_number}: pgbench {pgbench_rates[-1]:.0f}/s, runjob occ {engine_rates[-1]:.0f}/s, "
                f"floor {floor_rates[-1]:.0f}/s"
            )
        ratios = [engine / reference for engine, reference in zip(engine_rates, pgbench_rates, strict=True)]
        floor_ratios = [floor / reference for floor, reference in zip(floor_rates, pgbench_rates, strict=True)]
        return {
            "writers": writers,
            "processes": processes,
            "seconds": seconds,
            "pgbench_commits_per_s": [round(rate, 1) for rate in pgbench_rates],
            "runjob_occ_commits_per_s": [round(rate, 1) for rate in engine_rates],
            "ratio_per_round": [round(ratio, 3) for ratio in ratios],
            "ratio_median": round(statistics.median(ratios), 3),
            "floor_commits_per_s": [round(rate, 1) for rate in floor_rates],
            "floor_ratio_per_round": [round(ratio, 3) for ratio in floor_ratios],
            "floor_ratio_median": round(statistics.median(floor_ratios), 3),
            "target": 0.8,
        }

    def _pgbench(self, row_id: int, clients: int, seconds: float, threads: int | None = None) -> float:
        try:
            return run_pgbench(row_id, clients, round(seconds), threads=threads).commits_per_s
        except PgbenchUnavailable as error:
            raise CommandError(str(error)) from None

    def _runjob(self, writers: int, seconds: float, processes: int | None = None) -> float:
        result = subprocess.run(
            [
                *(sys.executable, MANAGE, "runjob", "counter", "--strategy", "occ", "--writers", str(writers)),
                *("--seconds", str(seconds), "--retry", "immediate", "--max-attempts", "1000", "--json"),
                *(("--processes", str(processes)) if processes else ()),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise CommandError(f"runjob failed:\n{result.stderr}")
        return float(json.loads(result.stdout)["commits_per_s"])


def _list(values: list[float], spec: str = ".0f") -> str:
    return ", ".join(format(value, spec) for value in values)
