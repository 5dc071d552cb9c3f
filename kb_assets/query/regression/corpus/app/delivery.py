"""Webhook delivery worker: sends queued deliveries to partners and retries failures with backoff."""
from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
from dataclasses import dataclass

import httpx

MAX_ATTEMPTS = 8
BASE_DELAY = 2.0      # seconds before the second attempt
MAX_DELAY = 3600.0


@dataclass
class Delivery:
    id: int
    url: str
    payload: dict
    attempts: int = 0


def sign(payload: bytes, key: bytes) -> str:
    """HMAC-SHA256 signature sent in the X-Relay-Signature header."""
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


def backoff_delay(attempt: int) -> float:
    """Exponential backoff with full jitter: 2, 4, 8 ... seconds, capped at an hour."""
    return random.uniform(0, min(MAX_DELAY, BASE_DELAY * 2 ** attempt))


def deliver(client: httpx.Client, delivery: Delivery, key: bytes) -> bool:
    """One attempt; True when the partner answered 2xx."""
    body = json.dumps(delivery.payload, separators=(",", ":")).encode()
    response = client.post(delivery.url, content=body, timeout=10.0,
                           headers={"X-Relay-Signature": sign(body, key), "Content-Type": "application/json"})
    return 200 <= response.status_code < 300


def retry_failed_delivery(client: httpx.Client, delivery: Delivery, key: bytes, sleep=time.sleep) -> bool:
    """Retry a failed webhook delivery until it succeeds or MAX_ATTEMPTS is reached (then it is given up)."""
    while delivery.attempts < MAX_ATTEMPTS:
        delivery.attempts += 1
        try:
            if deliver(client, delivery, key):
                return True
        except httpx.HTTPError:
            pass
        sleep(backoff_delay(delivery.attempts))
    return False
