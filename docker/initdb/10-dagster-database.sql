-- Run once by the postgres image on an empty volume (/docker-entrypoint-initdb.d): Dagster gets a database of
-- its own, so its tables (runs, event_logs, kvs …) never meet kb's in one schema.
CREATE DATABASE dagster OWNER kb;
