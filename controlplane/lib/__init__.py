"""Infrastructure helpers that belong to no app and own no table (as healthchecks' `hc/lib`): reading settings from
the environment, the fleet's HTTP session, one pass at a time, the debug page's credential filter, the filesystem
broker transport."""
