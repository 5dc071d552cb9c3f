"""The Dagster layer: assets per stage, checks, resources, schedules and sensors. Thin: it calls the core
packages and reports metadata."""
