"""The dashboard's access check when the coordinator has a shared token.

A browser signs in once, with the login form or `?token=` in any address; it then holds
a cookie whose value is derived from the token (an HMAC), so the cookie never shows the
token itself. Prometheus sends the token as `Authorization: Bearer <token>`. A request
without one of these gets 401 (the API, /metrics) or the login form (a page).
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qs, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

COOKIE = "trainer_dashboard"
PUBLIC_PATHS = ("/login", "/static/style.css")
COOKIE_MAX_AGE = 7 * 24 * 3600
MAX_FORM_BYTES = 4096


class Access:
    """Checks requests against the token (None: the dashboard is open to whoever can reach
    its port, like the Thrift port without a token)."""

    def __init__(self, token: str | None, secure: bool) -> None:
        self.token = token
        self.secure = secure  # served over TLS: the cookie is sent only over TLS too
        self._cookie = _derive(token) if token else ""

    def allowed(self, request: Request) -> bool:
        if self.token is None or request.url.path in PUBLIC_PATHS:
            return True
        cookie = request.cookies.get(COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self._cookie.encode()):
            return True
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        return scheme.lower() == "bearer" and self.matches(value.strip())

    def matches(self, token: str) -> bool:
        return bool(self.token) and hmac.compare_digest(token.encode(), self.token.encode())

    def sign_in(self, response: Response) -> Response:
        response.set_cookie(COOKIE, self._cookie, max_age=COOKIE_MAX_AGE, httponly=True,
                            samesite="strict", secure=self.secure)
        return response

    def refuse(self, request: Request) -> Response:
        """401 for the API and /metrics; the login form, sent back here after, for pages."""
        path = request.url.path
        if path.startswith("/api/") or path == "/metrics" or path.startswith("/static/"):
            return PlainTextResponse("401 Unauthorized: this dashboard needs the coordinator's "
                                     "token (sign in at /login, or send Authorization: "
                                     "Bearer <token>)\n", status_code=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        return RedirectResponse("/login?" + urlencode({"next": path}), status_code=303)

    def token_in_query(self, request: Request) -> Response | None:
        """`?token=` once: the cookie is set and the address is loaded again without it,
        so the token does not stay in the address bar or the history."""
        token = request.query_params.get("token")
        if token is None or self.token is None:
            return None
        if not self.matches(token):
            return login_page(request.url.path, wrong=True, status_code=401)
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = request.url.path + ("?" + urlencode(rest) if rest else "")
        return self.sign_in(RedirectResponse(target, status_code=303))

    async def login(self, request: Request) -> Response:
        """GET: the form; POST: check the token, set the cookie, go to `next`."""
        target = _local(request.query_params.get("next", "/"))
        if request.method != "POST":
            return login_page(target)
        body = (await request.body())[:MAX_FORM_BYTES].decode("utf-8", errors="replace")
        form = parse_qs(body)
        token = (form.get("token") or [""])[0].strip()
        target = _local((form.get("next") or [target])[0])
        if self.token is None or self.matches(token):
            return self.sign_in(RedirectResponse(target, status_code=303))
        return login_page(target, wrong=True, status_code=401)


def _derive(token: str) -> str:
    return hmac.new(token.encode(), b"trainer dashboard cookie v1", hashlib.sha256).hexdigest()


def _local(target: str) -> str:
    """Only a path of this site: never send the browser elsewhere after signing in."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


def login_page(target: str, wrong: bool = False, status_code: int = 200) -> HTMLResponse:
    from html import escape

    message = '<p class="error" id="login-error">That token is not this coordinator\'s.</p>' \
        if wrong else ""
    return HTMLResponse(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in - trainer dashboard</title>
<link rel="stylesheet" href="/static/style.css"></head>
<body><main class="login"><h1>Trainer dashboard</h1>
<p>This coordinator needs its shared token (the content of its <code>--token-file</code>).</p>
{message}
<form method="post" action="/login">
<input type="hidden" name="next" value="{escape(target)}">
<label>Token <input type="password" name="token" id="token" autofocus></label>
<button type="submit" id="sign-in">Sign in</button>
</form></main></body></html>
""", status_code=status_code)
