"""`python manage.py tandem_profile DEPLOYMENT [--quick]`: profile the deployment's current revision on separate
workers that a node agent starts on a node of the profiled class, with a progress bar, and store the profiles (the same run the API queues as a Celery task)."""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = ("Measure how the current revision's prefill and decode stages grow with load, on separate workers "
            "started for it (never the serving ones), and store the profiles.")

    def add_arguments(self, parser):
        parser.add_argument("deployment")
        parser.add_argument("--quick", action="store_true", help="few, small load levels (tests, a first look)")
        parser.add_argument("--node-class", default=None,
                            help="node class to store the profile under (default: the pool's node selector "
                                 "'class', else 'default')")
        parser.add_argument("--allow-shared-host", action="store_true",
                            help="profile even though the only node the run can use holds this deployment's "
                                 "serving workers (they would compete for its CPU or GPU)")
        parser.add_argument("--export", default=None, metavar="PATH",
                            help="also write the stored profiles as JSON (the simulated worker's profile format)")

    def handle(self, *args, deployment: str, quick: bool = False, node_class=None, allow_shared_host=False,
               export=None, **options):
        from tqdm import tqdm

        from controlplane.capacity.export import profiles_export
        from controlplane.capacity.models import Profile, ProfileJobStatus
        from controlplane.capacity.services.profile_jobs import profile_job_create, profile_job_run
        from controlplane.errors import ControlPlaneError
        from controlplane.selectors import deployment_get

        try:
            target = deployment_get(deployment)
            job = profile_job_create(deployment=target, quick=quick, node_class=node_class, enqueue=False,
                                     allow_shared_host=allow_shared_host)
        except ControlPlaneError as exc:
            raise CommandError(exc.message) from None
        bar = tqdm(total=100, unit="%", desc=f"profile {target.name}", file=self.stderr._out,
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")

        def echo(fraction: float, step: str) -> None:
            bar.n = round(100 * fraction)
            bar.set_postfix_str(step)
            bar.refresh()

        try:
            job = profile_job_run(job.pk, echo=echo)
        finally:
            bar.close()
        if job.status != ProfileJobStatus.SUCCEEDED:
            raise CommandError(f"profile job #{job.pk} failed: {job.error}")
        profiles = list(Profile.objects.filter(pk__in=job.profiles).select_related("revision"))
        for profile in profiles:
            fits = ", ".join(f"{stage} a={f['a']:.4g} b={f['b']:.4g} c={f['c']:.4g}"
                             for stage, f in profile.fits.items() if stage in ("prefill", "decode"))
            self.stdout.write(f"{profile.role} profile #{profile.pk} (revision {profile.revision.number}, "
                              f"{profile.node_class}): {fits}; KV {profile.kv_bytes_per_token} B/token, "
                              f"max batch {profile.max_num_seqs}")
        if export:
            with open(export, "w") as out:
                json.dump(profiles_export(profiles), out, indent=2)
            self.stdout.write(f"wrote {export}")
