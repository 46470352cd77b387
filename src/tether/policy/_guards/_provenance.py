"""`ProvenanceGuard`: after taint, links and private data must be the user's; no silent repeats."""

from __future__ import annotations

from tether.policy._canonical import action_key, leaves
from tether.policy._egress import find_urls
from tether.policy._guard import BaseGuard, CallView
from tether.policy._provenance import Origin


class ProvenanceGuard(BaseGuard):
    """Asks (never stops) for: a tool that always needs approval (its own or a delegating run's),
    and, for a guarded call after taint, a link or private data not from the user, a command run
    where others' content was written, or an action repeated in this run. Sets `CallView.key`."""

    def check(self, c: CallView, /) -> None:
        """After taint, a payload may derive from what was read, but links in it (phishing,
        exfiltration by query string) and private data (passport, card numbers) must be the user's;
        and an action done once is not repeated without asking."""
        if c.cap.requires_approval:
            c.ask.append(f"'{c.tool.name}' always needs approval")
        if c.ctx.bounds and any(bound.requires_approval(c.tool) for bound in c.ctx.bounds):
            c.ask.append(f"the task that delegated this one requires approval for '{c.tool.name}'")
        state, trace = c.state, c.trace
        if c.guarded and c.tainted:  # reasons to ask; in the default mode, information with the prompt
            for path, value in leaves(c.args):
                if isinstance(value, str) and trace.get(path) is not Origin.USER:
                    for url in find_urls(value):
                        if url != value.strip() and state.prov.origin(url) not in (Origin.USER, Origin.TRUSTED):
                            c.ask.append(f"argument '{path}' carries a link not from the user's request ({url})")
            leaked = state.prov.private_in(c.args, skip={p for p, o in trace.items() if o is Origin.USER})
            if leaked:
                c.ask.append("the arguments carry private data from " + ", ".join(sorted(set(leaked.values()))))
            if c.declares.executes and state.written_paths:
                c.ask.append("it runs commands where files were written from content not the user's ("
                             + ", ".join(sorted(state.written_paths)[:5]) + ")")
        c.key = action_key(c.tool.name, c.args) if c.guarded else ""
        if c.guarded and (c.key in state.approved or (c.tainted and c.key in state.done)):
            c.ask.append("it repeats an action that was already done once in this run")
