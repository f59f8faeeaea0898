"""Offline structured-extraction data: a short text about a person, order, event or book -> a JSON object.

Each row has `question` (the instruction, with the schema inline), `text`, `schema` and `gold` (both JSON strings),
`domain` and `id`. Rows are generated from seeded word lists, so the committed files can be rebuilt exactly:

    python -m grpo_recipes.tasks.json_rows --out recipes/data     # writes json_train.jsonl and json_eval.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

FIRST = ["Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farah", "Gustavo", "Hana", "Ivan", "Julia", "Kenji", "Lena",
         "Mateo", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Yara"]
LAST = ["Alvarez", "Becker", "Chen", "Dubois", "Eriksen", "Fischer", "Garcia", "Haddad", "Ito", "Jansen", "Kowalski",
        "Lindqvist", "Moreau", "Novak", "Okafor", "Petrov", "Rossi", "Sato", "Tanaka", "Varga", "Weber", "Zhang"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Osaka", "Lima", "Krakow", "Toronto", "Seville", "Hanoi", "Tbilisi", "Porto",
          "Montreal", "Accra", "Bergen", "Cusco", "Dublin", "Graz", "Leeds", "Mumbai", "Perth"]
JOBS = ["nurse", "carpenter", "data analyst", "pilot", "teacher", "chef", "architect", "librarian", "electrician",
        "photographer", "pharmacist", "translator", "geologist", "baker", "surveyor"]
PRODUCTS = ["desk lamp", "espresso grinder", "trail backpack", "wireless keyboard", "cast-iron pan", "yoga mat",
            "rain jacket", "bookshelf", "mechanical pencil set", "water filter", "bike helmet", "standing fan"]
CURRENCIES = {"USD": "$", "EUR": "€", "GBP": "£"}
EVENTS = ["Spring Robotics Meetup", "Open Data Workshop", "Community Chess Night", "Harbour Jazz Evening",
          "Intro to Pottery", "Climate Policy Forum", "Startup Pitch Day", "Night Sky Talk", "Film Club Screening",
          "Urban Gardening Swap", "Poetry Open Mic", "Retro Games Marathon"]
BOOK_WORDS = ["Silent", "River", "Glass", "Orchard", "Winter", "Lantern", "Salt", "Paper", "Northern", "Hidden",
              "Copper", "Garden", "Tide", "Ember", "Quiet", "Harbour"]
GENRES = ["mystery", "history", "science fiction", "memoir", "poetry", "travel", "fantasy", "biography"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def _schema(properties: dict, **extra) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False,
            **extra}


def person(rng: random.Random) -> tuple[str, dict, dict]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    gold = {"name": f"{first} {last}", "age": rng.randint(19, 88), "city": rng.choice(CITIES),
            "occupation": rng.choice(JOBS), "email": f"{first.lower()}.{last.lower()}{rng.randint(1, 99)}@example.org"}
    text = rng.choice([
        "{name}, aged {age}, is {a} {occupation} living in {city}. You can reach them at {email}.",
        "Meet {name} ({age}), who works as {a} {occupation} in {city}; email: {email}.",
        "Contact card: {city}-based {occupation} {name}, aged {age}. Write to {email} for details.",
        "After years abroad, {name} settled in {city} and now works as {a} {occupation}. {name} is {age} and "
        "answers mail at {email}.",
    ]).format(a="an" if gold["occupation"][0] in "aeiou" else "a", **gold)
    schema = _schema({
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string"},
        "occupation": {"type": "string"},
        "email": {"type": "string", "format": "email"},
    })
    return text, schema, gold


def order(rng: random.Random) -> tuple[str, dict, dict]:
    currency = rng.choice(list(CURRENCIES))
    gold = {"order_id": f"{''.join(rng.choices('ABCDEFGHJKLMNPQRSTUVWXYZ', k=3))}-{rng.randint(1000, 9999)}",
            "product": rng.choice(PRODUCTS), "quantity": rng.randint(1, 12),
            "unit_price": round(rng.uniform(3, 400), 2), "currency": currency, "express": rng.random() < 0.5}
    shipping = "express shipping" if gold["express"] else "standard shipping"
    price = f"{CURRENCIES[currency]}{gold['unit_price']:.2f}"
    text = rng.choice([
        "Order {order_id}: {quantity} x {product} at {price} each, sent with {shipping}.",
        "Hi, I'd like to confirm order {order_id}. It is for {quantity} {product}(s), priced {price} per unit "
        "({currency}). Please use {shipping}.",
        "Invoice line for {order_id} - item: {product}; qty {quantity}; unit price {price}; {shipping}.",
    ]).format(price=price, shipping=shipping, **gold)
    schema = _schema({
        "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "product": {"type": "string"},
        "quantity": {"type": "integer", "minimum": 1},
        "unit_price": {"type": "number", "exclusiveMinimum": 0},
        "currency": {"type": "string", "enum": list(CURRENCIES)},
        "express": {"type": "boolean"},
    })
    return text, schema, gold


def event(rng: random.Random) -> tuple[str, dict, dict]:
    month, day, year = rng.randint(1, 12), rng.randint(1, 28), rng.choice([2024, 2025, 2026])
    gold = {"title": rng.choice(EVENTS), "date": f"{year:04d}-{month:02d}-{day:02d}", "city": rng.choice(CITIES),
            "capacity": rng.choice([20, 25, 30, 40, 50, 60, 80, 100, 120, 150, 200, 250]),
            "online": rng.random() < 0.3}
    where = f"streamed online from {gold['city']}" if gold["online"] else f"held in person in {gold['city']}"
    text = rng.choice([
        "The {title} takes place on {month_name} {day}, {year}, {where}. Seats are limited to {capacity}.",
        "Save the date: {day} {month_name} {year}. {title}, {where}, room for {capacity} people.",
        "{title} ({where}) - {month_name} {day} {year}. Registration closes once {capacity} people sign up.",
    ]).format(month_name=MONTHS[month - 1], day=day, year=year, where=where, **gold)
    schema = _schema({
        "title": {"type": "string"},
        "date": {"type": "string", "format": "date"},
        "city": {"type": "string"},
        "capacity": {"type": "integer", "minimum": 1},
        "online": {"type": "boolean"},
    })
    return text, schema, gold


def book(rng: random.Random) -> tuple[str, dict, dict]:
    words = rng.sample(BOOK_WORDS, 2)
    gold = {"title": f"The {words[0]} {words[1]}", "author": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
            "year": rng.randint(1950, 2024), "pages": rng.randint(120, 720), "genres": sorted(rng.sample(GENRES, 2))}
    text = rng.choice([
        "{author}'s \"{title}\" ({year}) runs to {pages} pages and mixes {g0} with {g1}.",
        "Published in {year}, \"{title}\" by {author} is a {pages}-page book shelved under {g0} and {g1}.",
        "Library note: \"{title}\", {author}, {year}. {pages} pp. Genres: {g0}, {g1}.",
    ]).format(g0=gold["genres"][0], g1=gold["genres"][1], **gold)
    schema = _schema({
        "title": {"type": "string"},
        "author": {"type": "string"},
        "year": {"type": "integer", "minimum": 1450, "maximum": 2100},
        "pages": {"type": "integer", "minimum": 1},
        "genres": {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": True},
    })
    return text, schema, gold


DOMAINS: dict[str, Callable[[random.Random], tuple[str, dict, dict]]] = {
    "person": person, "order": order, "event": event, "book": book,
}


def question(text: str, schema_json: str) -> str:
    return (
        "Extract the information in the text below as one JSON object that validates against this JSON Schema.\n\n"
        f"Schema:\n{schema_json}\n\nText:\n{text}\n\nReply with the JSON object only, in a ```json code block."
    )


def build_rows(n: int, seed: int = 0) -> list[dict]:
    """n rows with distinct texts and distinct gold objects, domains in turn."""
    rng, rows, seen = random.Random(seed), [], set()
    names = list(DOMAINS)
    while len(rows) < n:
        domain = names[len(rows) % len(names)]
        text, schema, gold = DOMAINS[domain](rng)
        gold_json = json.dumps(gold, ensure_ascii=False)
        if text in seen or gold_json in seen:
            continue
        seen.update((text, gold_json))
        schema_json = json.dumps(schema)
        rows.append({"id": f"{domain}-{len(rows):04d}", "domain": domain, "question": question(text, schema_json),
                     "text": text, "schema": schema_json, "gold": gold_json})
    return rows


def build_splits(n_train: int = 300, n_eval: int = 60, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Disjoint by construction: one pool of distinct rows, cut in two."""
    rows = build_rows(n_train + n_eval, seed)
    train, held_out = rows[:n_train], rows[n_train:]
    for i, r in enumerate(held_out):
        r["id"] = f"eval-{r['domain']}-{i:04d}"
    return train, held_out


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("recipes/data"))
    parser.add_argument("--train", type=int, default=300)
    parser.add_argument("--eval", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train, held_out = build_splits(args.train, args.eval, args.seed)
    write_jsonl(train, args.out / "json_train.jsonl")
    write_jsonl(held_out, args.out / "json_eval.jsonl")
    print(f"wrote {len(train)} train and {len(held_out)} eval rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
