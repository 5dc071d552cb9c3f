"""Persistence for invoice-relay: the invoices and deliveries tables in PostgreSQL."""
from __future__ import annotations

import psycopg

SCHEMA = """
CREATE TABLE IF NOT EXISTS invoices (
    id          bigserial PRIMARY KEY,
    partner_ref text NOT NULL,
    amount_cents bigint NOT NULL CHECK (amount_cents >= 0),
    currency    char(3) NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS deliveries (
    id          bigserial PRIMARY KEY,
    invoice_id  bigint NOT NULL REFERENCES invoices(id) ON DELETE CASCADE,
    url         text NOT NULL,
    attempts    int NOT NULL DEFAULT 0,
    status      text NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'sent', 'given_up'))
);
"""


def migrate(conn: psycopg.Connection) -> None:
    """Create the invoices and deliveries tables if they do not exist."""
    with conn.transaction():
        conn.execute(SCHEMA)


def save_invoice(conn: psycopg.Connection, partner_ref: str, amount_cents: int, currency: str) -> int:
    """Insert an invoice and return its id."""
    return conn.execute(
        "INSERT INTO invoices (partner_ref, amount_cents, currency) VALUES (%s, %s, %s) RETURNING id",
        (partner_ref, amount_cents, currency)).fetchone()[0]


def queue_deliveries(conn: psycopg.Connection, invoice_id: int, urls: list[str]) -> int:
    """Queue one webhook delivery per subscribed partner URL."""
    with conn.transaction():
        for url in urls:
            conn.execute("INSERT INTO deliveries (invoice_id, url) VALUES (%s, %s)", (invoice_id, url))
    return len(urls)


def failed_deliveries(conn: psycopg.Connection) -> list[tuple]:
    """Deliveries that were given up after the last attempt (relay status --failed)."""
    return conn.execute("SELECT id, invoice_id, url, attempts FROM deliveries WHERE status = 'given_up'").fetchall()
