"""Which dataset names mean a directory on disk or a SQL database: one rule for the SDK, the API and
the engine.

The API refuses local directories when the service does not read them (RELAY_LOCAL_DATASETS=false),
and the engine reads a local directory instead of asking the Hub; both ask this one predicate, so
nothing the API lets through as a Hub name is read from a worker's disk (`"."` once was).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

# A Hub dataset repo id, by the Hub's rules (huggingface_hub's validate_repo_id, in ASCII): `name` or
# `owner/name`, each part 1 to 96 letters, digits, `_`, `-` and `.`, starting and ending with a letter,
# digit or `_`; no `--` or `..`, and not ending in `.git`. Written so that the API's OpenAPI document
# can state it as the JSON Schema pattern it enforces.
_HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
HUB_REPO_ID_PATTERN = rf"(?!.*(?:--|\.\.))(?!.*\.git$){_HUB_PART}(?:/{_HUB_PART})?"
# The names that mean a local directory, as a pattern: an absolute path, `~...`, `./...`, `../...`,
# `.`, `..`, or a file: URL of this host (local_dataset_path).
LOCAL_NAME_PATTERN = r"(?:/|~|\./|\.\./|file:(?:///|//localhost/|/[^/\x00-\x1f\x7f]))[^\x00-\x1f\x7f]*|\.\.?"
# A SQLAlchemy URL of a SQL database an RT-J model reads (sqlite:///shop.db, postgresql://host/db,
# postgresql+psycopg://..., mysql+pymysql://...): the backend, an optional driver, then `://`. A Hub
# repo id has no `:` and a local name starts with `/`, `~`, `.` or `file:`, so none is taken for another.
DATABASE_BACKENDS: tuple[str, ...] = ("sqlite", "postgresql", "mysql", "mariadb")
DATABASE_URL_PATTERN = rf"(?:{'|'.join(DATABASE_BACKENDS)})(?:\+[A-Za-z0-9_]+)?://[^\x00-\x1f\x7f]*"
# The names read from the disk of the machine that trains (names_local_directory), as a pattern:
# a local directory, a file: URL, or a SQLite file's URL. They have no revisions, and the JSON
# Schema says so (SFTConfig's rules).
LOCAL_DISK_NAME_PATTERN = (
    rf"^(?:{LOCAL_NAME_PATTERN}|file:[^\x00-\x1f\x7f]*|sqlite(?:\+[A-Za-z0-9_]+)?://[^\x00-\x1f\x7f]*)$"
)
# A RelBench dataset (and task) read through the relbench package: relbench:rel-f1,
# relbench:rel-f1/driver-dnf, or relbench:<a local RelBench directory>[/<task>] (rt-j models).
RELBENCH_PREFIX = "relbench:"
RELBENCH_NAME_PATTERN = rf"{RELBENCH_PREFIX}[^\x00-\x1f\x7f]+"
# The names of LeRobot datasets: a Hub repo id or a local directory.
LEROBOT_DATASET_NAME_PATTERN = rf"^(?:{HUB_REPO_ID_PATTERN}|{LOCAL_NAME_PATTERN})$"
# Every name a dataset may have: a Hub repo id, a local directory, a database URL or a RelBench name.
# Nothing else is read as one (`lerobot/../../etc`, `a/./b`, `..\\etc` and ` /etc` are none of
# them): SFTConfig refuses a name that does not match, whatever the server's settings.
DATASET_NAME_PATTERN = (
    rf"^(?:{HUB_REPO_ID_PATTERN}|{LOCAL_NAME_PATTERN}|{DATABASE_URL_PATTERN}|{RELBENCH_NAME_PATTERN})$"
)
# A name that starts with a URL's scheme (`postgresql:`, `https:`): a Hub repo id has no `:`, and a
# local name starts with `/`, `~` or `.` (or is a file: URL).
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
MALFORMED_URL_RULE = (
    "a name with a URL's scheme must be a database URL that parses, such as "
    "postgresql://user:password@host:5432/db (brackets around an IPv6 host closed, the port a "
    "number from 1 to 65535, no spaces in the host, a password's special characters percent-encoded), "
    "mysql+pymysql://... or sqlite:////absolute/path/shop.db, or a file:// URL; this one does not "
    "parse, and is not shown back, since it may hold a password"
)


def is_dataset_name(name: str) -> bool:
    """Whether `name` has the form of some dataset name (DATASET_NAME_PATTERN)."""
    return re.fullmatch(DATASET_NAME_PATTERN, name) is not None


def is_malformed_url(name: str) -> bool:
    """Whether `name` starts with a URL's scheme but is no URL a dataset may be: not a database URL
    that parses (`postgresql://ana:pw@[::1/shop`, `postgres://...`, a port that is no number), not
    a file: URL, not a RelBench name. Such a name may hold a password where no parser can find it,
    so it is refused without being shown (MALFORMED_URL_RULE), and never stored."""
    if _URL_SCHEME.match(name) is None or name.startswith("file:") or is_relbench_name(name):
        return False
    return not is_database_url(name)


def is_relbench_name(name: str) -> bool:
    """Whether `name` names a RelBench dataset (relbench:rel-f1, relbench:rel-f1/driver-dnf)."""
    return re.fullmatch(RELBENCH_NAME_PATTERN, name) is not None


def is_relational_source(name: str) -> bool:
    """Whether `name` is data only an RT-J model reads: a database URL or a RelBench name."""
    return is_database_url(name) or is_relbench_name(name)


def is_hub_repo_id(name: str) -> bool:
    """Whether `name` is a well-formed Hub dataset repo id (lerobot/pusht_image)."""
    return re.fullmatch(HUB_REPO_ID_PATTERN, name) is not None


def local_dataset_path(name_or_path: str) -> Path | None:
    """The directory a dataset name means, if it names one on this machine (it may not exist): an
    absolute path, ``~/...``, ``.``, ``..``, ``./...``, ``../...`` or a ``file://`` URL. Anything else
    (``lerobot/pusht_image``) is a Hub repo id, and None."""
    if name_or_path.startswith("file:"):
        url = urlparse(name_or_path)
        if url.netloc not in ("", "localhost"):
            return None
        return Path(unquote(url.path))
    if (
        os.path.isabs(name_or_path)
        or name_or_path in (".", "..")
        or name_or_path.startswith(("~", "./", "../"))
    ):
        try:
            return Path(name_or_path).expanduser().absolute()
        except RuntimeError:  # `~someone` with no such user (or no home directory): the name as it is
            return Path(name_or_path).absolute()
    return None


def names_local_directory(name_or_path: str) -> bool:
    """Whether a dataset name would be read from the disk of the machine that trains on it: a local
    directory, or a SQLite file's URL (sqlite:///shop.db), which a server that reads no local
    datasets must refuse as it refuses a directory."""
    return (
        name_or_path.startswith("file:")
        or local_dataset_path(name_or_path) is not None
        or names_sqlite_file(name_or_path)
    )


def names_sqlite_file(name: str) -> bool:
    """Whether a dataset name is the URL of a SQLite file (read from the local disk)."""
    if not is_database_url(name):
        return False
    url = _parsed(name)
    return url is not None and url.get_backend_name() == "sqlite"


def is_database_url(name: str) -> bool:
    """Whether `name` is a SQLAlchemy URL of a SQL database (sqlite:///shop.db, sqlite:////abs/shop.db,
    postgresql://host/db, postgresql+psycopg://..., mysql+pymysql://...). Parsed, never connected to."""
    if re.fullmatch(DATABASE_URL_PATTERN, name) is None:
        return False
    url = _parsed(name)
    return url is not None and url.get_backend_name() in DATABASE_BACKENDS


def redacted_url(url: str) -> str:
    """A database URL with its password hidden (``postgresql://relay:***@host/db``): what may be shown,
    logged or stored. A name that does not parse as a URL is shown as ``<unparsable database URL>``,
    since the password's place in it is unknown."""
    parsed = _parsed(url)
    if parsed is None:
        return "<unparsable database URL>"
    if parsed.host and "@" in parsed.host:
        # An unescaped `@` in the password leaves the password's tail in the host (u:p@ss@host).
        parsed = parsed.set(host=parsed.host.rsplit("@", 1)[-1], password="***")
    hidden = {key: "***" for key in parsed.query if key.lower() in _PASSWORD_PARAMETERS}
    if hidden:  # libpq and the MySQL drivers also take a password as a query parameter
        parsed = parsed.update_query_dict(hidden)
    return parsed.render_as_string(hide_password=True)


_PASSWORD_PARAMETERS = frozenset({"password", "passwd", "pwd"})
# In any text: a URL's `user:password@` (up to the text's last `@`, as a password may hold one) and a
# `password=` query parameter.
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)\S*@")
_PASSWORD_PARAMETER = re.compile(
    rf"([?&](?:{'|'.join(sorted(_PASSWORD_PARAMETERS))})=)[^&\s]*", re.IGNORECASE
)


def hide_url_passwords(text: str) -> str:
    """`text` with the password of any URL in it hidden, parsable or not (a message quoting a value
    that broke a rule must not show the password it holds)."""
    return _PASSWORD_PARAMETER.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def _parsed(url: str) -> URL | None:
    # SQLAlchemy is imported when a name looks like a URL, not when the SDK is.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return None
    # What SQLAlchemy parses but no server has: a port out of range, a host with spaces or brackets.
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        return None
    if parsed.host is not None and any(ch.isspace() or ch in "[]" for ch in parsed.host):
        return None
    return parsed
