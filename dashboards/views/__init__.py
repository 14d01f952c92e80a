"""The operator pages. Thin: read through selectors (controlplane.selectors, dashboards.fleet/panels), write
through the same services as the REST API, show a ControlPlaneError as a message on the page."""
