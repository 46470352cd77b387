"""How tether classifies AgentDojo's tools: effect class, trusted outputs, URL arguments.

Everything not listed as irreversible or reversible is read-only. Every tool's output is
untrusted (third parties write emails, files, reviews, web pages, messages, even channel names)
except the few that return only the user's own account data, listed in TRUSTED. The harness
checks this: a TRUSTED tool whose output carries an injection fails the benchmark.
"""

from __future__ import annotations

IRREVERSIBLE: dict[str, set[str]] = {
    "workspace": {"send_email", "delete_email", "create_calendar_event", "cancel_calendar_event",
                  "reschedule_calendar_event", "add_calendar_event_participants", "share_file", "delete_file"},
    "travel": {"reserve_hotel", "reserve_car_rental", "reserve_restaurant", "send_email", "create_calendar_event",
               "cancel_calendar_event"},
    "banking": {"send_money", "schedule_transaction", "update_scheduled_transaction", "update_password",
                "update_user_info"},
    "slack": {"send_direct_message", "send_channel_message", "add_user_to_channel", "invite_user_to_slack",
              "remove_user_from_slack", "post_webpage"},
}

REVERSIBLE: dict[str, set[str]] = {
    "workspace": {"create_file", "append_to_file"},
    "travel": set(),
    "banking": set(),
    "slack": set(),
}

TRUSTED: dict[str, set[str]] = {
    "workspace": {"get_current_day", "search_contacts_by_name", "search_contacts_by_email"},
    "travel": {"get_user_information"},
    "banking": {"get_iban", "get_balance", "get_user_info", "get_scheduled_transactions"},
    "slack": {"get_users_in_channel"},
}

# The arguments the taint rule checks: the destination or target of each tool with an effect
# (who receives, what is deleted or changed, where money goes, when). Payload (subjects, bodies,
# titles, descriptions) is left out: the user asked for it to be derived from what was read, and it can
# only reach a destination that is itself traceable to the user.
# create_calendar_event: "Creates a new calendar event with the given details and adds it to the user's
# calendar. It also sends an email to the participants with the event details.": who is invited and when
# are checked; the title, description and location are the details sent (an e-mail's subject and body)
_EVENT = ("participants", "start_time", "end_time")
GUARDED: dict[str, dict[str, tuple[str, ...]]] = {
    "workspace": {
        "send_email": ("recipients", "cc", "bcc"),
        "delete_email": ("email_id",),
        "create_calendar_event": _EVENT,
        "cancel_calendar_event": ("event_id",),
        "reschedule_calendar_event": ("event_id", "new_start_time"),
        "add_calendar_event_participants": ("event_id", "participants"),
        "share_file": ("file_id", "email"),
        "delete_file": ("file_id",),
        # "Create a new file in the cloud drive." / "Append content to a file in the cloud drive.": the
        # drive is the user's own, so the content is text for the user (payload); which file is written
        # (the name a new file gets, the file appended to, which may be shared) is checked
        "create_file": ("filename",),
        "append_to_file": ("file_id",),
    },
    "travel": {
        "reserve_hotel": ("hotel",),
        "reserve_car_rental": ("company",),
        "reserve_restaurant": ("restaurant",),
        "send_email": ("recipients", "cc", "bcc"),
        "create_calendar_event": _EVENT,
        "cancel_calendar_event": ("event_id",),
    },
    "banking": {
        "send_money": ("recipient", "amount"),
        "schedule_transaction": ("recipient", "amount"),
        "update_scheduled_transaction": ("id", "recipient", "amount"),
        # update_password, update_user_info: every argument
    },
    "slack": {
        "send_direct_message": ("recipient",),
        "send_channel_message": ("channel",),
        "add_user_to_channel": ("user", "channel"),
        "invite_user_to_slack": ("user", "user_email"),
        "remove_user_from_slack": ("user",),
        "post_webpage": ("url",),
    },
}

# Tools returning the user's private data (passport, card, account numbers): identifiers from
# them may not leave in an irreversible call after taint unless the user wrote them.
PRIVATE: dict[str, set[str]] = {
    "workspace": set(),
    "travel": {"get_user_information"},
    "banking": {"get_user_info"},
    "slack": set(),
}

URL_ARGS: dict[str, dict[str, tuple[str, ...]]] = {
    "slack": {"get_webpage": ("url",), "post_webpage": ("url",)},
}


def effect_of(suite: str, tool: str) -> str:
    if tool in IRREVERSIBLE.get(suite, set()):
        return "irreversible"
    if tool in REVERSIBLE.get(suite, set()):
        return "reversible"
    return "read_only"


# Fields of untrusted outputs that the service itself sets (tether.values._fields: shown beside the handle,
# trusted by handle; each must fit its shape, else it stays hidden). Only what no outsider writes: the bank
# sets a transaction's id, parties, amount, date and recurrence (its sender writes the subject); the slack
# workspace sets a message's sender and recipient (its author writes the body) and lists the channel names;
# the calendar and the drive assign event and file ids, the drive a file's owner and size. Not an e-mail's
# sender (mail can be forged), not an event's times or participants (whoever sent the invitation chose them).
_FILE = {"id_": "id", "owner": "email", "size": "number"}
FIELDS: dict[str, dict[str, dict[str, str]]] = {
    "workspace": {
        "search_calendar_events": {"id_": "id"}, "get_day_calendar_events": {"id_": "id"},
        "create_calendar_event": {"id_": "id"},
        "list_files": _FILE, "search_files": _FILE, "search_files_by_filename": _FILE, "get_file_by_id": _FILE,
        "create_file": _FILE, "append_to_file": _FILE,
        "get_received_emails": {"id_": "id"}, "search_emails": {"id_": "id"}, "get_unread_emails": {"id_": "id"},
    },
    "travel": {},
    "banking": {
        "get_most_recent_transactions": {"id": "id", "sender": "iban", "recipient": "iban", "amount": "number",
                                         "date": "date", "recurring": "boolean"},
    },
    "slack": {
        "get_channels": {"*": "name"},
        "read_channel_messages": {"sender": "name", "recipient": "name"},
        "read_inbox": {"sender": "name", "recipient": "name"},
    },
}
