"""docs/errors.md against the code: every refusal the tests make is a row, with its exact Status and message.

Each test module that refuses something through the Python API exports
``REFUSALS``: the case's name (the table's first column) to a call that raises
it. The table cannot drift from the code: a row whose Status or message differs
from what the call raises fails, and so does a refusal without a row or a row
without a refusal.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import test_abi
import test_executor_refusals
import test_faults
import test_generate
import test_primitives

from sf_trt.abi import StatusError

ERRORS_MD = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
SOURCES = (test_executor_refusals, test_abi, test_primitives, test_generate, test_faults)


def refusals_the_tests_make() -> dict:
    out: dict = {}
    for module in SOURCES:
        for case, call in module.REFUSALS.items():
            assert case not in out, f"{module.__name__}: the refusal {case!r} is named twice"
            out[case] = call
    return out


def documented_refusals() -> dict[str, tuple[str, str]]:
    """The rows of the Python API section of docs/errors.md: case -> (Status name, message)."""
    section = ERRORS_MD.read_text().split("## Python API", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        m = re.fullmatch(r"\| (.+?) \| (.+?) \| `(\w+)` \| `(.*)` \|", line)
        if m:
            case, _sent, status, message = m.groups()
            assert case not in rows, f"docs/errors.md lists {case!r} twice"
            rows[case] = (status, message.replace("\\|", "|"))
    return rows


def test_every_refusal_the_tests_make_is_a_row_and_every_row_is_made():
    tested, documented = set(refusals_the_tests_make()), set(documented_refusals())
    assert not tested - documented, f"refusals missing from docs/errors.md: {sorted(tested - documented)}"
    assert not documented - tested, f"docs/errors.md rows no test makes: {sorted(documented - tested)}"


@pytest.mark.parametrize("case", sorted(documented_refusals()))
def test_each_row_has_the_status_and_message_the_refusal_has(case):
    status, message = documented_refusals()[case]
    with pytest.raises(StatusError) as err:
        refusals_the_tests_make()[case]()
    assert (err.value.status.name, str(err.value)) == (status, message)
