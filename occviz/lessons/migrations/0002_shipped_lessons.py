"""The lessons occviz ships: one per scenario, and the whole story of optimistic concurrency in
Kubernetes in one 50-minute lesson (lost update, resourceVersion, locks, serializable, leader
election and its failures, quota admission and its leak, controllers A and B).

Each step names a scenario's preset, so a lesson follows the preset as it is tuned. The texts are
written to be said aloud: what to say, the question to ask the class before running the step,
and what to point at once it has run. Running this again puts the shipped lessons back as written.
"""

from django.db import migrations

# (scenario, preset) -> title, what to say, the question, what to point at.
STEPS = {
    ("counter", "lost-update-demo"): (
        "The lost update",
        "Eight writers share one counter. Each reads it, adds one, and writes the value back, with no version "
        "check. In Kubernetes that is a PUT with an empty resourceVersion: an unconditional update, the last "
        "writer wins.",
        "Every writer's increment was acknowledged. Will the counter have gained as much as the commits say?",
        "The lost updates figure, in red: each is a write that stored a value read before another writer's "
        "write, and silently erased it. Nothing failed and nothing warned; the commits and the counter disagree.",
    ),
    ("counter", "k8s-default-retry"): (
        "Compare-and-swap that gives up",
        "Now each write carries the version it read, as an update carries metadata.resourceVersion: "
        "UPDATE ... WHERE version = the one I read. Zero rows means someone got there first. The writers retry "
        "with client-go's DefaultRetry: five attempts, 10 ms apart.",
        "Will any update be lost now? And will every writer manage to write?",
        "No lost updates: every conflict is a 409 Conflict, 'the object has been modified; please apply your "
        "changes to the latest version and try again'. But count the gave-up marks: five quick tries are not "
        "enough on a hot object.",
    ),
    ("counter", "k8s-default-backoff"): (
        "Optimistic concurrency with resourceVersion",
        "Each write carries the version it read, as a Kubernetes update carries metadata.resourceVersion; the API "
        "server compares it with etcd's and refuses a stale one with 409 Conflict. The loser re-reads and "
        "retries, as retry.RetryOnConflict does, with client-go's DefaultBackoff: 10, 50, 250 ms.",
        "Eight writers on one row: how many conflicts for each commit, and will any update be lost?",
        "The conflicts and retries figures, and the crosses on the timeline: the price of optimism, paid in "
        "retries. Lost updates: zero. The final value is exactly the initial value plus the commits.",
    ),
    ("counter", "pessimistic-lock-queue"): (
        "Locks: SELECT ... FOR UPDATE",
        "The pessimistic way: lock the row, read, write, commit. Nobody can conflict because everyone else waits "
        "in line. Kubernetes does not lock objects: its clients are remote, and a lock held across the network "
        "would stall every other client.",
        "No conflicts at all now. Is that faster or slower than the retries we just saw?",
        "Zero conflicts, but the lock waits and the time spent waiting: the bars on the timeline are writers "
        "queued behind the lock. Compare commits per second and latency with the optimistic run.",
    ),
    ("counter", "serializable-retries"): (
        "Serializable transactions",
        "Same read-modify-write, in SERIALIZABLE transactions, with no version column in sight. PostgreSQL "
        "watches what each transaction read, and aborts one of two that would contradict each other with SQLSTATE "
        "40001, could not serialize access. The client retries, as a Kubernetes client retries a 409.",
        "Who detects the conflict now, the writer or the database? Will updates be lost?",
        "The serialization failures figure: the database did the compare-and-swap for us, and refused the losers. "
        "No lost updates. The cost is the same as optimistic concurrency: retries.",
    ),
    ("counter", "atomic-increment"): (
        "No read-modify-write at all",
        "The right tool for a counter: one statement, UPDATE counter SET value = value + 1. No read, so nothing "
        "stale to write back. In Kubernetes the nearest thing is a patch that names only the field it changes.",
        "With nothing to conflict on, what do you expect to see on the timeline?",
        "No conflicts, no retries, no lost updates, and the highest commits per second: the row lock is held only "
        "for the one statement.",
    ),
    ("leader-election", "classroom"): (
        "Leader election on a Lease",
        "Three replicas want to be the one that works, as kube-controller-manager's replicas do. They compete for "
        "one Lease: holderIdentity, leaseDurationSeconds, acquireTime, renewTime, leaseTransitions. Taking or "
        "renewing it is a compare-and-swap on its resourceVersion, so only one write wins.",
        "Three replicas try to take the Lease at the same moment: how many will believe they lead?",
        "The Lease: one holder, renewTime moving every retry period. The others' attempts fail or back off: they "
        "saw a valid lease. 'Believe they lead' stays at one.",
    ),
    ("leader-election", "kill-the-leader"): (
        "A killed leader",
        "At 4 s the leader is killed without releasing the Lease, like a crashed pod. Nobody tells the others. Each "
        "follower waits until the Lease has not changed for a whole lease duration, by its own clock.",
        "How long until someone else leads: at once, after the lease duration, or never?",
        "The gap on the timeline: no renewals for a lease duration, then a follower acquires and leaseTransitions "
        "goes up by one. Failover takes the lease duration and a retry period or two: with client-go's defaults, "
        "15 s and more.",
    ),
    ("leader-election", "graceful-handover"): (
        "A graceful handover",
        "This time the leader is stopped gracefully and, with ReleaseOnCancel, writes the Lease with an empty "
        "holder before it goes. The followers do not have to wait out the lease.",
        "How much faster than the killed leader will the failover be?",
        "The release on the timeline, then a follower acquiring within a retry period: that is why a rolling "
        "update of a controller should let its old pod release the lease.",
    ),
    ("leader-election", "stale-leader"): (
        "A paused leader, fenced",
        "At 4 s the leader freezes for 6 s, longer than its 3 s lease: a garbage-collection pause, a suspended "
        "VM. The others take over. When it wakes, it still believes it leads and tries to write.",
        "When the old leader wakes up, whose write should win, and how can the system tell?",
        "The fenced write: the stale leader's write carried an old leaseTransitions, the fencing token, and was "
        "refused. client-go's leader election does not fence for you: guard what a leader writes, with the "
        "resourceVersion it read or a token like this one.",
    ),
    ("leader-election", "network-cut"): (
        "A leader cut off",
        "At 4 s the leader loses the database for 5 s. It cannot renew, and it steps down once its renew "
        "deadline has passed: before the lease expires, so before anyone else may take it.",
        "For a moment nobody leads. Is that worse, or better, than two leaders?",
        "The step-down after the renew deadline, then the gap, then the new holder. LeaseDuration > RenewDeadline "
        "is what makes the old leader stop before a new one starts.",
    ),
    ("leader-election", "clock-skew"): (
        "Clocks that lie",
        "Two replicas' clocks are wrong, 30 s ahead and 20 s behind. The leader is killed at 5 s. If a follower "
        "trusted the renewTime written by another machine's clock, it could take a lease that is still valid.",
        "Will the replica whose clock is 30 s fast take over too early?",
        "Still one leader at a time: each replica times the lease from when it last saw the Lease change, by its "
        "own clock, never from the holder's renewTime.",
    ),
    ("quota", "two-pods-one-gpu"): (
        "Two pods for one GPU",
        "A namespace's ResourceQuota allows requests.nvidia.com/gpu: 1, and two pods asking for one GPU are "
        "created at once. Admission checks hard minus used, then writes the new used with a compare-and-swap "
        "on the quota's resourceVersion.",
        "Both pods saw one GPU free. How many get it?",
        "Exactly one admitted. The other's write conflicted; it re-read the quota, found it full, and was denied "
        "with a 403: exceeded quota, requested 1, used 1, limited 1.",
    ),
    ("quota", "hundred-pods-ten-slots"): (
        "A hundred pods for ten GPUs",
        "A hundred pods race for ten GPUs through eight admission workers, all charging the same quota object.",
        "How many pods will run, and how many conflicts will it take to get there?",
        "Exactly ten admitted, never more, and many conflicts and retries on the way: one hot object, many "
        "writers, and compare-and-swap keeps the count exact.",
    ),
    ("quota", "leak-and-repair"): (
        "The quota leak and its resync",
        "Admission charges the quota before the pod is stored. Here a fifth of the creates then fail, so the "
        "charge stays and the pod never exists. Kubernetes repairs it in the quota controller, which recounts "
        "everything every --resource-quota-sync-period: 5 minutes by default, 2 s here.",
        "After a failed create, what does the quota say is used, and who will notice it is wrong?",
        "Used, charged, above actually used: the leaked figure in red. Then the resync: the controller recounts "
        "and used drops back to what exists. Until then, pods are denied for GPUs nobody holds.",
    ),
    ("controllers", "two-none"): (
        "Controllers A and B, without versions",
        "Two controllers watch the same object and each reconciles its own field. Each GETs the whole object, "
        "sets its field, and PUTs the whole object back, without its resourceVersion.",
        "A only touches field a, B only touches field b. Can A erase B's work?",
        "The fields erased figure: a PUT of the whole object writes back the other controller's field as it was "
        "when it was read, silently undoing a newer change.",
    ),
    ("controllers", "two-occ"): (
        "Controllers A and B, with resourceVersion",
        "The same two controllers, now sending the resourceVersion they read. Both read version N; the first "
        "write makes N+1; the second gets 409 Conflict, GETs again, and re-applies its change.",
        "Will any field be erased now? What does it cost?",
        "Conflicts and retries, and no field erased: every controller's last write survives. This is why "
        "controllers requeue on conflict. Server-side apply goes further: it records which manager owns which "
        "field.",
    ),
    ("controllers", "eight-occ"): (
        "Eight controllers on one object",
        "Eight controllers, each with its own field, all on one object.",
        "Four times the controllers of the last run: do the conflicts grow with them, or faster?",
        "Conflicts and retries climb faster than the writes, yet nothing is lost: one hot object is where "
        "optimistic concurrency pays the most retries.",
    ),
}

LESSONS = [
    {
        "slug": "optimistic-concurrency-in-kubernetes",
        "title": "Optimistic concurrency in Kubernetes: the whole story",
        "summary": "From a lost update to resourceVersion, locks and serializable transactions, then leader election "
        "and its failures, two pods racing for one GPU, the quota leak, and controllers A and B.",
        "minutes": 50,
        "steps": [
            ("counter", "lost-update-demo"),
            ("counter", "k8s-default-backoff"),
            ("counter", "pessimistic-lock-queue"),
            ("counter", "serializable-retries"),
            ("leader-election", "classroom"),
            ("leader-election", "kill-the-leader"),
            ("leader-election", "stale-leader"),
            ("quota", "two-pods-one-gpu"),
            ("quota", "leak-and-repair"),
            ("controllers", "two-none"),
            ("controllers", "two-occ"),
        ],
    },
    {
        "slug": "counter-race",
        "title": "The counter race: five ways to add one",
        "summary": "Blind writes lose updates; compare-and-swap, locks and serializable transactions do not, each at "
        "its own price; an atomic increment avoids the race.",
        "minutes": 20,
        "steps": [
            ("counter", "lost-update-demo"),
            ("counter", "k8s-default-retry"),
            ("counter", "k8s-default-backoff"),
            ("counter", "pessimistic-lock-queue"),
            ("counter", "serializable-retries"),
            ("counter", "atomic-increment"),
        ],
    },
    {
        "slug": "leader-election",
        "title": "Leader election on a Lease",
        "summary": "client-go's leader election: one leader at a time, failover after a crash or a release, a stale "
        "leader fenced, a cut-off leader stepping down, and clocks nobody trusts.",
        "minutes": 25,
        "steps": [
            ("leader-election", "classroom"),
            ("leader-election", "kill-the-leader"),
            ("leader-election", "graceful-handover"),
            ("leader-election", "stale-leader"),
            ("leader-election", "network-cut"),
            ("leader-election", "clock-skew"),
        ],
    },
    {
        "slug": "quota-race",
        "title": "ResourceQuota admission: racing for GPUs",
        "summary": "Pods racing for a quota: exactly as many admitted as it allows, and the usage a failed create "
        "leaks until the quota controller's resync.",
        "minutes": 12,
        "steps": [
            ("quota", "two-pods-one-gpu"),
            ("quota", "hundred-pods-ten-slots"),
            ("quota", "leak-and-repair"),
        ],
    },
    {
        "slug": "controllers-a-and-b",
        "title": "Controllers A and B on one object",
        "summary": "Two controllers, each owning a field of one object: without resourceVersion one erases the "
        "other's work; with it, a 409, a re-GET and nothing lost.",
        "minutes": 12,
        "steps": [
            ("controllers", "two-none"),
            ("controllers", "two-occ"),
            ("controllers", "eight-occ"),
        ],
    },
]


def ship_lessons(apps, schema_editor=None):
    Lesson = apps.get_model("lessons", "Lesson")
    Step = apps.get_model("lessons", "Step")
    for position, shipped in enumerate(LESSONS):
        lesson, _ = Lesson.objects.update_or_create(
            slug=shipped["slug"],
            defaults={
                "title": shipped["title"],
                "summary": shipped["summary"],
                "minutes": shipped["minutes"],
                "position": position,
            },
        )
        Step.objects.filter(lesson=lesson).delete()
        for order, (scenario, preset) in enumerate(shipped["steps"], start=1):
            title, say, ask, point_at = STEPS[scenario, preset]
            Step.objects.create(
                lesson=lesson,
                order=order * 10,
                title=title,
                scenario=scenario,
                preset=preset,
                params={},
                say=say,
                ask=ask,
                point_at=point_at,
            )


def remove_lessons(apps, schema_editor=None):
    apps.get_model("lessons", "Lesson").objects.filter(slug__in=[shipped["slug"] for shipped in LESSONS]).delete()


class Migration(migrations.Migration):
    dependencies = [("lessons", "0001_initial")]

    operations = [migrations.RunPython(ship_lessons, remove_lessons)]
