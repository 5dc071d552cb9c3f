"""The /knowledge page for people: server-rendered HTML (Jinja2, autoescaped, no scripts, no build step).

The token is entered once in a login form and kept in a cookie (HttpOnly, SameSite=Strict, Secure behind
TLS); every page view is authenticated and rate-limited like an API call. A strict Content-Security-Policy
forbids scripts altogether, so even a missed escape could not run code.
"""
from __future__ import annotations

from urllib.parse import urlencode

from fastapi import FastAPI, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

_env = Environment(loader=PackageLoader("kb_assets.serving", "templates"),
                   autoescape=select_autoescape(["html"], default=True), trim_blocks=True, lstrip_blocks=True)


def _render(name: str, status: int = 200, **ctx) -> HTMLResponse:
    return HTMLResponse(_env.get_template(name).render(**ctx), status_code=status)


def _login(request: Request, message: str | None = None, status: int = 401, next_url: str = "/knowledge"):
    return _render("login.html", status, message=message, next_url=next_url)


def _safe_next(url: str | None) -> str:
    # only our own page: no open redirect to another site
    return url if url and url.startswith("/knowledge") and not url.startswith("//") else "/knowledge"


def _authed(request: Request) -> Response | None:
    """None when the cookie's token is good; else the response to send (login form, or 429)."""
    from kb_assets.serving.app import ApiError, authenticate

    try:
        authenticate(request, request.cookies.get("kb_token"))
    except ApiError as exc:
        if exc.status == 429:
            r = _render("error.html", 429, message=str(exc))
            r.headers.update(exc.headers)
            return r
        here = request.url.path + (("?" + request.url.query) if request.url.query else "")
        msg = "Your token is no longer valid: sign in again." if request.cookies.get("kb_token") else None
        return _login(request, msg, next_url=_safe_next(here))
    return None


def _link(params: dict, **changes) -> str:
    p = {k: v for k, v in {**params, **changes}.items() if v not in (None, "", [])}
    return "/knowledge?" + urlencode(p, doseq=True) if p else "/knowledge"


def add_routes(app: FastAPI) -> None:
    from kb_assets.serving import views
    from kb_assets.serving.app import ApiError, Filters, parse_date_range, parse_queries

    @app.get("/knowledge", response_class=HTMLResponse, include_in_schema=False)
    def knowledge(request: Request, q: str | None = Query(None), source: str | None = Query(None),
                  kind: str | None = Query(None), tag: str | None = Query(None),
                  date_from: str | None = Query(None, alias="from"), date_to: str | None = Query(None, alias="to")):
        denied = _authed(request)
        if denied is not None:
            return denied
        st = request.app.state.kb
        params = {"q": q, "source": source, "kind": kind, "tag": tag, "from": date_from, "to": date_to}
        error = None
        results, facets = [], None
        with st.connection() as conn:
            header = {"index": views.index_info(conn), "drift": {d["source"]: d for d in views.drift(conn)}}
            if q and q.strip():
                try:
                    qs = parse_queries([q])
                    since, until = (parse_date_range(f"{date_from or ''}:{date_to or ''}")
                                    if (date_from or date_to) else (None, None))
                    # facet counts come from the unfiltered answer; the list shows the filtered one
                    everything = views.run_recall(conn, st, qs, limit=50, code_limit=20)
                    facets = views.facet_counts(everything.documents + everything.code)
                    f = Filters(source=[source] if source else None, kind=[kind] if kind else None,
                                tag=[tag] if tag else None, since=since, until=until)
                    if any((source, kind, tag, since, until)):
                        shown = views.run_recall(conn, st, qs, limit=20, code_limit=10, filters=f)
                    else:
                        shown = everything
                    results = sorted(shown.documents + shown.code, key=lambda r: -r.score)[:30]
                except ApiError as exc:
                    error = str(exc)
            if facets is None:
                facets = views.index_facets(conn)
        return _render("knowledge.html", q=q or "", params=params, results=results, facets=facets,
                       header=header, error=error, link=lambda **kw: _link(params, **kw))

    @app.get("/knowledge/doc", response_class=HTMLResponse, include_in_schema=False)
    def knowledge_doc(request: Request, id: str = Query(...)):
        denied = _authed(request)
        if denied is not None:
            return denied
        from kb_assets.query import QueryError, show

        st = request.app.state.kb
        with st.connection() as conn:
            try:
                doc = show(id.replace("\x00", ""), conn=conn)
            except QueryError as exc:
                return _render("error.html", 404, message=str(exc))
            roots = dict(conn.execute("SELECT key, root FROM sources").fetchall())
        url = views.source_url(roots.get(doc["source"]), doc["path"], doc.get("indexed_commit"))
        return _render("document.html", doc=doc, source_url=url)

    @app.post("/knowledge/login", response_class=HTMLResponse, include_in_schema=False)
    def knowledge_login(request: Request, token: str = Form(""), next: str = Form("/knowledge")):
        from kb_assets.serving.app import authenticate

        try:
            authenticate(request, token.strip())
        except ApiError as exc:
            if exc.status == 429:
                return _render("error.html", 429, message=str(exc))
            return _login(request, "That token is not valid (unknown, revoked or expired).",
                          next_url=_safe_next(next))
        r = RedirectResponse(_safe_next(next), status_code=303)
        r.set_cookie("kb_token", token.strip(), httponly=True, samesite="strict", path="/knowledge",
                     secure=request.app.state.kb.secure_cookie or request.url.scheme == "https",
                     max_age=30 * 86400)
        return r

    @app.post("/knowledge/logout", include_in_schema=False)
    def knowledge_logout():
        r = RedirectResponse("/knowledge", status_code=303)
        r.delete_cookie("kb_token", path="/knowledge")
        return r
