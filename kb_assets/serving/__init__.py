"""kb over HTTP: the query server (`kb serve`) and the git push webhook (webhooks.py)."""
