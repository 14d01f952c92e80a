"""The capacity app's services, the half that reads and writes rows: profile jobs and runs (profile_jobs),
profile rows and their live refinement (profiles), plans against the fleet and their apply (plans), schedules and
predictive settings (schedules), and the bounds the autoscaler works within (bounds). Each imports what it needs
from its sibling modules by name; this package re-exports nothing."""
