"""The fixed prompts of the benchmark suite, of three kinds, because acceptance (and so speed-up) depends on what is
generated: ``open`` (nothing in the prompt to copy), ``grounded`` (the answer largely repeats the prompt: the regime
of prompt-lookup drafting) and ``summary`` (in between).

Each is one user message, sent through the target's chat template.  The texts are fixed so that runs compare over
time: change them only together with a note in bench/RESULTS.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple


@dataclass(frozen=True)
class Prompt:
    name: str
    kind: str  # "open", "grounded" or "summary"
    description: str
    user: str

    def messages(self) -> List[Dict[str, str]]:
        return [{"role": "user", "content": self.user}]


_EDIT_CODE = '''\
def summarize_orders(orders, min_total=0.0):
    """Group orders by customer and return per-customer statistics."""
    if not orders:
        return {"orders_seen": 0, "orders_skipped": 0, "customers": []}
    x = 0
    totals = {}
    largest = {}
    skipped = []
    for order in orders:
        customer = order.get("customer")
        if customer is None:
            skipped.append(order)
            continue
        amount = float(order.get("amount", 0.0))
        if amount < 0:
            skipped.append(order)
            continue
        x += 1
        totals[customer] = totals.get(customer, 0.0) + amount
        if amount > largest.get(customer, 0.0):
            largest[customer] = amount
    report = []
    for customer in sorted(totals):
        total = totals[customer]
        if total < min_total:
            continue
        report.append(
            {
                "customer": customer,
                "total": round(total, 2),
                "largest": round(largest[customer], 2),
                "share": round(total / max(sum(totals.values()), 1e-9), 4),
            }
        )
    report.sort(key=lambda row: row["total"], reverse=True)
    return {
        "orders_seen": x,
        "orders_skipped": len(skipped),
        "customers": report,
    }
'''

_SUMMARY_TEXT = (
    "The town of Marlow Ridge built its first public library in 1911 with money raised by a "
    "committee of mill workers, who each gave a day's wages every spring for six years. The "
    "original building had a single reading room, a coal stove and fewer than two thousand "
    "books, most of them donated by families who had moved west. During the flood of 1937 the "
    "river rose above the library's front steps, and volunteers carried the collection to the "
    "upper floor of the schoolhouse in a night-long chain of hand-to-hand passing; only the "
    "newspaper archive was lost. After the war the library added a children's wing, and in "
    "the 1960s it became one of the first in the county to lend records and film projectors. "
    "A fire in 1984 destroyed the roof, but the town voted to rebuild on the same site rather "
    "than move to the new shopping district, arguing that the library belonged near the river "
    "where it had started. Today the building houses forty thousand items, a computer room "
    "and a small museum about the mill, and it is still partly funded by an annual spring "
    "collection that residents call Wages Day, in memory of the workers who founded it."
)

_DOCUMENT = """\
KESTREL K2 COFFEE GRINDER - CARE AND WARRANTY NOTES

1. Cleaning. Unplug the grinder before cleaning. Empty the bean hopper and run the motor for
five seconds to clear remaining grounds. Remove the upper burr by turning it counter-clockwise
until the arrow lines up with the unlock symbol. Brush both burrs with the supplied brush; do
not wash the burrs in water and never put them in a dishwasher. The hopper and the grounds bin
may be washed in warm soapy water and must be fully dry before reassembly. Clean the burrs
every two weeks with daily use, or after about 2 kg of beans.

2. Grind settings. The dial has 40 steps. Steps 1-8 are for espresso, 9-18 for pour-over and
drip, 19-30 for French press, and 31-40 for cold brew. Change the setting only while the motor
is running, to avoid jamming the burrs on trapped beans.

3. Overheating. The motor stops automatically after 90 seconds of continuous grinding. Wait
15 minutes before using the grinder again. The red light on the base blinks while the motor
is cooling down.

4. Warranty. The motor is covered for 3 years and all other parts for 1 year from the date of
purchase. The warranty does not cover burrs damaged by stones or foreign objects, damage from
washing the burrs in water, or units used in commercial settings. To make a claim, email a
photo of the receipt and the serial number (printed under the base) to the support address.
Replacement burr sets can be ordered separately and are not covered by the warranty.
"""

PROMPTS: Tuple[Prompt, ...] = (
    Prompt(
        "code-write", "open", "code writing",
        "Write a Python class `LRUCache` with a fixed capacity, `get(key)` and `put(key, value)` "
        "methods that run in O(1), and a short docstring for each method. Then show a small "
        "usage example.",
    ),
    Prompt(
        "code-edit", "grounded", "code editing (rename a variable in 40 given lines)",
        "Rename the variable `x` to `count` in this function. Change nothing else and reply "
        "with the complete updated function in one Python code block.\n\n```python\n"
        + _EDIT_CODE + "```",
    ),
    Prompt(
        "chat", "open", "open chat",
        "I just moved to a new city and I work from home. What are some practical ways to meet "
        "people and build a social life here? Give me a few concrete ideas.",
    ),
    Prompt(
        "summary", "summary", "summarising a given ~200-word paragraph",
        "Summarise the following text in three or four sentences.\n\n" + _SUMMARY_TEXT,
    ),
    Prompt(
        "doc-qa", "grounded", "answering from a given document",
        "Use only the document below to answer. Quote the relevant sentences, then answer: how "
        "do I clean the burrs, how often, and what does the warranty not cover?\n\n"
        + _DOCUMENT,
    ),
)


def by_name(names) -> List[Prompt]:
    """The prompts called ``names``, in that order (ValueError on an unknown name)."""
    table = {p.name: p for p in PROMPTS}
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown prompt(s) {', '.join(unknown)}; known: {', '.join(table)}")
    return [table[n] for n in names]
