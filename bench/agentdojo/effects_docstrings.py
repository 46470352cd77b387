"""A second, independent classification of the AgentDojo tools, written from the tools' docstrings
alone (without looking at `effects.py`): what a careful user would declare when wiring these tools
into tether. It differs on purpose where a reasonable person could: bookings, new calendar events,
new files and scheduled payments are reversible (they can be cancelled or edited), catalogue reads
(hotels, restaurants, cars, flights) and the user's own profile, contacts, drafts and sent mail are
trusted, reviews, messages, mail received, files and web pages are not.

Per suite: `EFFECTS` (tool -> read_only | reversible | irreversible; unlisted tools are read-only),
`TRUSTED` (tools whose output nobody but the user or the service wrote), `PRIVATE` (outputs holding
identity documents, account numbers, balances), `URL_ARGS` (arguments a tool fetches or posts to),
`RISK_FREE` (arguments that may carry text derived from what was read: message bodies, subjects,
titles; every other argument is checked).
"""

from __future__ import annotations

EFFECTS: dict[str, dict[str, str]] = {
    "workspace": {
        "send_email": "irreversible", "delete_email": "irreversible", "delete_file": "irreversible",
        "share_file": "irreversible", "cancel_calendar_event": "irreversible",
        "add_calendar_event_participants": "irreversible",
        "create_calendar_event": "reversible", "reschedule_calendar_event": "reversible",
        "append_to_file": "reversible", "create_file": "reversible",
    },
    "travel": {
        "send_email": "irreversible", "cancel_calendar_event": "irreversible",
        "reserve_hotel": "reversible", "reserve_car_rental": "reversible", "reserve_restaurant": "reversible",
        "create_calendar_event": "reversible",
    },
    "banking": {
        "send_money": "irreversible", "update_password": "irreversible",
        "schedule_transaction": "reversible", "update_scheduled_transaction": "reversible",
        "update_user_info": "reversible",
    },
    "slack": {
        "send_direct_message": "irreversible", "send_channel_message": "irreversible",
        "invite_user_to_slack": "irreversible", "remove_user_from_slack": "irreversible",
        "post_webpage": "irreversible", "add_user_to_channel": "reversible",
    },
}

TRUSTED: dict[str, set[str]] = {
    "workspace": {"get_current_day", "search_contacts_by_name", "search_contacts_by_email", "get_sent_emails",
                  "get_draft_emails"},
    "travel": {"get_user_information", "get_all_hotels_in_city", "get_hotels_prices", "get_hotels_address",
               "get_all_restaurants_in_city", "get_cuisine_type_for_restaurants", "get_restaurants_address",
               "get_dietary_restrictions_for_all_restaurants", "get_contact_information_for_restaurants",
               "get_price_for_restaurants", "check_restaurant_opening_hours",
               "get_all_car_rental_companies_in_city", "get_car_types_available", "get_car_fuel_options",
               "get_car_rental_address", "get_car_price_per_day", "get_flight_information"},
    "banking": {"get_iban", "get_balance", "get_user_info", "get_scheduled_transactions"},
    "slack": {"get_channels", "get_users_in_channel"},
}

PRIVATE: dict[str, set[str]] = {
    "workspace": set(),
    "travel": {"get_user_information"},
    "banking": {"get_balance", "get_user_info", "get_iban"},
    "slack": set(),
}

URL_ARGS: dict[str, dict[str, tuple[str, ...]]] = {
    "workspace": {}, "travel": {}, "banking": {},
    "slack": {"get_webpage": ("url",), "post_webpage": ("url",)},
}

RISK_FREE: dict[str, dict[str, tuple[str, ...]]] = {
    "workspace": {"send_email": ("subject", "body"), "create_calendar_event": ("title", "description", "location"),
                  "create_file": ("content",), "append_to_file": ("content",)},
    "travel": {"send_email": ("subject", "body"), "create_calendar_event": ("title", "description", "location")},
    "banking": {"send_money": ("subject",), "schedule_transaction": ("subject",),
                "update_scheduled_transaction": ("subject",)},
    "slack": {"send_direct_message": ("body",), "send_channel_message": ("body",)},
}

# Fields of an untrusted output the service itself sets, written from the tools' return types and their
# field titles alone ("ID of the transaction", "IBAN of the sender", "Sender of the message"): ids the
# service assigns, the bank's parties, amount and date, the workspace's sender of a message. Left out:
# anything a person types (subjects, bodies, titles, descriptions, file names and contents), an e-mail's
# addresses, an event's times and participants, a file's sharing.
FIELDS: dict[str, dict[str, dict[str, str]]] = {
    "workspace": {
        "search_calendar_events": {"id_": "id"}, "get_day_calendar_events": {"id_": "id"},
        "list_files": {"id_": "id"}, "search_files": {"id_": "id"}, "search_files_by_filename": {"id_": "id"},
        "get_file_by_id": {"id_": "id"}, "create_file": {"id_": "id"}, "append_to_file": {"id_": "id"},
        "get_received_emails": {"id_": "id"}, "search_emails": {"id_": "id"}, "get_unread_emails": {"id_": "id"},
    },
    "travel": {},
    "banking": {
        "get_most_recent_transactions": {"id": "id", "sender": "iban", "recipient": "iban", "amount": "number",
                                         "date": "date"},
    },
    "slack": {
        "read_channel_messages": {"sender": "name"},
        "read_inbox": {"sender": "name"},
    },
}
