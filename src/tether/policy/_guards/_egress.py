"""`EgressGuard`: URL arguments checked against the egress policy."""

from __future__ import annotations

from tether._types import CallDecision
from tether.policy._canonical import leaves
from tether.policy._egress import looks_like_url
from tether.policy._guard import BaseGuard, CallView, Stop
from tether.policy._provenance import Origin


class EgressGuard(BaseGuard):
    """Declared URL arguments (`url_args`) and, after taint, any argument that is only a URL or host:
    an internal address in a declared one is refused (`refused:egress`); a host the egress policy
    does not allow asks, unless the URL is from the user's request."""

    def check(self, c: CallView, /) -> Stop | None:
        """URL arguments: declared ones, and after taint any argument that is only a URL or host."""
        policy = c.policy
        url_args = c.cap.url_args or tuple(c.declares.url_args)
        for path, value in leaves(c.args) if url_args or c.tainted else ():
            if not isinstance(value, str) or not value:
                continue
            declared = path.split(".", 1)[0] in url_args
            # after taint the default mode takes no text match as proof that the user wrote a URL
            users = c.trace.get(path) is Origin.USER and (policy.use_provenance or not c.tainted)
            if not declared and not (c.tainted and not users and looks_like_url(value)):
                continue
            c.egress_paths.append(path)
            verdict, why = policy.egress.check(value)
            if verdict == "internal" and declared:
                return Stop(f"{CallDecision.REFUSED}:egress", why)
            if verdict != "allow" and not (users or (policy.use_provenance and c.trace.get(path) is Origin.TRUSTED)):
                c.ask.append(f"{why} and the URL is not known to be from the user's request")
        return None
