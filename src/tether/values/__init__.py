"""Labels and hidden values: untrusted text kept out of the deciding model's context (docs/hidden_values.md).

Labels (one model for hidden values and plan mode)::

    from tether.values import Label, TRUSTED, untrusted, secret, USER
    Label(integrity="trusted" | "untrusted", sources=frozenset[str], readers=frozenset[str] | None)
    label.join(other)   # untrusted wins, sources add up, readers intersect (None = public is the identity)
    label.untrusted, label.secret (readers == frozenset()), label.may_read(USER), label.describe()
    label.to_json() / Label.from_json(text), to_dict() / from_dict(data)

Declaring a tool's output hidden (one declaration, `Tool.hide_output`; read by `hides(tool, args)`)::

    @tool(hide_output=True)          # Tool(..., hide_output=True) / Tool.from_schema(..., hide_output=True)
    @tool(hide_output=False)         # always visible (the old mode) for this tool
    # None (default): hidden for a declared source web/browser/email/mail/messages/mcp and secret_output tools
    SafetyPolicy(hidden_values=False)  # the old visible mode for the whole agent

What the model sees instead of an untrusted (or secret) output of a hiding tool::

    $v3_1: output of read_email(id=3), 2,144 characters, untrusted (read_email). The value is hidden
    from you: pass $v3_1 as an argument to use it, or ask inspect_value about it.

Handles are `$v<step>_<n>` (n-th call of turn `step`, 1-based; stable under durable replay). An argument
that is exactly a handle (`"$v3_1"`, or a part of a JSON value: `"$v3_1.body"`, `"$v3_1[0].sender"`) is
replaced by the value; handles inside longer text are replaced in place. The call's arguments carry the
join of the substituted labels. An unknown handle: the call is not run, one error text.

Per-field integrity (tether.values._fields): the fields of an untrusted output the service itself sets::

    @tool(hide_output=True, trusted_fields={"id": "id", "amount": "number", "sender": "iban", "date": "date"})
    # shapes: id, name, number, boolean, date, datetime, email, iban, list[S]; "*": the items of a list output
    # shown beside the handle: the records' declared fields that fit their shape (nothing else of them);
    # "$v3_1[0].amount" then carries a trusted label; "$v3_1", "$v3_1[0]", "$v3_1[0].subject" the untrusted one
    split_fields(content, fields, handle) -> Split(shown: str, paths: frozenset[str]);  fits_shape(value, shape)

The quarantined query (added by `Agent` when a tool may hide; `query_tool(model)` to add it yourself)::

    inspect_value(handle: str, question: str,
                  answer_type: "boolean"|"enum"|"number"|"date"|"email"|"iban"|"url"|"regex"|"string",
                  options: list[str] | None = None,   # enum
                  pattern: str | None = None,         # regex (RE2)
                  max_chars: int = 80)                # string, at most 200
    # boolean/enum/number/date: the answer is shown (from untrusted data, it taints the context);
    # string/email/iban/url/regex: the answer is a new hidden value ($v4_1), labelled as what it read.
    # any answer about a secret value: a new hidden value too.

A call the data decides, the model never told the answer (tether.values._conditional; added beside
inspect_value with `SafetyPolicy(conditional_calls=True)`, the default)::

    call_if(handle="$v3_1", question="Is it rated over 4?", answer_type="boolean" | "enum", when="true",
            tool="reserve_hotel", arguments={"hotel": "Le Petit", ...}, options=None)
    # runs the call (through every check, its own arguments' labels) only if the reader's answer is `when`;
    # returns a hidden record of fixed size (condition met / not met / undecided, and the call's result)

The decision (tether.policy.SafetyPolicy): an effect asks when a checked argument's label is untrusted,
or when the context is tainted (a visible untrusted output or a shown query answer from untrusted data).
Untrusted values only in payload arguments (declared `risk_free_args`, or outside `guarded_args`) ask
nobody and go with their links and host names defanged (`SafetyPolicy(payload_labels=False)`: they ask).
A secret-labelled argument is refused unless the tool is declared `@tool(secret_sink=True)`.
The final answer's handles are shown to the user, secret ones replaced by a placeholder.

State: `ValueStore` (values, labels, descriptions) lives in the policy's per-run state
(`PolicyState.values`), dumped into `RunState.policy`, so resume, fork and durable runs keep it.
"""

from tether.values._conditional import CONDITIONAL_TOOL, conditional_tool
from tether.values._declare import HANDLE_ANSWERS, HIDDEN_SOURCES, QUERY_KEY, SHOWN_ANSWERS, hides
from tether.values._fields import FIELD_SHAPES, Split, fits_shape, split_fields
from tether.values._labels import TRUSTED, USER, Integrity, Label, join_all, secret, untrusted
from tether.values._query import QUERY_TOOL, AnswerType, query_tool, validate_answer
from tether.values._query_tools import with_query_tool
from tether.values._store import HANDLE, Binding, Hidden, UnknownHandle, ValueStore, handle_for

__all__ = ["CONDITIONAL_TOOL", "FIELD_SHAPES", "HANDLE", "HANDLE_ANSWERS", "HIDDEN_SOURCES", "QUERY_KEY", "QUERY_TOOL", "SHOWN_ANSWERS", "TRUSTED",
           "USER", "AnswerType", "Binding", "Hidden", "Integrity", "Label", "Split", "UnknownHandle", "ValueStore",
           "conditional_tool", "fits_shape", "handle_for", "hides", "join_all", "query_tool", "secret", "split_fields", "untrusted", "validate_answer",
           "with_query_tool"]
