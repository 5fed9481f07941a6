"""What tools do, for requests in plain words that never name the tool.

A topic is one tool's job: its descriptions, usual names, typed parameters (each filled from the
request), how people ask for it, and how the answer reads once the tool has returned. Hand-written
topics are everyday assistants' tools; frames over the word list's nouns give many more, so the
model learns to match the words of a request with a tool's name and description rather than to
remember a few topics. Topics whose key is held out (chatdoc.is_held_out) and frames over
held-out nouns are kept for the acceptance check: their words never name or describe a training tool.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from tpserve.train.chatdoc import is_held_out, pseudo_word, split_words
from tpserve.train.words import (ADJECTIVES, ANIMALS, CHORES, CITIES, CURRENCIES, FOODS, LANGUAGES, NAMES, NOUNS,
                                 PHRASES, ROOMS, SKIES, WEEKDAYS)


@dataclass(frozen=True)
class Topic:
    key: str
    descs: tuple[str, ...]
    names: tuple[str, ...]
    params: tuple[tuple[str, tuple[str, ...], str], ...]  # (label in asks and reply, argument names, slot)
    asks: tuple[str, ...]
    reply: str


def _t(key: str, descs: str, names: str, params: str, asks: str, reply: str) -> Topic:
    ps = tuple((label, tuple(args.split("/")), slot) for label, args, slot in (p.split(":") for p in params.split()))
    return Topic(key, tuple(descs.split(" | ")), tuple(names.split()), ps, tuple(asks.split(" | ")), reply)


CITY = "city:city/location:city"
TRIP = "origin:origin/from_city:city destination:destination/to_city:city"
TOPICS = (
    _t("weather", "Get the current weather for a city | Current weather in a city | Weather conditions right now "
       "in a given city", "get_weather weather current_weather weather_now", CITY,
       "What is the weather in {city}? | What's the weather like in {city} right now? | How is the weather in "
       "{city} today? | Tell me the weather in {city}. | Is it sunny in {city}? Check the weather.",
       "It is {temperature} and {conditions} in {city}."),
    _t("time", "Get the local time in a city | Current local time for a city | What time it is now in a given city",
       "get_time local_time time_in current_time", CITY,
       "What time is it in {city}? | What is the local time in {city}? | Tell me the time in {city}. | "
       "Is it late in {city}? What time is it there?", "It is {clock} in {city}."),
    _t("flight", "Find flights between two cities | Look up flights from one city to another | Flight offers for "
       "a trip", "find_flights flights flight_offers get_flights", TRIP,
       "Find me a flight from {origin} to {destination}. | Are there flights from {origin} to {destination}? | "
       "I want to fly from {origin} to {destination}. | How much is a flight from {origin} to {destination}?",
       "The next flight from {origin} to {destination} leaves at {clock} and costs {price}."),
    _t("currency", "Convert money from one currency to another | Currency conversion at today's rate | Exchange an "
       "amount between currencies", "convert_currency currency exchange fx_convert",
       "amount:amount:amount source:from_currency/source:currency target:to_currency/target:currency",
       "How much is {amount} {source} in {target}? | Convert {amount} {source} to {target}. | What are {amount} "
       "{source} worth in {target}?", "{amount} {source} is {converted} {target}."),
    _t("translate", "Translate text into another language | Translation between languages",
       "translate translate_text translator", "text:text/phrase:text language:language/target_language:language",
       "Translate '{text}' into {language}. | How do you say '{text}' in {language}? | Please translate '{text}' "
       "to {language}. | What is '{text}' in {language}?", "In {language}: '{translated}'."),
    _t("email", "Send an email | Send an email message to a person | Email someone",
       "send_email email mail_to compose_email", "recipient:recipient/to:person body:body/message:text",
       "Send an email to {recipient} saying '{body}'. | Email {recipient}: {body} | Write an email to {recipient} "
       "that says '{body}'. | Please email {recipient} that {body}.", "The email to {recipient} was sent."),
    _t("message", "Send a text message to a contact | Send an SMS | Text message a friend",
       "send_message send_sms text_message sms", "contact:contact/to:person text:text/message:text",
       "Text {contact} that {text}. | Send a message to {contact}: {text} | Tell {contact} '{text}' by text "
       "message.", "Your message to {contact} went out."),
    _t("stock", "Get the latest stock price for a ticker symbol | Stock quotes | Share price of a company",
       "stock_price get_quote stock ticker_price", "symbol:symbol/ticker:symbol",
       "What is {symbol} trading at? | What's the stock price of {symbol}? | How much is one {symbol} share right "
       "now? | Check the stock {symbol}.", "{symbol} is at {price} per share."),
    _t("timer", "Set a timer for some minutes | Kitchen timer", "set_timer timer new_timer",
       "minutes:minutes/duration:minutes",
       "Set a timer for {minutes} minutes. | Time {minutes} minutes for me. | Can you set a {minutes} minute "
       "timer? | Give me a timer of {minutes} minutes.", "Your {minutes} minute timer is running."),
    _t("alarm", "Set an alarm for a time of day | Wake-up alarm", "set_alarm alarm wake_up", "time:time/at:hour",
       "Wake me up at {time}. | Set an alarm for {time}. | I need an alarm at {time}.",
       "The alarm is set for {time}."),
    _t("news", "Get the latest news headlines on a topic | News about a subject", "get_news news headlines latest_news",
       "topic:topic/subject:word", "What's the latest news about {topic}? | Any news on {topic}? | Show me "
       "headlines about {topic}. | What happened with {topic} today?", "Latest on {topic}: {headline}."),
    _t("dictionary", "Look up the meaning of a word in the dictionary | Dictionary definitions | Define an "
       "English word", "define dictionary lookup_word definition", "word:word/term:word",
       "What does the word '{word}' mean? | Define {word}. | Look up {word} in the dictionary. | What is the "
       "meaning of '{word}'?", "{word}: {meaning}."),
    _t("song", "Play a song by its title | Music player: play a song", "play_song play_music music song",
       "title:title/song:title", "Play {title}. | Put on the song {title}. | I want to hear {title}. | "
       "Can you play the song {title}?", "Now playing {title}."),
    _t("restaurant", "Book a table at a restaurant | Restaurant reservations",
       "book_table reserve_table restaurant_booking", "city:city/location:city guests:guests/people:people "
       "time:time/at:hour", "Book a table for {guests} in {city} at {time}. | Reserve a restaurant in {city} for "
       "{guests} people at {time}. | Find us a restaurant table for {guests} at {time} in {city}.",
       "Booked: a table for {guests} in {city} at {time}."),
    _t("calendar", "Put an event on the calendar | Calendar: create an event on a day",
       "create_event calendar_event schedule", "title:title/event:chore day:day/date:day",
       "Put '{title}' on my calendar for {day}. | Schedule '{title}' on {day}. | Add '{title}' to my calendar "
       "on {day}.", "'{title}' is on your calendar for {day}."),
    _t("population", "Get the population of a city | How many people live in a city",
       "population city_population get_population", CITY,
       "How many people live in {city}? | What is the population of {city}? | How big is the population of "
       "{city}?", "{city} has about {population} people."),
    _t("recipe", "Find a recipe that uses an ingredient | Recipes by ingredient", "find_recipe recipes cook_with",
       "ingredient:ingredient/food:food", "Give me a recipe with {ingredient}. | What can I cook with "
       "{ingredient}? | Find a recipe using {ingredient}.", "Try {dish}: it uses {ingredient}."),
    _t("hotel", "Find a hotel room in a city for some nights | Hotel booking", "find_hotel book_hotel hotels",
       "city:city/location:city nights:nights/stay:nights", "Find a hotel in {city} for {nights} nights. | I need "
       "a hotel room in {city} for {nights} nights. | Book me a hotel in {city}, {nights} nights.",
       "{hotel} in {city} has a room for {nights} nights at {price} a night."),
    _t("distance", "Get the distance between two cities | How far apart two cities are",
       "distance get_distance how_far", TRIP, "How far is {origin} from {destination}? | What is the distance "
       "from {origin} to {destination}? | How many kilometres from {origin} to {destination}?",
       "{origin} is {km} km from {destination}."),
    _t("balance", "Get the balance of a bank account | Bank account balance", "get_balance balance account_balance",
       "account:account/account_id:account", "What is the balance of account {account}? | How much money is in "
       "account {account}? | Check my balance on account {account}.", "Account {account} holds {price}."),
    _t("lights", "Turn the lights on or off in a room | Smart home lights", "set_lights lights switch_lights",
       "room:room/area:room state:state/power:state", "Turn {state} the lights in the {room}. | Switch the "
       "{room} lights {state}. | Lights {state} in the {room}, please.", "The {room} lights are {state}."),
    _t("thermostat", "Set the thermostat to a temperature in degrees | Heating control",
       "set_thermostat thermostat heating", "degrees:degrees/temperature:degrees",
       "Set the heating to {degrees} degrees. | Make it {degrees} degrees in here. | Turn the thermostat to "
       "{degrees}.", "The thermostat is set to {degrees} degrees."),
    _t("phone", "Find the phone of a contact | Contacts: phone lookup", "phone_of contact_phone get_phone",
       "name:name/contact:person", "What is {name}'s phone? | Find {name}'s phone in my contacts. | How do I call "
       "{name}? Look up the phone.", "{name}'s phone is {phone}."),
    _t("museum", "Opening hours of the museum in a city | Museum guide for a city", "museum_hours museum museums",
       CITY, "When does the museum in {city} open? | Is the museum in {city} open today? | What are the museum "
       "hours in {city}?", "The museum in {city} opens at {clock}."),
    _t("parking", "Find free parking in a city | Parking spaces in a city", "find_parking parking parking_spaces",
       CITY, "Where can I park in {city}? | Is there parking in {city}? | Find me a parking space in {city}.",
       "There are {spaces} free parking spaces in {city}."),
    _t("traffic", "Traffic conditions on the roads of a city | Live traffic for a city", "traffic get_traffic",
       CITY, "How is the traffic in {city}? | Is there traffic in {city} right now? | Check the traffic in {city}.",
       "Traffic in {city} is {traffic}."),
    _t("lyrics", "Get the lyrics of a song | Song lyrics by title", "lyrics get_lyrics song_lyrics",
       "title:title/song:title", "Show me the lyrics of {title}. | What are the words to {title}? | Find the "
       "lyrics for {title}.", "The first line of {title} goes: '{line}'."),
    _t("sunrise", "Sunrise and sunset times for a city | When the sun rises in a city", "sunrise sun_times",
       CITY, "When is sunrise in {city}? | What time does the sun rise in {city}? | When does the sun come up in "
       "{city}?", "The sun rises in {city} at {clock}."),
    _t("order", "Check the status of a shop order by its order code | Order tracking: where an order is now",
       "order_status get_order track_order", "order:order_id/order_code:code", "What is the status of order "
       "{order}? | Has my order {order} shipped yet? | Check on my order {order}. | Is order {order} on its way?",
       "Order {order} ships on {arrival}."),
    _t("standings", "Where a sports team stands in its league | League table position of a team",
       "standings league_table league_position", "team:team_name/squad:team", "Where are the {team} in the "
       "league? | What place are the {team} in the league table? | How high are the {team} in the standings?",
       "The {team} are in place {place} of the league."),
    _t("store_hours", "Opening hours of a shop | When a store opens and closes", "store_hours shop_hours "
       "opening_times", "store:shop_name/store_name:store", "When does {store} open? | What are the opening hours "
       "of {store}? | Is {store} open right now?", "{store} opens at {clock}."),
    # held out (is_held_out(key)): the acceptance check's topics
    _t("route", "Get the driving route from one place to another | Driving directions along the best route "
       "between two cities", "get_route route best_route", TRIP,
       "What is the best route from {origin} to {destination}? | How do I drive from {origin} to {destination}? | "
       "Show me the route from {origin} to {destination}. | Give me directions from {origin} to {destination}.",
       "Take the {km} km route from {origin} to {destination}: about {duration}."),
    _t("reminder", "Create a reminder with a message and a time | Set a reminder", "set_reminder reminder remind_me",
       "text:text/note:chore time:time/at:hour", "Remind me to {text} at {time}. | Set a reminder at {time} to "
       "{text}. | Don't let me forget to {text} at {time}.", "I will remind you to {text} at {time}."),
    _t("taxi", "Order a taxi to a destination | Book a taxi ride", "order_taxi taxi book_taxi",
       "destination:destination/to:city", "Get me a taxi to {destination}. | I need a taxi to {destination}. | "
       "Can you book a taxi to {destination}? | Call a cab to take me to {destination}.",
       "A taxi to {destination} will pick you up in {wait} minutes."),
    _t("movie", "Find movie showtimes in a city | When a movie is playing in a city", "movie_times showtimes movie",
       "title:title/movie:title city:city/location:city", "When is {title} playing in {city}? | Find showtimes "
       "for the movie {title} in {city}. | Where can I see the movie {title} in {city}?",
       "{title} plays in {city} at {clock}."),
    _t("game", "Get the latest game score of a sports team | Result of a team's last game", "game_score game "
       "last_game", "team:team/club:team", "What was the score of the {team} game? | Did the {team} win their "
       "last game? | How did the {team} do in the last game?", "The {team} won their last game {score}."),
    _t("tide", "Get tide times for a coastal city | High and low tide for a city by the sea", "tide_times tide "
       "get_tides", "city:city/port:city", "When is high tide in {city}? | What are the tide times in {city}? | "
       "Check the tide in {city}.", "High tide in {city} is at {clock}."),
    _t("podcast", "Play the latest episode of a podcast | Podcast player", "play_podcast podcast podcasts",
       "show:show/podcast:title", "Play the latest episode of {show}. | Put on the podcast {show}. | I want to "
       "listen to the {show} podcast.", "Playing the newest episode of {show}."),
    _t("doctor", "Book an appointment with a doctor | Doctor appointments for a day", "book_doctor doctor "
       "see_doctor", "day:day/date:day", "Book me a doctor's appointment on {day}. | I need to see a doctor on "
       "{day}. | Can I get a doctor appointment for {day}?", "You see the doctor on {day} at {clock}."),
    _t("coupon", "Find discount coupons for a store | Coupon codes for a shop", "find_coupons coupons coupon",
       "store:store/shop:store", "Are there any coupons for {store}? | Find me a coupon for {store}. | Do you "
       "have a coupon code for {store}?", "Use the coupon {discount} at {store}."),
    _t("delivery", "Track the delivery of a parcel by its tracking code | Delivery status of a package",
       "track_delivery delivery parcel_status", "code:code/tracking_code:code", "Where is my package {code}? | "
       "When will parcel {code} arrive? | What is the delivery status of {code}?",
       "Parcel {code} is in {location} and arrives on {arrival}."),
)

# Frames over a noun {k}: topics for every noun of the word list.
FRAMES = (
    _t("{k}", "Get the {k} for a city | Look up the {k} in a city | The {k} of a given city",
       "get_{k} {k} {k}_for_city city_{k}", CITY, "What is the {k} in {city}? | Tell me the {k} for {city}. | "
       "I need the {k} in {city}. | Check the {k} in {city}.", "The {k} in {city} is {value}."),
    _t("{k}", "Look up the {k} of a person | Find a person's {k}", "get_{k} {k}_of person_{k}",
       "person:name/person:person", "What is {person}'s {k}? | Look up the {k} of {person}. | Find the {k} for "
       "{person}.", "{person}'s {k} is {value}."),
    _t("{k}", "Send a {k} to someone | Pass a {k} on to a person", "send_{k} {k}_to give_{k}",
       "person:to/recipient:person text:text/body:text", "Send a {k} to {person} saying '{text}'. | Send "
       "{person} a {k}: {text} | Give {person} a {k} that says '{text}'.", "The {k} to {person} was sent."),
    _t("{k}", "Get the {k} between two cities | The {k} from one city to another", "{k}_between get_{k} {k}",
       TRIP, "What is the {k} from {origin} to {destination}? | Find the {k} between {origin} and {destination}. "
       "| Show the {k} from {origin} to {destination}.", "The {k} from {origin} to {destination} is {value}."),
    _t("{k}", "Set a {k} for some minutes | Set the {k} to a duration in minutes", "set_{k} {k} {k}_minutes",
       "minutes:minutes/duration:minutes", "Set a {k} for {minutes} minutes. | I need a {k} of {minutes} "
       "minutes. | Put the {k} at {minutes} minutes.", "The {k} is set for {minutes} minutes."),
    _t("{k}", "Show the {k} for a day of the week | The {k} on a given day", "{k}_on get_{k} day_{k}",
       "day:day/date:day", "What is the {k} on {day}? | Show me the {k} for {day}. | What does the {k} look like "
       "on {day}?", "The {k} on {day} is {value}."),
)

# Frames over slots only training uses (a team, a shop, a code): values of every kind are copied in training.
TRAIN_FRAMES = (
    _t("{k}", "Get the {k} of a sports team | A sports team's {k}", "team_{k} {k}_of_team get_{k}",
       "team:team/team_name:team", "What is the {k} of the {team}? | Look up the {k} for the {team}. | Find "
       "the {team}'s {k}.", "The {team}'s {k} is {value}."),
    _t("{k}", "The {k} at a shop | Look up the {k} of a store", "shop_{k} {k}_at_store store_{k}",
       "store:store/shop_name:store", "What is the {k} at {store}? | Check the {k} of {store}. | Find the {k} "
       "for {store}.", "The {k} at {store} is {value}."),
    _t("{k}", "Look up a {k} by its reference code | The {k} with a given code", "{k}_by_code get_{k} find_{k}",
       "code:code/reference:code", "Look up the {k} with code {code}. | Which {k} has the code {code}? | Find "
       "{k} {code} for me.", "{k} {code} is {value}."),
)


def _clock(rng: random.Random) -> str:
    return f"{rng.randint(5, 22)}:{rng.choice([0, 15, 30, 45, rng.randint(0, 59)]):02d}"


def _title(rng: random.Random) -> str:
    return f"{rng.choice(ADJECTIVES).capitalize()} {rng.choice(NOUNS).capitalize()}"


INTEGER_SLOTS = {"minutes": (2, 90), "amount": (5, 950), "people": (2, 9), "nights": (1, 9), "degrees": (16, 28),
                 "account": (1000, 99999)}
SLOTS = {
    "city": lambda rng: rng.choice(CITIES), "person": lambda rng: rng.choice(NAMES),
    "language": lambda rng: rng.choice(LANGUAGES), "currency": lambda rng: rng.choice(CURRENCIES),
    "text": lambda rng: rng.choice(PHRASES), "chore": lambda rng: rng.choice(CHORES),
    "day": lambda rng: rng.choice(WEEKDAYS), "hour": _clock, "word": lambda rng: rng.choice(NOUNS),
    "title": _title, "team": lambda rng: f"{rng.choice(CITIES)} {rng.choice(ANIMALS)}",
    "symbol": lambda rng: "".join(rng.choice("ABCDEFGHIJKLMNOPRSTUVWXYZ") for _ in range(rng.randint(3, 4))),
    "code": lambda rng: rng.choice(["ZX", "PK", "DL", "UP", "QR"]) + str(rng.randint(10000, 9999999)),
    "room": lambda rng: rng.choice(ROOMS), "state": lambda rng: rng.choice(["on", "off"]),
    "food": lambda rng: rng.choice(FOODS), "store": lambda rng: f"{rng.choice(NAMES)}'s {rng.choice(NOUNS)} shop",
    **{k: (lambda lo, hi: lambda rng: rng.randint(lo, hi))(*r) for k, r in INTEGER_SLOTS.items()},
}
RESULTS = {
    "temperature": lambda rng: f"{rng.randint(-5, 34)} degrees", "conditions": lambda rng: rng.choice(SKIES),
    "clock": _clock, "price": lambda rng: f"${rng.randint(2, 900)}.{rng.randint(0, 99):02d}",
    "converted": lambda rng: f"{rng.uniform(1, 2000):.2f}",
    "translated": lambda rng: " ".join(pseudo_word(rng) for _ in range(rng.randint(2, 5))),
    "headline": lambda rng: f"{rng.choice(CITIES)} opens a new {rng.choice(NOUNS)} center",
    "meaning": lambda rng: f"a kind of {rng.choice(NOUNS)}",
    "population": lambda rng: f"{rng.randint(1, 30)}.{rng.randint(0, 9)} million",
    "dish": lambda rng: f"{rng.choice(FOODS)} {rng.choice(['soup', 'salad', 'curry', 'pie', 'stew'])}",
    "hotel": lambda rng: f"The {rng.choice(NAMES)} Inn", "km": lambda rng: rng.randint(20, 3000),
    "duration": lambda rng: f"{rng.randint(1, 30)} hours {rng.randint(1, 59)} minutes",
    "score": lambda rng: f"{rng.randint(1, 6)}-{rng.randint(0, 5)}",
    "phone": lambda rng: f"555-{rng.randint(1000, 9999)}",
    "wait": lambda rng: rng.randint(2, 20), "discount": lambda rng: f"SAVE{rng.randint(5, 40)}",
    "spaces": lambda rng: rng.randint(0, 80), "traffic": lambda rng: rng.choice(["light", "heavy", "moderate"]),
    "line": lambda rng: rng.choice(PHRASES), "arrival": lambda rng: rng.choice(WEEKDAYS),
    "location": lambda rng: rng.choice(CITIES),
    "place": lambda rng: rng.randint(1, 20),
    "value": lambda rng: rng.choice([rng.randint(0, 999), rng.choice(NOUNS + SKIES), f"${rng.randint(1, 99)}"]),
}


def hand_topics(held_out: bool) -> tuple[Topic, ...]:
    return tuple(t for t in TOPICS if is_held_out(t.key) == held_out)


def frame_topic(frame: Topic, noun: str) -> Topic:
    def sub(s: str) -> str:
        return re.sub(r"\b([Aa]) (?=[aeiou])", r"\1n ", s.replace("{k}", noun))

    return Topic(noun, tuple(map(sub, frame.descs)), tuple(map(sub, frame.names)), frame.params,
                 tuple(map(sub, frame.asks)), sub(frame.reply))


def draw_topic(rng: random.Random, held_out: bool) -> Topic:
    """A hand-written topic three times in five, else a frame over a noun of the same split (training
    draws from the training-only frames too)."""
    if rng.random() < 0.6:
        return rng.choice(hand_topics(held_out))
    frames = FRAMES if held_out else FRAMES + TRAIN_FRAMES
    return frame_topic(rng.choice(frames), rng.choice(split_words(NOUNS, held_out)))


def param_schema(slot: str, arg: str, rng: random.Random) -> dict:
    spec = {"type": "integer"} if slot in INTEGER_SLOTS else {"type": "string"}
    if slot == "state":
        spec["enum"] = ["on", "off"]
    if rng.random() < 0.4:
        spec["description"] = f"The {arg.replace('_', ' ')}."
    return spec


def fill(rng: random.Random, topic: Topic) -> dict:
    """label -> value for one request (values of one slot differ: two cities are two cities)."""
    values: dict = {}
    for label, _, slot in topic.params:
        v = SLOTS[slot](rng)
        while v in values.values():
            v = SLOTS[slot](rng)
        values[label] = v
    return values


def result_of(rng: random.Random, topic: Topic) -> dict:
    """The tool's result: the values the reply needs that the request does not give."""
    labels = {label for label, _, _ in topic.params}
    keys = [k for k in RESULTS if "{" + k + "}" in topic.reply and k not in labels]
    return {k: RESULTS[k](rng) for k in keys} or {"status": "ok"}
